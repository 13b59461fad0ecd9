// SsdTier::Impl: the SSD tier's state, shared by the files of
// cachestore/src/ssd/ that implement it (one concept each).
//
// Locking: `mu` guards the in-memory index (records), the free space, the
// pending-write set and counters. Disk I/O, fdatasync and RocksDB writes run
// outside it. `free_mu` guards the file-system space that batches have been
// admitted for; nothing else is locked under it. A record being read is
// pinned (readers > 0); a retired record's extent is freed only once it has
// no readers and its index entry is durably deleted, so an extent is never
// reused while the old index entry or a read can still see it.
#pragma once

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include "eviction/ghost_table.h"
#include "eviction/hold_time_model.h"
#include "ssd/eviction_queues.h"
#include "ssd/ssd_index.h"
#include "ssd/ssd_space.h"
#include "ssd/ssd_tier.h"
#include "ssd/uring_io.h"
#include "util/mutex.h"

namespace strata {

// Wall clock, so commit times and TTLs mean the same after a reboot.
class WallClock final : public Clock {
 public:
  Nanos Now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

inline const WallClock kWallClock;

inline bool IsAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kSsdBlockBytes == 0;
}

inline std::string Errno(int err) { return std::strerror(err); }

struct Record {
  SsdEntryMeta meta;
  uint32_t readers = 0;
  bool retired = false;     // out of the in-memory index
  bool index_gone = false;  // its index entry is durably deleted
  bool freed = false;
  Nanos persisted_access = 0;
  // The deadline policy's view (in memory only; see SsdTierOptions).
  uint64_t tick = 0;   // model time of the last use, write or renewal
  uint8_t uses = 0;    // earlier uses known to this tier, saturating
  bool above = false;  // the block is (presumed) in DRAM: this copy is a shadow
  bool open = false;   // a holding interval was started for the model
  // Breaks ties in the eviction rank: the later a record was last written,
  // used or renewed, the later it goes. Callers touch a chain leaf first and
  // root last, so with equal times an ancestor outlives its descendants
  // (which no match reaches without it).
  uint64_t order = 0;
  // While in the in-memory index: its place in the eviction queues, whose
  // `key` is the record's key there (owned by `records`; null while out of
  // it). See Impl::IndexRecord.
  EvictionQueues<Record>::Position queued;
  uint8_t queue = 0;
};
using RecordPtr = std::shared_ptr<Record>;

// Records by expiry, for TTL maintenance without a scan.
struct ExpiryLess {
  bool operator()(const Record* a, const Record* b) const {
    return a->meta.expiry != b->meta.expiry ? a->meta.expiry < b->meta.expiry : a < b;
  }
};

struct SsdTier::Impl {
  struct Metrics {
    Counter* bytes_written;
    Counter* bytes_read;
    Counter* write_failures;
    Counter* checksum_failures;
    Counter* evict_watermark;
    Counter* evict_ttl;
    Counter* evict_checksum;
    Counter* evict_explicit;
    Counter* evict_io_error;
    Gauge* used_bytes;
    Gauge* capacity_bytes;
    Gauge* entries;
    Gauge* writes_enabled;
  };

  SsdTierOptions opts;
  const Clock* clock = nullptr;
  std::unique_ptr<MetricsRegistry> owned_metrics;
  Metrics m{};
  std::unique_ptr<SsdIndex> index;  // under index_mu once open
  std::string index_path;
  int lock_fd = -1;  // holds flock(<dir>/LOCK): one process per directory
  std::vector<int> fds;
  std::vector<std::string> paths;

  Mutex rings_mu;
  std::condition_variable rings_cv;
  std::vector<std::unique_ptr<UringRing>> rings ABSL_GUARDED_BY(rings_mu);
  std::vector<UringRing*> idle_rings ABSL_GUARDED_BY(rings_mu);

  mutable Mutex mu;
  // Encoded key -> record. Ordered: a namespace's entries under one model
  // are a range in chain key order, which is how admin pages are read.
  std::map<std::string, RecordPtr, std::less<>> records ABSL_GUARDED_BY(mu);
  // Every record in `records`, ranked for eviction (see EvictionQueues),
  // and by expiry; the bytes of shadow copies among them. Under `mu`.
  static constexpr size_t kShadowQueue = HoldTimeModel::kClasses;
  EvictionQueues<Record> queues ABSL_GUARDED_BY(mu){kShadowQueue + 1};  // LRU: queue 0 only
  absl::btree_set<Record*, ExpiryLess> by_expiry ABSL_GUARDED_BY(mu);
  uint64_t shadow_bytes ABSL_GUARDED_BY(mu) = 0;
  // Every model a namespace stored (never shrinks: a handful, 16 bytes
  // each), so admin lookups by chain key alone need no scan. Under `mu`.
  std::map<std::string, std::set<ModelId>, std::less<>> models ABSL_GUARDED_BY(mu);
  // Uses and renewals recorded by Touch, applied under `mu` before the
  // eviction order is read: Touch runs on the DRAM tier's hot paths (under
  // its locks) and must not wait for `mu`, which an SSD batch's bookkeeping
  // or an eviction holds.
  struct QueuedTouch {
    std::string key;
    Nanos at = 0;
    SsdTouch what = SsdTouch::kUse;
    uint32_t earlier_uses = 0;
    uint64_t order = 0;  // taken when touched, not when applied
  };
  Mutex touch_mu;
  std::vector<QueuedTouch> touches ABSL_GUARDED_BY(touch_mu);
  // Serializes index writes with the in-memory changes they stand for, so
  // the index ends in the order memory did: a put after a retire of the
  // same key never loses to the retire's delete, and a stale access-time
  // put never brings back an entry deleted (or rewritten) meanwhile. Taken
  // before `mu`.
  Mutex index_mu;
  std::unordered_set<std::string> pending ABSL_GUARDED_BY(mu);  // keys being written
  // The "deadline" policy (absent for "lru"): holding times per class of
  // earlier uses, and fingerprints of evicted keys so a rewrite after an
  // eviction counts as a reuse the tier missed. Both under `mu`.
  std::optional<HoldTimeModel> model ABSL_GUARDED_BY(mu);
  GhostTable ghosts ABSL_GUARDED_BY(mu);
  // Record::order: taken by each touch when it is made, and by each write
  // and read, so the order does not depend on when queued touches apply.
  std::atomic<uint64_t> next_order{0};
  uint64_t NextOrder() { return next_order.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::vector<SsdSpace> space ABSL_GUARDED_BY(mu);  // per file
  uint32_t next_file ABSL_GUARDED_BY(mu) = 0;
  bool writes_enabled ABSL_GUARDED_BY(mu) = true;
  Nanos writes_retry_at ABSL_GUARDED_BY(mu) = 0;
  // RocksDB is not written again after a failed write (its error state is
  // sticky) until RecoverIndex reopens it, write_retry_interval later.
  // Written under index_mu.
  std::atomic<bool> index_failed{false};
  Nanos index_retry_at ABSL_GUARDED_BY(index_mu) = 0;
  // Retired records whose index delete failed: out of memory, their extents
  // held, deleted again when the index recovers (else a restart would bring
  // them back). Also records whose index put failed (it may have landed),
  // and the expired records such a put may have overwritten. Under `mu`.
  std::vector<std::pair<std::string, RecordPtr>> undeleted ABSL_GUARDED_BY(mu);
  // Keys of eviction victims whose index delete has not finished (how many
  // evictions of each), and those of them erased meanwhile: a victim whose
  // delete then fails is not served again if it was erased. Under `mu`.
  std::unordered_map<std::string, uint32_t> evicting ABSL_GUARDED_BY(mu);
  std::unordered_set<std::string> erased_while_evicting ABSL_GUARDED_BY(mu);
  // File-system bytes admitted by the free-space check (WriteBatch) that
  // their batches have not written yet: statvfs shows them only once
  // written, so without this two batches could each take the same room.
  Mutex free_mu;
  uint64_t reserved_bytes ABSL_GUARDED_BY(free_mu) = 0;
  uint64_t bytes_written ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes_read ABSL_GUARDED_BY(mu) = 0;
  uint64_t write_failures ABSL_GUARDED_BY(mu) = 0;
  uint64_t checksum_failures ABSL_GUARDED_BY(mu) = 0;
  uint64_t evictions ABSL_GUARDED_BY(mu) = 0;
  uint64_t ttl_expired ABSL_GUARDED_BY(mu) = 0;

  ~Impl() {
    for (int fd : fds) ::close(fd);
    if (lock_fd >= 0) ::close(lock_fd);  // last: the files are closed
  }

  // ---- rings ----------------------------------------------------------------

  UringRing* AcquireRing();
  void ReleaseRing(UringRing* r);

  // ---- space (mu held) ------------------------------------------------------

  static constexpr size_t kMaxQueuedTouches = 1 << 16;

  void QueueTouch(QueuedTouch t);

  void ApplyTouches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void ApplyTouch(const QueuedTouch& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void ChangeForTouch(Record& r, const QueuedTouch& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A new record under the deadline policy: a shadow of the DRAM entry it
  // was written from. A key evicted earlier and written again is a reuse
  // this tier did not wait for.
  void PlaceNew(const std::string& key, Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Eviction rank: smaller goes first. LRU: the last access. Deadline: the
  // end of the entry's holding time; a shadow of a DRAM entry is kept as
  // long as the most valuable class would be, twice over, after which it is
  // presumed stale (its DRAM copy went without a renewal). As a queue and a
  // time in it; RankOffsets gives each queue's share of the rank.
  std::pair<size_t, uint64_t> QueueOf(const Record& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<uint64_t> RankOffsets() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Enqueue(Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Dequeue(Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `r` joined `records` under `key` (the map's own copy).
  void IndexRecord(const std::string& key, Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `r` is leaving `records`.
  void UnindexRecord(Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Applies a change to what ranks `r` (its times, order, uses or role).
  template <typename Change>
  void Reorder(Record& r, Change change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (r.queued.key == nullptr) {
      change();
      return;
    }
    Dequeue(r);
    change();
    Enqueue(r);
  }

  // The deadline model's budget: the tier swings between its watermarks,
  // and shadows of DRAM entries take their share outside the model.
  double ModelCapacity(uint64_t shadow_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void RememberEvicted(const std::string& key, const Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A ghost remembers the model time, the uses, and whether an interval
  // was open when the key went.
  struct GhostState {
    uint64_t tick;
    uint8_t uses;
    bool open;
  };
  static constexpr int kTickBits = 55;
  static uint64_t Pack(const GhostState& g);
  static GhostState Unpack(uint64_t v);
  static constexpr size_t kGhostFactor = 8;
  static constexpr size_t kMinGhosts = 65536;

  uint64_t Used() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void PublishGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  std::optional<std::pair<uint32_t, uint64_t>> AllocateRun(uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void MaybeFree(Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Takes a record out of the in-memory index; its extent waits for the
  // durable index delete (FinishRetire).
  // Whether an index delete of `key` is waiting for the index to recover.
  bool Undeleted(const std::string& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  RecordPtr Retire(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // index_mu held.
  void MarkIndexFailed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(index_mu);

  // Deletes retired records from the index durably, then frees what no
  // reader holds. If the delete fails, the error is returned and the index
  // is failed until RecoverIndex; eviction victims (`restore_on_failure`)
  // go back in memory (the index still has them, their bytes are intact),
  // anything deleted on purpose stays out of memory, its extent held and
  // its delete retried when the index recovers.
  Status FinishRetire(const std::vector<std::string>& keys, const std::vector<RecordPtr>& recs,
                      bool restore_on_failure = false);

  // Victims just taken out of memory by an eviction (FinishRetire with
  // restore_on_failure follows).
  void MarkEvicting(const std::vector<std::string>& keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const std::string& k : keys) ++evicting[k];
  }

  // A failed index is reopened once write_retry_interval has passed (at
  // once with `force`), then the deletes it missed are retried. True if the
  // index is usable and none is missing.
  bool RecoverIndex(bool force = false);

  // Picks victims: expired entries (with `ttl`), then the lowest ranked
  // ones while above the low watermark or short of `incoming` bytes. Unread
  // entries only. Walks the eviction queues from their heads, so the cost
  // is the victims', not the tier's size.
  void CollectVictims(Nanos now, uint64_t incoming, bool ttl, std::vector<std::string>* keys,
                      std::vector<RecordPtr>* recs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Retires ranked victims (remembered as evicted, counted as watermark
  // evictions); their records go to `recs` for FinishRetire.
  void EvictKeys(std::span<const std::string> keys, std::vector<RecordPtr>* recs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  uint64_t Capacity() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Enough bytes free, but no run of `bytes` in any file (mixed sizes leave
  // holes): evicts in rank order until a run forms, as a copy of the free
  // space shows, then frees them. Evicts nothing if no run would form. True
  // when the run should be there.
  bool MakeRun(uint64_t bytes);

  uint64_t MakeRoom(uint64_t incoming, bool ttl);

  void DisableWrites(const std::string& why);

  bool WritesAllowed(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Drop(const std::string& key, const RecordPtr& expected, Counter* reason);

  // Splits one entry's I/O into ops: one direct op, or bounce-sized chunks.
  void PlanOps(bool write, const SsdEntryMeta& meta, std::byte* direct, std::vector<IoOp>* ops,
               std::vector<std::pair<size_t, uint64_t>>* owner, size_t entry) const;

  // Bytes of a data file's [offset, offset + bytes) the file system has not
  // allocated yet (holes: the files are sparse), which writing them
  // consumes. Counts what it cannot tell as unallocated.
  uint64_t UnallocatedBytes(uint32_t file, uint64_t offset, uint64_t bytes) const;

  // A batch's share of reserved_bytes: given back once its writes are done
  // (when statvfs shows what they consumed), or when the batch ends.
  class Reservation {
   public:
    explicit Reservation(Impl& s) : s_(s) {}
    ~Reservation() { Release(); }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;

    void AddLocked(uint64_t bytes) {  // free_mu held
      s_.free_mu.AssertHeld();
      s_.reserved_bytes += bytes;
      bytes_ += bytes;
    }
    void Release() {
      if (bytes_ == 0) return;
      MutexLock lock(s_.free_mu);
      s_.reserved_bytes -= bytes_;
      bytes_ = 0;
    }

   private:
    Impl& s_;
    uint64_t bytes_ = 0;
  };

  // Admits a batch that newly consumes `consumes` bytes if the file system
  // keeps min_free_bytes free after it and every batch admitted before it
  // that is still writing; reserves them in `r`. UNAVAILABLE if not, and
  // *full if the file system lacks the room even without those batches
  // (theirs is counted twice while they write, so a refusal for their
  // sake alone may be early: it fails the one batch, nothing more). An
  // unknown free space admits.
  Status ReserveFreeSpace(uint64_t consumes, Reservation* r, bool* full);

  Status SyncFiles(const std::vector<bool>& touched) const;

  // ---- opening (recovery.cc): SsdTier::Open's steps, before the tier is
  // shared (no locks) ----------------------------------------------------------

  void RegisterMetrics();
  Status LockDirectory();
  // The data files, sized `per_file` bytes each, and the rings over them.
  Status OpenDataFiles(uint64_t per_file) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  Status RebuildFromIndex() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void StartDeadlineModel() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // ---- the write path (write_path.cc): SsdTier::WriteBatch's steps ----------

  // One write batch between its steps.
  struct WriteRun {
    explicit WriteRun(std::span<const SsdWrite> w)
        : writes(w), out(w.size(), Status::Ok()), keys(w.size()), todo(w.size(), false) {}
    std::span<const SsdWrite> writes;
    Nanos now = 0;
    std::vector<Status> out;
    std::vector<std::string> keys;  // encoded, of the writes that were checked
    std::vector<bool> todo;         // to be written and indexed
    std::vector<SsdEntryMeta> metas;
    std::vector<bool> placed;  // an extent is allocated for it
    std::vector<IoOp> ops;
    std::vector<std::pair<size_t, uint64_t>> owner;  // op -> (write, offset in payload)
    std::vector<bool> touched;                       // data files written
  };

  // Checks each write and marks the new ones pending (todo); the I/O bytes
  // they need.
  uint64_t AdmitWrites(WriteRun& w, bool index_ok);
  void PlaceWrites(WriteRun& w);
  // Allocates a run for write `i`; without one, it goes to `no_run` for a
  // second try or, on the `last_try`, fails.
  void PlaceWrite(WriteRun& w, size_t i, bool last_try, std::vector<size_t>& no_run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // False when the file system lacks the room: the batch failed.
  bool ReserveWriteRoom(WriteRun& w, Reservation& reservation);
  static void ChecksumWrites(WriteRun& w);
  // Writes the data of every write to do in one pass over a ring.
  void WriteData(WriteRun& w);
  // Fails the writes whose I/O failed; the first I/O error, if any.
  std::string FailUnwritten(WriteRun& w) const;
  // Puts the index entries of the written ones (`durable`: their data is);
  // a failure fails them all and becomes `io_error` unless one is set.
  // Which writes' index entries may have landed though their put failed.
  std::vector<bool> IndexWrites(WriteRun& w, Status durable, std::string& io_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(index_mu);
  // The written ones join the in-memory index; the rest give back their
  // extents (`undeleted_puts`: once their index entries are deleted).
  void RecordWrites(const WriteRun& w, const std::vector<bool>& undeleted_puts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(index_mu, mu);

  // ---- the read path (read_path.cc): SsdTier::ReadBatch's steps -------------

  // One read batch between its steps.
  struct ReadRun {
    explicit ReadRun(std::span<const SsdRead> r)
        : reads(r), out(r.size(), Status::Ok()), keys(r.size()), recs(r.size()) {}
    std::span<const SsdRead> reads;
    Nanos now = 0;
    std::vector<Status> out;
    std::vector<std::string> keys;  // encoded
    std::vector<RecordPtr> recs;    // pinned (readers), when found
    std::vector<IoOp> ops;
    std::vector<std::pair<size_t, uint64_t>> owner;  // op -> (read, offset in payload)
    std::vector<bool> sum_ok;                        // read whole, and the checksum matched
    std::vector<bool> bad_io;                        // the device lost its bytes
  };

  // Finds and pins the record of each read.
  void PinReads(ReadRun& r);
  // Reads the pinned records in one pass over a ring, each checksummed as
  // its last op lands.
  void ReadData(ReadRun& r);
  // Fails the reads whose I/O failed.
  void FailBadReads(ReadRun& r) const;
  // Fails (and counts) the reads whose checksum did not match.
  void FailMismatches(ReadRun& r);
  // Lets go of the pins; what was served is touched (its access time to
  // persist when due), what is gone is to drop.
  void UnpinReads(const ReadRun& r, std::vector<std::pair<std::string, RecordPtr>>& access_puts,
                  std::vector<std::tuple<std::string, RecordPtr, Counter*>>& to_drop);
  // Writes access times to the index, unless another batch is writing it.
  void PersistAccessTimes(const std::vector<std::pair<std::string, RecordPtr>>& access_puts);
};

}  // namespace strata

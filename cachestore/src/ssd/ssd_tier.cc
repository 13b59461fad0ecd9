// SsdTier: see ssd_tier.h for the durability order.
//
// Locking: `mu` guards the in-memory index (records), the free space, the
// pending-write set and counters. Disk I/O, fdatasync and RocksDB writes run
// outside it. `free_mu` guards the file-system space that batches have been
// admitted for; nothing else is locked under it. A record being read is
// pinned (readers > 0); a retired record's extent is freed only once it has
// no readers and its index entry is durably deleted, so an extent is never
// reused while the old index entry or a read can still see it.
#include "ssd/ssd_tier.h"

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
#include "ssd/uring_io.h"

namespace strata {
namespace {

// Wall clock, so commit times and TTLs mean the same after a reboot.
class WallClock final : public Clock {
 public:
  Nanos Now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

const WallClock kWallClock;

bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kSsdBlockBytes == 0; }

std::string Errno(int err) { return std::strerror(err); }

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
  // it). See Impl::IndexLocked.
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

}  // namespace

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

  std::mutex rings_mu;
  std::condition_variable rings_cv;
  std::vector<std::unique_ptr<UringRing>> rings;
  std::vector<UringRing*> idle_rings;

  mutable std::mutex mu;
  // Encoded key -> record. Ordered: a namespace's entries under one model
  // are a range in chain key order, which is how admin pages are read.
  std::map<std::string, RecordPtr, std::less<>> records;
  // Every record in `records`, ranked for eviction (see EvictionQueues),
  // and by expiry; the bytes of shadow copies among them. Under `mu`.
  static constexpr size_t kShadowQueue = HoldTimeModel::kClasses;
  EvictionQueues<Record> queues{kShadowQueue + 1};  // LRU: queue 0 only
  absl::btree_set<Record*, ExpiryLess> by_expiry;
  uint64_t shadow_bytes = 0;
  // Every model a namespace stored (never shrinks: a handful, 16 bytes
  // each), so admin lookups by chain key alone need no scan. Under `mu`.
  std::map<std::string, std::set<ModelId>, std::less<>> models;
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
  std::mutex touch_mu;
  std::vector<QueuedTouch> touches;  // touch_mu
  // Serializes index writes with the in-memory changes they stand for, so
  // the index ends in the order memory did: a put after a retire of the
  // same key never loses to the retire's delete, and a stale access-time
  // put never brings back an entry deleted (or rewritten) meanwhile. Taken
  // before `mu`.
  std::mutex index_mu;
  std::unordered_set<std::string> pending;  // keys being written
  // The "deadline" policy (absent for "lru"): holding times per class of
  // earlier uses, and fingerprints of evicted keys so a rewrite after an
  // eviction counts as a reuse the tier missed. Both under `mu`.
  std::optional<HoldTimeModel> model;
  GhostTable ghosts;
  // Record::order: taken by each touch when it is made, and by each write
  // and read, so the order does not depend on when queued touches apply.
  std::atomic<uint64_t> next_order{0};
  uint64_t NextOrder() { return next_order.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::vector<SsdSpace> space;  // per file
  uint32_t next_file = 0;
  bool writes_enabled = true;
  Nanos writes_retry_at = 0;
  // RocksDB is not written again after a failed write (its error state is
  // sticky) until RecoverIndex reopens it, write_retry_interval later.
  // Written under index_mu.
  std::atomic<bool> index_failed{false};
  Nanos index_retry_at = 0;  // index_mu
  // Retired records whose index delete failed: out of memory, their extents
  // held, deleted again when the index recovers (else a restart would bring
  // them back). Also records whose index put failed (it may have landed),
  // and the expired records such a put may have overwritten. Under `mu`.
  std::vector<std::pair<std::string, RecordPtr>> undeleted;
  // Keys of eviction victims whose index delete has not finished (how many
  // evictions of each), and those of them erased meanwhile: a victim whose
  // delete then fails is not served again if it was erased. Under `mu`.
  std::unordered_map<std::string, uint32_t> evicting;
  std::unordered_set<std::string> erased_while_evicting;
  // File-system bytes admitted by the free-space check (WriteBatch) that
  // their batches have not written yet: statvfs shows them only once
  // written, so without this two batches could each take the same room.
  std::mutex free_mu;
  uint64_t reserved_bytes = 0;  // free_mu
  uint64_t bytes_written = 0, bytes_read = 0, write_failures = 0, checksum_failures = 0;
  uint64_t evictions = 0, ttl_expired = 0;

  ~Impl() {
    for (int fd : fds) ::close(fd);
    if (lock_fd >= 0) ::close(lock_fd);  // last: the files are closed
  }

  // ---- rings ----------------------------------------------------------------

  UringRing* AcquireRing() {
    std::unique_lock lock(rings_mu);
    rings_cv.wait(lock, [&] { return !idle_rings.empty(); });
    UringRing* r = idle_rings.back();
    idle_rings.pop_back();
    return r;
  }
  void ReleaseRing(UringRing* r) {
    if (r->broken()) {
      // A broken ring fails every batch it gets: replace it.
      auto fresh = UringRing::Create(fds, opts.queue_depth, opts.io_buffer_bytes);
      if (fresh.ok()) {
        spdlog::warn("ssd: an io_uring ring failed; replaced it");
        std::lock_guard lock(rings_mu);
        for (std::unique_ptr<UringRing>& owned : rings) {
          if (owned.get() != r) continue;
          owned = std::move(fresh).value();
          r = owned.get();
          break;
        }
      } else {
        spdlog::error("ssd: an io_uring ring failed and cannot be replaced: {}",
                      fresh.status().ToString());
      }
    }
    {
      std::lock_guard lock(rings_mu);
      idle_rings.push_back(r);
    }
    rings_cv.notify_one();
  }

  // ---- space (mu held) ------------------------------------------------------

  static constexpr size_t kMaxQueuedTouches = 1 << 16;

  void QueueTouch(QueuedTouch t) {
    {
      std::lock_guard lock(touch_mu);
      if (touches.size() < kMaxQueuedTouches) {
        touches.push_back(std::move(t));
        return;
      }
    }
    // Full: apply the queue and this touch if `mu` is free now; if not, this
    // touch is lost (order is a hint; eviction stays correct either way).
    std::unique_lock lock(mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    ApplyTouchesLocked();
    ApplyTouchLocked(t);
  }

  void ApplyTouchesLocked() {
    std::vector<QueuedTouch> batch;
    {
      std::lock_guard lock(touch_mu);
      batch.swap(touches);
    }
    for (const QueuedTouch& t : batch) ApplyTouchLocked(t);
  }

  void ApplyTouchLocked(const QueuedTouch& t) {
    auto it = records.find(t.key);
    if (it == records.end()) return;
    Record& r = *it->second;
    ReorderLocked(r, [&] { ChangeForTouchLocked(r, t); });
  }

  void ChangeForTouchLocked(Record& r, const QueuedTouch& t) {
    r.meta.last_access = std::max(r.meta.last_access, t.at);
    r.order = std::max(r.order, t.order);
    if (!model.has_value()) return;
    if (t.what == SsdTouch::kUse) {
      // A use while already a shadow is the same use seen twice (a match,
      // then the fetch that promotes).
      if (r.above) {
        r.tick = model->now();
        return;
      }
      // Served from here: the interval that started when the block last
      // left DRAM paid off. The block goes to DRAM, so this copy is a
      // shadow again.
      const uint64_t now = model->Advance();
      if (r.open) model->Reused(HoldTimeModel::ClassOf(r.uses), now - r.tick, r.meta.extent_bytes);
      r.uses = static_cast<uint8_t>(std::min<uint32_t>(r.uses + 1u, 255));
      r.tick = now;
      r.above = true;
      r.open = false;
      return;
    }
    // Left DRAM: from now on only this copy can serve the block.
    if (r.open)
      model->Ended(HoldTimeModel::ClassOf(r.uses), model->now() - r.tick, r.meta.extent_bytes);
    r.uses =
        static_cast<uint8_t>(std::min<uint32_t>(std::max<uint32_t>(r.uses, t.earlier_uses), 255));
    r.tick = model->now();
    r.above = false;
    r.open = true;
    model->Start(HoldTimeModel::ClassOf(r.uses), r.meta.extent_bytes);
  }

  // A new record under the deadline policy: a shadow of the DRAM entry it
  // was written from. A key evicted earlier and written again is a reuse
  // this tier did not wait for.
  void PlaceNewLocked(const std::string& key, Record& r) {
    if (!model.has_value()) return;
    r.tick = model->Advance();
    r.above = true;
    if (const std::optional<GhostTable::Remembered> g =
            ghosts.Take(std::hash<std::string>{}(key))) {
      const GhostState old = Unpack(g->value);
      if (old.open)
        model->Reused(HoldTimeModel::ClassOf(old.uses), r.tick - old.tick, r.meta.extent_bytes);
      r.uses = static_cast<uint8_t>(std::min<uint32_t>(old.uses + 1u, 255));
    }
  }

  // Eviction rank: smaller goes first. LRU: the last access. Deadline: the
  // end of the entry's holding time; a shadow of a DRAM entry is kept as
  // long as the most valuable class would be, twice over, after which it is
  // presumed stale (its DRAM copy went without a renewal). As a queue and a
  // time in it; RankOffsetsLocked gives each queue's share of the rank.
  std::pair<size_t, uint64_t> QueueOfLocked(const Record& r) const {
    if (!model.has_value()) return {0, static_cast<uint64_t>(r.meta.last_access)};
    if (r.above) return {kShadowQueue, r.tick};
    return {static_cast<size_t>(HoldTimeModel::ClassOf(r.uses)), r.tick};
  }
  std::vector<uint64_t> RankOffsetsLocked() const {
    std::vector<uint64_t> offsets(kShadowQueue + 1, 0);
    if (!model.has_value()) return offsets;
    for (int c = 0; c < HoldTimeModel::kClasses; ++c) offsets[c] = model->hold(c);
    // Holding times never fall as the class rises: the top one is longest.
    offsets[kShadowQueue] = 2 * model->hold(HoldTimeModel::kClasses - 1);
    return offsets;
  }

  void EnqueueLocked(Record& r) {
    const auto [queue, time] = QueueOfLocked(r);
    r.queue = static_cast<uint8_t>(queue);
    r.queued = {time, r.order, r.queued.key, &r};
    queues.Insert(queue, r.queued);
    if (queue == kShadowQueue) shadow_bytes += r.meta.extent_bytes;
  }
  void DequeueLocked(Record& r) {
    queues.Erase(r.queue, r.queued);
    if (r.queue == kShadowQueue) shadow_bytes -= r.meta.extent_bytes;
  }
  // `r` joined `records` under `key` (the map's own copy).
  void IndexLocked(const std::string& key, Record& r) {
    r.queued.key = &key;
    by_expiry.insert(&r);
    EnqueueLocked(r);
  }
  // `r` is leaving `records`.
  void UnindexLocked(Record& r) {
    if (r.queued.key == nullptr) return;
    DequeueLocked(r);
    by_expiry.erase(&r);
    r.queued.key = nullptr;
  }
  // Applies a change to what ranks `r` (its times, order, uses or role).
  template <typename Change>
  void ReorderLocked(Record& r, Change change) {
    if (r.queued.key == nullptr) {
      change();
      return;
    }
    DequeueLocked(r);
    change();
    EnqueueLocked(r);
  }

  // The deadline model's budget: the tier swings between its watermarks,
  // and shadows of DRAM entries take their share outside the model.
  double ModelCapacityLocked(uint64_t shadow_bytes) const {
    const double average =
        static_cast<double>(CapacityLocked()) * (opts.low_watermark + opts.high_watermark) / 2;
    return std::max(average - static_cast<double>(shadow_bytes), average / 8);
  }

  void RememberEvictedLocked(const std::string& key, const Record& r) {
    if (!model.has_value()) return;
    ghosts.Add(std::hash<std::string>{}(key), 0, Pack({r.tick, r.uses, r.open}),
               std::max(kGhostFactor * records.size(), kMinGhosts));
  }

  // A ghost remembers the model time, the uses, and whether an interval
  // was open when the key went.
  struct GhostState {
    uint64_t tick;
    uint8_t uses;
    bool open;
  };
  static constexpr int kTickBits = 55;
  static uint64_t Pack(const GhostState& g) {
    return (uint64_t{g.open} << 63) | (uint64_t{g.uses} << kTickBits) |
           (g.tick & ((uint64_t{1} << kTickBits) - 1));
  }
  static GhostState Unpack(uint64_t v) {
    return {v & ((uint64_t{1} << kTickBits) - 1), static_cast<uint8_t>(v >> kTickBits),
            (v >> 63) != 0};
  }
  static constexpr size_t kGhostFactor = 8;
  static constexpr size_t kMinGhosts = 65536;

  uint64_t UsedLocked() const {
    uint64_t used = 0;
    for (const SsdSpace& s : space) used += s.used_bytes();
    return used;
  }

  void PublishGaugesLocked() {
    m.used_bytes->Set(static_cast<int64_t>(UsedLocked()));
    m.entries->Set(static_cast<int64_t>(records.size()));
  }

  std::optional<std::pair<uint32_t, uint64_t>> AllocateLocked(uint64_t bytes) {
    for (uint32_t i = 0; i < space.size(); ++i) {
      const uint32_t f = (next_file + i) % static_cast<uint32_t>(space.size());
      if (auto off = space[f].Allocate(bytes)) {
        next_file = f + 1;
        return std::make_pair(f, *off);
      }
    }
    return std::nullopt;
  }

  void MaybeFreeLocked(Record& r) {
    if (r.retired && r.index_gone && r.readers == 0 && !r.freed) {
      space[r.meta.file].Free(r.meta.offset, r.meta.extent_bytes);
      r.freed = true;
    }
  }

  // Takes a record out of the in-memory index; its extent waits for the
  // durable index delete (FinishRetire).
  // Whether an index delete of `key` is waiting for the index to recover.
  bool UndeletedLocked(const std::string& key) const {
    return std::any_of(undeleted.begin(), undeleted.end(),
                       [&](const auto& u) { return u.first == key; });
  }

  RecordPtr RetireLocked(const std::string& key) {
    auto it = records.find(key);
    if (it == records.end()) return nullptr;
    RecordPtr r = it->second;
    UnindexLocked(*r);
    records.erase(it);
    r->retired = true;
    return r;
  }

  // index_mu held.
  void MarkIndexFailedLocked() {
    index_failed.store(true);
    index_retry_at = clock->Now() + opts.write_retry_interval;
  }

  // Deletes retired records from the index durably, then frees what no
  // reader holds. If the delete fails, the error is returned and the index
  // is failed until RecoverIndex; eviction victims (`restore_on_failure`)
  // go back in memory (the index still has them, their bytes are intact),
  // anything deleted on purpose stays out of memory, its extent held and
  // its delete retried when the index recovers.
  Status FinishRetire(const std::vector<std::string>& keys, const std::vector<RecordPtr>& recs,
                      bool restore_on_failure = false) {
    if (recs.empty()) return Status::Ok();
    const Status injected =
        opts.before_index_delete_hook ? opts.before_index_delete_hook() : Status::Ok();
    std::lock_guard index_lock(index_mu);
    // A key written again since its retire has its own index entry now,
    // which already replaced this one's: it must not be deleted.
    // (No key can be rewritten while index_mu is held.)
    std::vector<std::string> deletes;
    std::vector<bool> rewritten(keys.size(), false);
    {
      std::lock_guard lock(mu);
      for (size_t i = 0; i < keys.size(); ++i) {
        rewritten[i] = records.contains(keys[i]);
        if (!rewritten[i]) deletes.push_back(keys[i]);
      }
    }
    const bool failed_before = index_failed.load();
    Status st = !injected.ok()    ? injected
                : failed_before   ? Unavailable("the SSD index failed earlier")
                : deletes.empty() ? Status::Ok()
                                  : index->Apply({}, deletes, /*sync=*/true);
    if (!st.ok() && !failed_before) MarkIndexFailedLocked();  // RocksDB errors are sticky
    std::lock_guard lock(mu);
    if (!st.ok()) {
      spdlog::error("ssd: deleting {} index entries failed: {}", keys.size(), st.ToString());
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (st.ok() || rewritten[i]) {
        // Deleted, or its index entry overwritten by the rewrite's.
        recs[i]->index_gone = true;
        MaybeFreeLocked(*recs[i]);
      } else if (restore_on_failure && !UndeletedLocked(keys[i]) &&
                 !erased_while_evicting.contains(keys[i])) {
        // Still indexed: serve them rather than leak their space (and
        // evict nothing more: MakeRoom stops once the index failed). Not
        // when a failed put of the key waits to be deleted: back in memory
        // the record would pass for a rewrite and spare the key that delete.
        recs[i]->retired = false;
        auto [it, added] = records.emplace(keys[i], recs[i]);
        if (added) IndexLocked(it->first, *it->second);
      } else {
        undeleted.emplace_back(keys[i], recs[i]);
      }
    }
    if (restore_on_failure) {
      for (const std::string& k : keys) {
        auto it = evicting.find(k);
        if (it != evicting.end() && --it->second == 0) {
          evicting.erase(it);
          erased_while_evicting.erase(k);
        }
      }
    }
    PublishGaugesLocked();
    return st;
  }

  // Victims just taken out of memory by an eviction (FinishRetire with
  // restore_on_failure follows).
  void MarkEvictingLocked(const std::vector<std::string>& keys) {
    for (const std::string& k : keys) ++evicting[k];
  }

  // A failed index is reopened once write_retry_interval has passed (at
  // once with `force`), then the deletes it missed are retried. True if the
  // index is usable and none is missing.
  bool RecoverIndex(bool force = false) {
    if (!index_failed.load() && !force) return true;
    {
      std::lock_guard index_lock(index_mu);
      if (index_failed.load()) {
        const Nanos now = clock->Now();
        if (!force && now < index_retry_at) return false;
        index.reset();  // RocksDB allows one open instance per directory
        auto reopened = SsdIndex::Open(index_path);
        if (!reopened.ok()) {
          index_retry_at = now + opts.write_retry_interval;
          spdlog::error("ssd: reopening the failed index: {}", reopened.status().ToString());
          return false;
        }
        index = std::move(reopened).value();
        index_failed.store(false);
        spdlog::info("ssd: index reopened after a failure");
      }
    }
    std::vector<std::string> keys;
    std::vector<RecordPtr> recs;
    {
      std::lock_guard lock(mu);
      for (auto& [k, r] : undeleted) {
        keys.push_back(std::move(k));
        recs.push_back(std::move(r));
      }
      undeleted.clear();
    }
    return FinishRetire(keys, recs).ok();
  }

  // Picks victims: expired entries (with `ttl`), then the lowest ranked
  // ones while above the low watermark or short of `incoming` bytes. Unread
  // entries only. Walks the eviction queues from their heads, so the cost
  // is the victims', not the tier's size.
  void CollectVictimsLocked(Nanos now, uint64_t incoming, bool ttl, std::vector<std::string>* keys,
                            std::vector<RecordPtr>* recs) {
    const uint64_t cap = CapacityLocked();
    const uint64_t high = static_cast<uint64_t>(opts.high_watermark * static_cast<double>(cap));
    const uint64_t low = static_cast<uint64_t>(opts.low_watermark * static_cast<double>(cap));
    if (!ttl && UsedLocked() + incoming <= high) return;
    ApplyTouchesLocked();
    if (model.has_value()) model->set_capacity(ModelCapacityLocked(shadow_bytes));
    if (ttl) {
      for (const Record* r : by_expiry) {
        if (r->meta.expiry > now) break;
        if (r->readers == 0) keys->push_back(*r->queued.key);
      }
    }
    for (const std::string& k : *keys) recs->push_back(RetireLocked(k));
    ttl_expired += keys->size();
    m.evict_ttl->Increment(keys->size());
    uint64_t used = UsedLocked();
    for (const RecordPtr& r : *recs) used -= r->meta.extent_bytes;
    if (used + incoming <= high) return;
    // Ties (a batch written at once) go in the order they were last
    // touched (ancestors last), then in key order, so a replay evicts the
    // same entries every time.
    const size_t expired = keys->size();
    queues.ForEachInRankOrder(RankOffsetsLocked(),
                              [&](size_t, const EvictionQueues<Record>::Position& p) {
                                if (used + incoming <= low) return false;
                                if (p.item->readers == 0) {
                                  keys->push_back(*p.key);
                                  used -= p.item->meta.extent_bytes;
                                }
                                return true;
                              });
    EvictLocked(std::span(*keys).subspan(expired), recs);
  }

  // Retires ranked victims (remembered as evicted, counted as watermark
  // evictions); their records go to `recs` for FinishRetire.
  void EvictLocked(std::span<const std::string> keys, std::vector<RecordPtr>* recs) {
    for (const std::string& k : keys) {
      RecordPtr r = RetireLocked(k);
      RememberEvictedLocked(k, *r);
      recs->push_back(std::move(r));
    }
    evictions += keys.size();
    m.evict_watermark->Increment(keys.size());
  }

  uint64_t CapacityLocked() const {
    uint64_t cap = 0;
    for (const SsdSpace& s : space) cap += s.capacity_bytes();
    return cap;
  }

  // Enough bytes free, but no run of `bytes` in any file (mixed sizes leave
  // holes): evicts in rank order until a run forms, as a copy of the free
  // space shows, then frees them. Evicts nothing if no run would form. True
  // when the run should be there.
  bool MakeRun(uint64_t bytes) {
    if (!RecoverIndex()) return false;
    std::vector<std::string> keys;
    std::vector<RecordPtr> recs;
    {
      std::lock_guard lock(mu);
      if (std::any_of(space.begin(), space.end(),
                      [&](const SsdSpace& f) { return f.largest_free_bytes() >= bytes; })) {
        return true;  // another batch made one meanwhile
      }
      ApplyTouchesLocked();
      std::vector<SsdSpace> after = space;
      bool formed = false;
      queues.ForEachInRankOrder(RankOffsetsLocked(),
                                [&](size_t, const EvictionQueues<Record>::Position& p) {
                                  if (p.item->readers != 0) return true;
                                  const SsdEntryMeta& m = p.item->meta;
                                  after[m.file].Free(m.offset, m.extent_bytes);
                                  keys.push_back(*p.key);
                                  formed = after[m.file].largest_free_bytes() >= bytes;
                                  return !formed;
                                });
      if (!formed) return false;
      EvictLocked(keys, &recs);
      MarkEvictingLocked(keys);
    }
    // Freed once the index forgets them (and no reader came meanwhile).
    return FinishRetire(keys, recs, /*restore_on_failure=*/true).ok();
  }

  uint64_t MakeRoom(uint64_t incoming, bool ttl) {
    if (!RecoverIndex()) return 0;  // no delete could be made durable
    std::vector<std::string> keys;
    std::vector<RecordPtr> recs;
    {
      std::lock_guard lock(mu);
      CollectVictimsLocked(clock->Now(), incoming, ttl, &keys, &recs);
      MarkEvictingLocked(keys);
    }
    return FinishRetire(keys, recs, /*restore_on_failure=*/true).ok() ? recs.size() : 0;
  }

  void DisableWrites(const std::string& why) {
    std::lock_guard lock(mu);
    ++write_failures;
    m.write_failures->Increment();
    if (writes_enabled) {
      spdlog::error("ssd: writes stopped for {} ms: {}", opts.write_retry_interval / kNanosPerMilli,
                    why);
    }
    writes_enabled = false;
    writes_retry_at = clock->Now() + opts.write_retry_interval;
    m.writes_enabled->Set(0);
  }

  bool WritesAllowedLocked(Nanos now) {
    if (!writes_enabled && now >= writes_retry_at && !index_failed.load()) {
      writes_enabled = true;
      m.writes_enabled->Set(1);
      spdlog::info("ssd: retrying writes");
    }
    return writes_enabled;
  }

  void Drop(const std::string& key, const RecordPtr& expected, Counter* reason) {
    std::vector<std::string> keys;
    std::vector<RecordPtr> recs;
    {
      std::lock_guard lock(mu);
      auto it = records.find(key);
      if (it == records.end() || it->second != expected) return;
      recs.push_back(RetireLocked(key));
      keys.push_back(key);
      reason->Increment();
    }
    (void)FinishRetire(keys, recs);  // out of memory, whatever the index says
  }

  // Splits one entry's I/O into ops: one direct op, or bounce-sized chunks.
  void PlanOps(bool write, const SsdEntryMeta& meta, std::byte* direct, std::vector<IoOp>* ops,
               std::vector<std::pair<size_t, uint64_t>>* owner, size_t entry) const {
    if (direct != nullptr) {
      ops->push_back({write, meta.file, meta.offset, static_cast<uint32_t>(meta.extent_bytes),
                      direct, 0, false});
      owner->emplace_back(entry, 0);
      return;
    }
    // Not rings.front()->buffer_bytes(): ReleaseRing may replace that ring
    // meanwhile (under rings_mu).
    const uint64_t chunk = opts.io_buffer_bytes;
    for (uint64_t off = 0; off < meta.extent_bytes; off += chunk) {
      const uint64_t len = std::min(chunk, meta.extent_bytes - off);
      ops->push_back(
          {write, meta.file, meta.offset + off, static_cast<uint32_t>(len), nullptr, 0, false});
      owner->emplace_back(entry, off);
    }
  }

  // Bytes of a data file's [offset, offset + bytes) the file system has not
  // allocated yet (holes: the files are sparse), which writing them
  // consumes. Counts what it cannot tell as unallocated.
  uint64_t UnallocatedBytes(uint32_t file, uint64_t offset, uint64_t bytes) const {
    const uint64_t end = offset + bytes;
    uint64_t holes = 0;
    for (uint64_t pos = offset; pos < end;) {
      const off_t data = ::lseek(fds[file], static_cast<off_t>(pos), SEEK_DATA);
      if (data < 0 || static_cast<uint64_t>(data) >= end) return holes + (end - pos);
      holes += static_cast<uint64_t>(data) - pos;
      const off_t hole = ::lseek(fds[file], data, SEEK_HOLE);
      if (hole < 0) return holes + (end - static_cast<uint64_t>(data));
      pos = static_cast<uint64_t>(hole);
    }
    return holes;
  }

  // A batch's share of reserved_bytes: given back once its writes are done
  // (when statvfs shows what they consumed), or when the batch ends.
  class Reservation {
   public:
    explicit Reservation(Impl& s) : s_(s) {}
    ~Reservation() { Release(); }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;

    void AddLocked(uint64_t bytes) {  // free_mu held
      s_.reserved_bytes += bytes;
      bytes_ += bytes;
    }
    void Release() {
      if (bytes_ == 0) return;
      std::lock_guard lock(s_.free_mu);
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
  Status ReserveFreeSpace(uint64_t consumes, Reservation* r, bool* full) {
    std::lock_guard lock(free_mu);
    // statvfs under free_mu: a reservation is given back only after its
    // batch's writes, so each admitted batch is counted here, in the free
    // space or in reserved_bytes (in both while it is being written).
    struct statvfs vfs {};
    if (::statvfs(opts.dir.c_str(), &vfs) != 0) return Status::Ok();
    const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    *full = free_bytes < opts.min_free_bytes + consumes;
    if (free_bytes < opts.min_free_bytes + reserved_bytes + consumes) {
      return Unavailable("the file system has " + std::to_string(free_bytes) +
                         " bytes free, less " + std::to_string(reserved_bytes) +
                         " reserved by batches being written; a batch needs " +
                         std::to_string(consumes) + " and " + std::to_string(opts.min_free_bytes) +
                         " are kept free");
    }
    r->AddLocked(consumes);
    return Status::Ok();
  }

  Status SyncFiles(const std::vector<bool>& touched) const {
    for (size_t f = 0; f < fds.size(); ++f) {
      if (touched[f] && ::fdatasync(fds[f]) != 0) {
        return Unavailable("fdatasync " + paths[f] + ": " + Errno(errno));
      }
    }
    return Status::Ok();
  }
};

SsdTier::SsdTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SsdTier::~SsdTier() {
  // Last chance for deletes the index missed: a restart would bring their
  // entries back.
  bool undeleted = false;
  {
    std::lock_guard lock(impl_->mu);
    undeleted = !impl_->undeleted.empty();
  }
  if (undeleted && !impl_->RecoverIndex(/*force=*/true)) {
    spdlog::error("ssd: closing with index deletes not made durable; their entries come back");
  }
}

Result<std::unique_ptr<SsdTier>> SsdTier::Open(SsdTierOptions options) {
  if (options.dir.empty()) return InvalidArgument("the SSD tier needs a directory");
  if (options.data_files == 0 || options.data_files > 64) {
    return InvalidArgument("data_files must be in 1..64");
  }
  const uint64_t per_file =
      options.capacity_bytes / options.data_files / kSsdBlockBytes * kSsdBlockBytes;
  if (per_file == 0)
    return InvalidArgument("SSD capacity is smaller than one 4 KiB block per file");
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return InvalidArgument("queue_depth must be in 1..4096");
  }
  if (options.rings == 0 || options.rings > 64) return InvalidArgument("rings must be in 1..64");
  if (options.io_buffer_bytes == 0 || options.io_buffer_bytes % kSsdBlockBytes != 0 ||
      options.io_buffer_bytes > (64u << 20)) {
    return InvalidArgument("io_buffer_bytes must be a multiple of 4096, at most 64 MiB");
  }
  if (!(options.low_watermark > 0 && options.low_watermark <= options.high_watermark &&
        options.high_watermark <= 1.0)) {
    return InvalidArgument("SSD watermarks need 0 < low <= high <= 1");
  }
  if (options.ttl <= 0) return InvalidArgument("SSD TTL must be positive");
  if (options.eviction_policy != "lru" && options.eviction_policy != "deadline") {
    return InvalidArgument("unknown SSD eviction policy '" + options.eviction_policy +
                           "' (lru or deadline)");
  }

  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->clock = options.clock != nullptr ? options.clock : &kWallClock;
  MetricsRegistry* reg = options.metrics;
  if (reg == nullptr) {
    impl->owned_metrics = std::make_unique<MetricsRegistry>();
    reg = impl->owned_metrics.get();
  }
  Impl::Metrics& m = impl->m;
  const MetricLabels ssd{{"tier", "ssd"}};
  auto evict = [&](const char* reason) {
    return reg->GetCounter("strata_evictions_total", "Entries removed, by reason.",
                           {{"tier", "ssd"}, {"reason", reason}});
  };
  m.bytes_written =
      reg->GetCounter("strata_ssd_written_bytes_total", "Payload bytes written to SSD.");
  m.bytes_read =
      reg->GetCounter("strata_ssd_read_bytes_total", "Verified payload bytes read from SSD.");
  m.write_failures = reg->GetCounter("strata_ssd_write_failures_total",
                                     "SSD write batches failed by I/O errors or a full disk.");
  m.checksum_failures = reg->GetCounter("strata_ssd_checksum_failures_total",
                                        "SSD reads that failed verification (entry dropped).");
  m.evict_watermark = evict("watermark");
  m.evict_ttl = evict("ttl");
  m.evict_checksum = evict("checksum");
  m.evict_explicit = evict("explicit");
  m.evict_io_error = evict("io_error");
  m.used_bytes = reg->GetGauge("strata_tier_used_bytes", "Bytes allocated in the tier.", ssd);
  m.capacity_bytes = reg->GetGauge("strata_tier_capacity_bytes", "Tier capacity.", ssd);
  m.entries = reg->GetGauge("strata_ssd_entries", "Entries indexed on the SSD tier.");
  m.writes_enabled = reg->GetGauge("strata_ssd_writes_enabled", "1 unless SSD writes are stopped.");
  m.writes_enabled->Set(1);

  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return Unavailable("cannot create " + options.dir + ": " + ec.message());
  // Before anything is opened or resized: a second tier on this directory
  // (a restart racing the old process, another node) would shrink or
  // overwrite the live one's files, whatever its index directory.
  const std::string lock_path = options.dir + "/LOCK";
  impl->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (impl->lock_fd < 0) return Unavailable("open " + lock_path + ": " + Errno(errno));
  if (::flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Unavailable("SSD directory " + options.dir + " is in use by another SSD tier (" +
                       lock_path + " is locked: " + Errno(errno) + ")");
  }
  for (uint32_t f = 0; f < options.data_files; ++f) {
    const std::string path = options.dir + "/data-" + std::to_string(f) + ".bin";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) return Unavailable("open " + path + " with O_DIRECT: " + Errno(errno));
    impl->fds.push_back(fd);
    impl->paths.push_back(path);
    // Sparse: space is used as extents are written, so a small file system
    // shows up as ENOSPC on write, not as a failed open.
    if (::ftruncate(fd, static_cast<off_t>(per_file)) != 0) {
      return Unavailable("ftruncate " + path + ": " + Errno(errno));
    }
    impl->space.emplace_back(per_file);
  }
  for (uint32_t i = 0; i < options.rings; ++i) {
    auto ring = UringRing::Create(impl->fds, options.queue_depth, options.io_buffer_bytes);
    if (!ring.ok()) return ring.status();
    impl->idle_rings.push_back(ring->get());
    impl->rings.push_back(std::move(ring).value());
  }
  impl->index_path = options.index_dir.empty() ? options.dir + "/index" : options.index_dir;
  auto index = SsdIndex::Open(impl->index_path);
  if (!index.ok()) return index.status();
  impl->index = std::move(index).value();

  // Rebuild the in-memory index and the occupancy from RocksDB; drop what is
  // undecodable, expired, out of range or overlapping.
  const Nanos now = impl->clock->Now();
  std::vector<std::string> bad;
  Status scan = impl->index->ForEach([&](std::string_view k, std::string_view v) {
    std::optional<SsdKey> key = DecodeSsdKey(k);
    std::optional<SsdEntryMeta> meta = DecodeSsdMeta(v);
    const bool ok = key.has_value() && meta.has_value() && meta->file < options.data_files &&
                    meta->offset % kSsdBlockBytes == 0 &&
                    meta->extent_bytes == SsdIoBytes(meta->payload_bytes) &&
                    meta->payload_bytes > 0 && meta->payload_bytes <= kMaxSsdPayloadBytes &&
                    meta->expiry > now &&
                    impl->space[meta->file].Claim(meta->offset, meta->extent_bytes);
    if (!ok) {
      bad.emplace_back(k);
      return;
    }
    auto rec = std::make_shared<Record>();
    rec->meta = *meta;
    rec->persisted_access = meta->last_access;
    impl->models[key->ns].insert(key->model_id);
    impl->records.emplace(std::string(k), std::move(rec));
  });
  STRATA_RETURN_IF_ERROR(scan);
  if (!bad.empty()) {
    spdlog::warn("ssd: dropped {} index entries on open (expired or invalid)", bad.size());
    STRATA_RETURN_IF_ERROR(impl->index->Apply({}, bad, /*sync=*/true));
  }
  if (options.eviction_policy == "deadline") {
    impl->model.emplace(impl->ModelCapacityLocked(0));
    // Restored entries keep their last-access order and come before
    // anything written from now on.
    std::vector<std::pair<Nanos, Record*>> restored;
    for (const auto& [k, r] : impl->records) restored.emplace_back(r->meta.last_access, r.get());
    std::sort(restored.begin(), restored.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < restored.size(); ++i) restored[i].second->tick = i;
    impl->model->StartAt(restored.size());
  }
  for (auto& [k, r] : impl->records) impl->IndexLocked(k, *r);
  m.capacity_bytes->Set(static_cast<int64_t>(impl->CapacityLocked()));
  impl->PublishGaugesLocked();
  return std::unique_ptr<SsdTier>(new SsdTier(std::move(impl)));
}

std::vector<Status> SsdTier::WriteBatch(std::span<const SsdWrite> writes) {
  Impl& s = *impl_;
  std::vector<Status> out(writes.size(), Status::Ok());
  std::vector<std::string> keys(writes.size());
  std::vector<bool> todo(writes.size(), false);
  uint64_t incoming = 0;
  const Nanos now = s.clock->Now();
  const bool index_ok = s.RecoverIndex();
  {
    std::lock_guard lock(s.mu);
    const bool allowed = s.WritesAllowedLocked(now) && index_ok;
    for (size_t i = 0; i < writes.size(); ++i) {
      const SsdWrite& w = writes[i];
      if (w.payload.empty() || w.payload.size() > kMaxSsdPayloadBytes) {
        out[i] = InvalidArgument("SSD payload must be 1 byte .. 1 GiB");
        continue;
      }
      // An extent lives in one data file: a larger one could never be
      // placed, and making room for it would empty the tier for nothing.
      if (SsdIoBytes(w.payload.size()) > s.space[0].capacity_bytes()) {
        out[i] = ResourceExhausted("SSD entry of " + std::to_string(w.payload.size()) +
                                   " bytes exceeds one data file (" +
                                   std::to_string(s.space[0].capacity_bytes()) +
                                   " bytes): fewer data files or more capacity would hold it");
        continue;
      }
      keys[i] = EncodeSsdKey(w.key);
      auto it = s.records.find(keys[i]);
      if ((it != s.records.end() && it->second->meta.expiry > now) || s.pending.count(keys[i])) {
        continue;  // stored, or being stored by another batch: idempotent
      }
      if (!allowed) {
        out[i] = Unavailable("SSD writes are stopped after an I/O or index error or a full disk");
        continue;
      }
      s.pending.insert(keys[i]);
      todo[i] = true;
      incoming += SsdIoBytes(w.payload.size());
    }
  }
  if (incoming == 0) return out;
  s.MakeRoom(incoming, /*ttl=*/false);

  // Place every entry, then write them all in one pass over a ring. An
  // entry the free space has no run for gets one made, then a second try.
  std::vector<SsdEntryMeta> metas(writes.size());
  std::vector<bool> placed(writes.size(), false);
  std::vector<size_t> no_run;
  auto place = [&](size_t i, bool last_try) {  // s.mu held
    auto where = s.AllocateLocked(SsdIoBytes(writes[i].payload.size()));
    if (!where.has_value()) {
      if (!last_try) {
        no_run.push_back(i);
        return;
      }
      out[i] = ResourceExhausted("no room on the SSD tier for " +
                                 std::to_string(SsdIoBytes(writes[i].payload.size())) +
                                 " bytes in one run (the entries in the way are being read)");
      s.pending.erase(keys[i]);
      todo[i] = false;
      return;
    }
    placed[i] = true;
    SsdEntryMeta& m = metas[i];
    m.file = where->first;
    m.offset = where->second;
    m.payload_bytes = writes[i].payload.size();
    m.extent_bytes = SsdIoBytes(m.payload_bytes);
    m.entry_checksum = writes[i].entry_checksum;
    m.layout_id = writes[i].layout_id;
    m.commit_time = writes[i].commit_time != 0 ? writes[i].commit_time : now;
    m.expiry = now + s.opts.ttl;
    m.last_access = now;
  };
  {
    std::lock_guard lock(s.mu);
    for (size_t i = 0; i < writes.size(); ++i) {
      if (todo[i]) place(i, /*last_try=*/false);
    }
  }
  for (size_t i : no_run) {
    (void)s.MakeRun(SsdIoBytes(writes[i].payload.size()));
    std::lock_guard lock(s.mu);
    place(i, /*last_try=*/true);
  }
  // The batch must leave min_free_bytes free. Only blocks never written
  // count: a reused extent is allocated on disk already.
  uint64_t consumes = 0;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (placed[i])
      consumes += s.UnallocatedBytes(metas[i].file, metas[i].offset, metas[i].extent_bytes);
  }
  Impl::Reservation reservation(s);
  bool full = false;
  if (Status room = s.ReserveFreeSpace(consumes, &reservation, &full); !room.ok()) {
    if (full) s.DisableWrites(room.message());
    std::lock_guard lock(s.mu);
    for (size_t i = 0; i < writes.size(); ++i) {
      if (!placed[i]) continue;
      s.space[metas[i].file].Free(metas[i].offset, metas[i].extent_bytes);
      s.pending.erase(keys[i]);
      out[i] = full ? Unavailable("SSD writes are stopped: the file system is full")
                    : Unavailable("no SSD room while other batches are written: " + room.message());
    }
    return out;
  }
  // Checksummed before the I/O: bytes that change under it fail their
  // first read rather than become a copy that vouches for them.
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!todo[i]) continue;
    metas[i].data_checksum =
        KeyBoundChecksum(writes[i].data_checksum.has_value() ? *writes[i].data_checksum
                                                             : Checksum64(writes[i].payload),
                         writes[i].key);
  }
  if (s.opts.before_data_write_hook) s.opts.before_data_write_hook();
  std::vector<IoOp> ops;
  std::vector<std::pair<size_t, uint64_t>> owner;  // op -> (write, offset in payload)
  std::vector<bool> touched(s.fds.size(), false);
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!todo[i]) continue;
    const bool direct =
        IsAligned(writes[i].payload.data()) && writes[i].readable_bytes >= metas[i].extent_bytes;
    // The ring only reads from a direct source, never writes to it.
    auto* src = const_cast<std::byte*>(writes[i].payload.data());
    s.PlanOps(/*write=*/true, metas[i], direct ? src : nullptr, &ops, &owner, i);
    touched[metas[i].file] = true;
  }
  UringRing* ring = s.AcquireRing();
  ring->Run(
      ops,
      [&](size_t op, std::span<std::byte> buf) {
        const auto [i, off] = owner[op];
        const std::span<const std::byte> src = writes[i].payload;
        const uint64_t n = std::min<uint64_t>(buf.size(), src.size() - off);
        std::memcpy(buf.data(), src.data() + off, n);
        std::memset(buf.data() + n, 0, buf.size() - n);  // no stale bytes on disk
      },
      [](size_t, std::span<std::byte>) {}, [](size_t) {});
  s.ReleaseRing(ring);
  // Written or failed: the free space shows what the batch consumed now.
  reservation.Release();

  std::string io_error;
  for (size_t op = 0; op < ops.size(); ++op) {
    if (ops[op].result == static_cast<int>(ops[op].length)) continue;
    const size_t i = owner[op].first;
    // A short O_DIRECT write means the file system ran out of space.
    const int err = ops[op].result < 0 ? -ops[op].result : ENOSPC;
    if (todo[i]) {
      out[i] = Unavailable("SSD write failed: " + Errno(err));
      todo[i] = false;
    }
    if (io_error.empty()) io_error = s.paths[ops[op].file] + ": " + Errno(err);
  }
  Status durable = s.opts.sync ? s.SyncFiles(touched) : Status::Ok();
  if (durable.ok() && s.opts.before_index_write_hook) s.opts.before_index_write_hook();
  // Held until the records are in memory: see index_mu.
  std::lock_guard index_lock(s.index_mu);
  std::vector<std::pair<std::string, SsdEntryMeta>> puts;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (todo[i] && durable.ok()) puts.emplace_back(keys[i], metas[i]);
  }
  // A failed put may still have reached RocksDB's log (a failed sync):
  // its extents wait for a durable delete like a retired record's.
  bool maybe_indexed = false;
  if (durable.ok() && s.index_failed.load()) {
    durable = Unavailable("the SSD index failed earlier");
  } else if (durable.ok()) {
    if (s.opts.before_index_put_hook) durable = s.opts.before_index_put_hook();
    if (durable.ok()) durable = s.index->Apply(puts, {}, s.opts.sync);
    if (durable.ok() && s.opts.after_index_put_hook) durable = s.opts.after_index_put_hook();
    if (!durable.ok()) {
      s.MarkIndexFailedLocked();
      maybe_indexed = true;
    }
  }
  std::vector<bool> undeleted(writes.size(), false);
  if (!durable.ok()) {
    for (size_t i = 0; i < writes.size(); ++i) {
      if (todo[i]) {
        out[i] = durable;
        undeleted[i] = maybe_indexed;
      }
      todo[i] = false;
    }
    if (io_error.empty()) io_error = durable.ToString();
  }
  if (!io_error.empty()) s.DisableWrites(io_error);

  std::lock_guard lock(s.mu);
  // Last to first: a batch lists a chain root first, and the root must be
  // the youngest (Record::order).
  for (size_t i = writes.size(); i-- > 0;) {
    if (!placed[i]) continue;
    s.pending.erase(keys[i]);
    if (undeleted[i]) {
      // An expired entry under the same key goes too: the put may have
      // overwritten its index entry, and left in memory it would pass for a
      // rewrite, so the retried delete would skip the key and leave the new
      // entry indexed over a freed extent. One delete covers both.
      if (RecordPtr old = s.RetireLocked(keys[i])) {
        s.undeleted.emplace_back(keys[i], std::move(old));
      }
      auto rec = std::make_shared<Record>();
      rec->meta = metas[i];
      rec->retired = true;
      s.undeleted.emplace_back(keys[i], std::move(rec));
      continue;
    }
    if (!todo[i]) {
      // Never indexed: the extent can be reused at once.
      s.space[metas[i].file].Free(metas[i].offset, metas[i].extent_bytes);
      continue;
    }
    auto rec = std::make_shared<Record>();
    rec->meta = metas[i];
    rec->persisted_access = now;
    s.models[writes[i].key.ns].insert(writes[i].key.model_id);
    auto [slot, added] = s.records.try_emplace(keys[i]);
    if (!added) {
      // An expired entry under the same key: the put just overwrote its
      // index entry, so its extent goes once no reader holds it.
      Record& old = *slot->second;
      s.UnindexLocked(old);
      old.retired = true;
      old.index_gone = true;
      s.MaybeFreeLocked(old);
    }
    s.PlaceNewLocked(keys[i], *rec);
    rec->order = s.NextOrder();
    slot->second = std::move(rec);
    s.IndexLocked(slot->first, *slot->second);
    s.bytes_written += metas[i].payload_bytes;
    s.m.bytes_written->Increment(metas[i].payload_bytes);
  }
  s.PublishGaugesLocked();
  return out;
}

Status SsdTier::Write(const SsdWrite& write) { return WriteBatch({&write, 1}).front(); }

std::vector<Status> SsdTier::ReadBatch(std::span<const SsdRead> reads) {
  Impl& s = *impl_;
  std::vector<Status> out(reads.size(), Status::Ok());
  std::vector<std::string> keys(reads.size());
  std::vector<RecordPtr> recs(reads.size());
  const Nanos now = s.clock->Now();
  {
    std::lock_guard lock(s.mu);
    for (size_t i = 0; i < reads.size(); ++i) {
      keys[i] = EncodeSsdKey(reads[i].key);
      auto it = s.records.find(keys[i]);
      if (it == s.records.end() || it->second->meta.expiry <= now) {
        out[i] = NotFound("not on the SSD tier");
        continue;
      }
      if (reads[i].dst.size() < it->second->meta.payload_bytes) {
        out[i] = InvalidArgument("read buffer smaller than the payload");
        continue;
      }
      recs[i] = it->second;
      ++recs[i]->readers;
    }
  }
  std::vector<IoOp> ops;
  std::vector<std::pair<size_t, uint64_t>> owner;
  std::vector<uint32_t> ops_left(reads.size(), 0);
  std::vector<bool> io_ok(reads.size(), true), sum_ok(reads.size(), false);
  for (size_t i = 0; i < reads.size(); ++i) {
    if (recs[i] == nullptr) continue;
    std::byte* dst = reads[i].dst.data();
    const bool direct = IsAligned(dst) && reads[i].dst.size() >= recs[i]->meta.extent_bytes;
    const size_t before = ops.size();
    s.PlanOps(/*write=*/false, recs[i]->meta, direct ? dst : nullptr, &ops, &owner, i);
    ops_left[i] = static_cast<uint32_t>(ops.size() - before);
  }
  if (!ops.empty()) {
    UringRing* ring = s.AcquireRing();
    ring->Run(
        ops, [](size_t, std::span<std::byte>) {},
        [&](size_t op, std::span<std::byte> buf) {
          const auto [i, off] = owner[op];
          const uint64_t payload = recs[i]->meta.payload_bytes;
          std::memcpy(reads[i].dst.data() + off, buf.data(),
                      std::min<uint64_t>(buf.size(), payload - off));
        },
        [&](size_t op) {
          // Verify each entry as soon as its last op lands, while the rest
          // of the batch is still in flight.
          const size_t i = owner[op].first;
          if (ops[op].result != static_cast<int>(ops[op].length)) io_ok[i] = false;
          if (--ops_left[i] == 0 && io_ok[i]) {
            const SsdEntryMeta& meta = recs[i]->meta;
            sum_ok[i] = KeyBoundChecksum(Checksum64(reads[i].dst.first(meta.payload_bytes)),
                                         reads[i].key) == meta.data_checksum;
          }
        });
    s.ReleaseRing(ring);
  }
  std::vector<bool> bad_io(reads.size(), false);
  for (size_t op = 0; op < ops.size(); ++op) {
    const size_t i = owner[op].first;
    const IoOp& io = ops[op];
    if (io.result == static_cast<int>(io.length) || !out[i].ok()) continue;
    const std::string why = io.result >= 0 ? "short read, " + std::to_string(io.result) + " of " +
                                                 std::to_string(io.length) + " bytes"
                                           : Errno(-io.result);
    // A short read or a media error from the device: the bytes are gone, as
    // with a checksum mismatch, and keeping the entry would make every match
    // a hit whose promotion fails. A failed ring, EAGAIN or ENOMEM says
    // nothing about them: the entry stays.
    if (io.completed &&
        (io.result >= 0 || io.result == -EIO || io.result == -ENODATA || io.result == -EILSEQ)) {
      spdlog::warn("ssd: reading {} at offset {} failed ({}); entry dropped", s.paths[io.file],
                   io.offset, why);
      out[i] = NotFound("SSD read failed (" + why + "); entry dropped");
      bad_io[i] = true;
    } else {
      out[i] = Unavailable("SSD read failed: " + why);
    }
  }
  // Verify every payload; a mismatch is never served.
  for (size_t i = 0; i < reads.size(); ++i) {
    if (recs[i] == nullptr || !out[i].ok()) continue;
    const SsdEntryMeta& meta = recs[i]->meta;
    if (!sum_ok[i]) {
      spdlog::warn("ssd: checksum mismatch in {} at offset {}; entry dropped", s.paths[meta.file],
                   meta.offset);
      {
        std::lock_guard lock(s.mu);
        ++s.checksum_failures;
      }
      s.m.checksum_failures->Increment();
      out[i] = NotFound("SSD entry failed its checksum and was dropped");
      continue;
    }
    s.m.bytes_read->Increment(meta.payload_bytes);
  }
  std::vector<std::pair<std::string, RecordPtr>> access_puts;
  std::vector<std::tuple<std::string, RecordPtr, Counter*>> to_drop;
  {
    std::lock_guard lock(s.mu);
    for (size_t i = reads.size(); i-- > 0;) {  // root last: see Record::order
      if (recs[i] == nullptr) continue;
      Record& r = *recs[i];
      --r.readers;
      if (out[i].ok()) {
        s.bytes_read += r.meta.payload_bytes;
        s.ReorderLocked(r, [&] {
          r.meta.last_access = now;
          r.order = s.NextOrder();
        });
        if (!r.retired && now - r.persisted_access >= s.opts.access_persist_interval) {
          r.persisted_access = now;
          access_puts.emplace_back(keys[i], recs[i]);
        }
      } else if (out[i].code() == StatusCode::kNotFound) {
        to_drop.emplace_back(keys[i], recs[i], bad_io[i] ? s.m.evict_io_error : s.m.evict_checksum);
      }
      s.MaybeFreeLocked(r);
    }
  }
  for (const auto& [k, r, reason] : to_drop) s.Drop(k, r, reason);
  if (!access_puts.empty() && !s.index_failed.load()) {
    // Only records still current: one deleted or rewritten since the read
    // keeps what its delete or rewrite wrote. A hint: never worth waiting
    // for another batch's synced index write (a promotion is waiting on us).
    std::unique_lock index_lock(s.index_mu, std::try_to_lock);
    std::vector<std::pair<std::string, SsdEntryMeta>> puts;
    if (index_lock.owns_lock() && !s.index_failed.load()) {
      std::lock_guard lock(s.mu);
      for (const auto& [k, r] : access_puts) {
        auto it = s.records.find(k);
        if (it != s.records.end() && it->second == r && !r->retired) puts.emplace_back(k, r->meta);
      }
    }
    Status st;
    if (!puts.empty() && s.opts.before_index_put_hook) st = s.opts.before_index_put_hook();
    if (!puts.empty() && st.ok()) st = s.index->Apply(puts, {}, /*sync=*/false);
    // Nor does its failure fail the index: if RocksDB is in trouble, the
    // next real write finds out (and the index recovers from there).
    if (!st.ok()) spdlog::warn("ssd: persisting access times failed: {}", st.ToString());
  }
  return out;
}

Status SsdTier::Read(const SsdRead& read) { return ReadBatch({&read, 1}).front(); }

std::optional<SsdEntryMeta> SsdTier::Lookup(const SsdKey& key) const {
  const std::string k = EncodeSsdKey(key);
  std::lock_guard lock(impl_->mu);
  auto it = impl_->records.find(k);
  if (it == impl_->records.end() || it->second->meta.expiry <= impl_->clock->Now()) {
    return std::nullopt;
  }
  return it->second->meta;
}

void SsdTier::Touch(const SsdKey& key, SsdTouch what, uint32_t earlier_uses) {
  impl_->QueueTouch(
      {EncodeSsdKey(key), impl_->clock->Now(), what, earlier_uses, impl_->NextOrder()});
}

Status SsdTier::Erase(const SsdKey& key) {
  Impl& s = *impl_;
  const std::string k = EncodeSsdKey(key);
  RecordPtr r;
  {
    std::lock_guard lock(s.mu);
    // An eviction of the key may be deleting it from the index now: if that
    // delete fails, its victim must stay out of memory.
    if (s.evicting.contains(k)) s.erased_while_evicting.insert(k);
    r = s.RetireLocked(k);
    if (r == nullptr && !s.UndeletedLocked(k)) return NotFound("not on the SSD tier");
    if (r != nullptr) s.m.evict_explicit->Increment();
  }
  if (r != nullptr) return s.FinishRetire({k}, {r});
  // Erased already, but the index has not recorded it: not done until it
  // has (a restart would bring the entry back).
  (void)s.RecoverIndex();
  std::lock_guard lock(s.mu);
  return s.UndeletedLocked(k) ? Unavailable("the SSD index has not recorded an earlier erase yet")
                              : Status::Ok();
}

SsdListPage SsdTier::List(std::string_view ns, const std::optional<SsdListCursor>& after,
                          size_t limit) const {
  SsdListPage page;
  if (limit == 0) return page;
  Impl& s = *impl_;
  const Nanos now = s.clock->Now();
  using Iter = decltype(s.records)::const_iterator;
  // A cursor into each model's range of the namespace (its keys share the
  // prefix ns | model and run in (chain key, kind) order), merged.
  struct Range {
    Iter it;
    std::string prefix;
  };
  std::lock_guard lock(s.mu);
  s.ApplyTouchesLocked();  // so last_access is current
  auto models = s.models.find(ns);
  if (models == s.models.end()) return page;
  std::vector<Range> ranges;
  for (const ModelId& model : models->second) {
    SsdKey from{std::string(ns), model, after.has_value() ? after->chain : ChainKey{},
                after.has_value() ? after->kind : StateKind{}};
    std::string start = EncodeSsdKey(from);
    Range r{after.has_value() ? s.records.upper_bound(start) : s.records.lower_bound(start),
            start.substr(0, start.size() - ChainKey{}.bytes.size() - 1)};
    ranges.push_back(std::move(r));
  }
  // The next unexpired entry of a range, or its end.
  auto settle = [&](Range& r) {
    while (r.it != s.records.end() && r.it->first.starts_with(r.prefix) &&
           r.it->second->meta.expiry <= now) {
      ++r.it;
    }
    if (r.it != s.records.end() && !r.it->first.starts_with(r.prefix)) r.it = s.records.end();
  };
  // (chain key, kind) and then model: the bytes after the shared ns prefix,
  // reordered.
  const size_t ns_bytes = EncodeSsdKeyPrefix(ns).size();
  constexpr size_t kModelBytes = sizeof(ModelId::bytes);
  auto order = [&](const std::string& k) {
    const std::string_view v(k);
    return std::make_pair(v.substr(ns_bytes + kModelBytes), v.substr(ns_bytes, kModelBytes));
  };
  for (Range& r : ranges) settle(r);
  std::optional<std::string> last_group;  // chain key | kind of the last entry taken
  for (;;) {
    Range* best = nullptr;
    for (Range& r : ranges) {
      if (r.it == s.records.end()) continue;
      if (best == nullptr || order(r.it->first) < order(best->it->first)) best = &r;
    }
    if (best == nullptr) return page;
    const std::string_view group = std::string_view(best->it->first).substr(ns_bytes + kModelBytes);
    // Past `limit`, only the rest of the last (chain key, kind): a cursor
    // names no model, so one key's models are never split.
    if (page.entries.size() >= limit && (!last_group.has_value() || group != *last_group)) {
      page.more = true;
      return page;
    }
    std::optional<SsdKey> key = DecodeSsdKey(best->it->first);
    if (key.has_value()) {
      page.entries.emplace_back(std::move(*key), best->it->second->meta);
      last_group = std::string(group);
    }
    ++best->it;
    settle(*best);
  }
}

std::vector<std::pair<SsdKey, SsdEntryMeta>> SsdTier::Find(std::string_view ns,
                                                           const ChainKey& chain,
                                                           StateKind kind) const {
  std::vector<std::pair<SsdKey, SsdEntryMeta>> out;
  const Nanos now = impl_->clock->Now();
  std::lock_guard lock(impl_->mu);
  auto models = impl_->models.find(ns);
  if (models == impl_->models.end()) return out;
  impl_->ApplyTouchesLocked();
  for (const ModelId& model : models->second) {
    SsdKey key{std::string(ns), model, chain, kind};
    auto it = impl_->records.find(EncodeSsdKey(key));
    if (it == impl_->records.end() || it->second->meta.expiry <= now) continue;
    out.emplace_back(std::move(key), it->second->meta);
  }
  return out;
}

Nanos SsdTier::Now() const { return impl_->clock->Now(); }

uint64_t SsdTier::RunMaintenance() { return impl_->MakeRoom(0, /*ttl=*/true); }

SsdTierStats SsdTier::Stats() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  SsdTierStats st;
  st.capacity_bytes = s.CapacityLocked();
  st.used_bytes = s.UsedLocked();
  st.entries = s.records.size();
  st.bytes_written = s.bytes_written;
  st.bytes_read = s.bytes_read;
  st.write_failures = s.write_failures;
  st.checksum_failures = s.checksum_failures;
  st.evictions = s.evictions;
  st.ttl_expired = s.ttl_expired;
  st.writes_enabled = s.writes_enabled && !s.index_failed.load();
  return st;
}

const SsdTierOptions& SsdTier::options() const { return impl_->opts; }

std::string SsdTier::DataFilePathForTesting(uint32_t file) const {
  return file < impl_->paths.size() ? impl_->paths[file] : std::string();
}

bool SsdTier::EvictionOrderConsistentForTesting() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  uint64_t shadow_bytes = 0;
  for (const auto& [k, r] : s.records) {
    const auto [queue, time] = s.QueueOfLocked(*r);
    const EvictionQueues<Record>::Position& p = r->queued;
    if (r->queue != queue || p.time != time || p.order != r->order || p.key != &k ||
        p.item != r.get() || !s.queues.Contains(queue, p) || !s.by_expiry.contains(r.get())) {
      return false;
    }
    if (queue == Impl::kShadowQueue) shadow_bytes += r->meta.extent_bytes;
  }
  return s.queues.size() == s.records.size() && s.by_expiry.size() == s.records.size() &&
         s.shadow_bytes == shadow_bytes;
}

void SsdTier::FailNextSubmitsForTesting(int rc) {
  std::lock_guard lock(impl_->rings_mu);
  for (const std::unique_ptr<UringRing>& r : impl_->rings) r->FailSubmitsForTesting(rc, 1);
}

}  // namespace strata

// The SSD tier (DESIGN §4, §5): payloads in O_DIRECT data files driven by
// io_uring, indexed in RocksDB.
//
// Durability order: a payload's bytes are written and (by default)
// fdatasync'ed before the index entry that points at them is written, and an
// extent is reused only after the index entry that pointed at it is durably
// gone. So after a crash the index names only complete payloads; every read
// is still checked against the payload checksum, and a mismatch drops the
// entry and reads as a miss.
//
// Thread-safe. Each batch runs on the calling thread over one of a few
// io_uring instances (registered files and buffers), with up to queue_depth
// I/Os in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/chain_key.h"
#include "strata/clock.h"
#include "strata/layout.h"
#include "strata/metrics.h"
#include "strata/ssd_options.h"
#include "strata/status.h"

namespace strata {

// Identity of one SSD entry.
struct SsdKey {
  std::string ns;
  ModelId model_id;
  ChainKey chain;
  StateKind kind = StateKind::kGlobalKv;
};

// Where an SsdTier::List page starts: just past this chain key and kind.
struct SsdListCursor {
  ChainKey chain;
  StateKind kind = StateKind::kGlobalKv;
};

// What the index records about one entry.
struct SsdEntryMeta {
  uint32_t file = 0;
  uint64_t offset = 0;          // in the data file, 4 KiB aligned
  uint64_t extent_bytes = 0;    // SsdIoBytes(payload_bytes)
  uint64_t payload_bytes = 0;   // exact
  uint64_t data_checksum = 0;   // Checksum64 of the payload bytes, bound to the key
  uint64_t entry_checksum = 0;  // the store's entry checksum (layout.h)
  uint32_t layout_id = 0;
  uint16_t layout_version = kPayloadFormatVersion;
  Nanos commit_time = 0;  // tier clock
  Nanos expiry = 0;
  Nanos last_access = 0;  // coarse
};

struct SsdListPage {
  std::vector<std::pair<SsdKey, SsdEntryMeta>> entries;
  bool more = false;  // entries may follow: List again from the last one
};

// What SsdTier::Touch records.
enum class SsdTouch : uint8_t {
  kUse,    // a match found the entry on this tier (it is being promoted)
  kRenew,  // the block just left the DRAM tier: from now on the SSD copy is the one that counts
};

struct SsdWrite {
  SsdKey key;
  std::span<const std::byte> payload;
  uint64_t entry_checksum = 0;
  uint32_t layout_id = 0;
  // Bytes readable from payload.data(). A 4 KiB-aligned payload with at
  // least SsdIoBytes(payload) readable is written in place (the padding goes
  // to disk as is); anything else goes through a bounce buffer.
  uint64_t readable_bytes = 0;
  // When the entry was committed (tier clock), which a copy keeps; 0: the
  // time of this write.
  Nanos commit_time = 0;
  // Checksum64 of payload, taken by a caller before it checked the bytes
  // (the copy then vouches for what was checked); absent, the tier takes
  // it before any I/O. Reads verify it.
  std::optional<uint64_t> data_checksum = std::nullopt;
};

struct SsdRead {
  SsdKey key;
  // At least the payload size. A 4 KiB-aligned buffer of at least
  // SsdIoBytes(payload) is read into directly; anything else via a bounce
  // buffer.
  std::span<std::byte> dst;
};

class SsdTier {
 public:
  static Result<std::unique_ptr<SsdTier>> Open(SsdTierOptions options);
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  // Writes a batch: data, sync, then one index batch. Entries already stored
  // are skipped (idempotent). Per-entry results; UNAVAILABLE while writes are
  // stopped by an earlier disk-full, I/O or index error, or when the batch
  // would leave less than min_free_bytes free; RESOURCE_EXHAUSTED when
  // nothing can be evicted to make room.
  std::vector<Status> WriteBatch(std::span<const SsdWrite> writes);
  Status Write(const SsdWrite& write);

  // Reads and verifies a batch. NOT_FOUND for a miss (a checksum mismatch, a
  // short read or a media error (EIO, ENODATA, EILSEQ) drops the entry and
  // also reads as NOT_FOUND, counted in metrics). UNAVAILABLE for an error
  // that says nothing about the bytes (a failed ring, EAGAIN, ENOMEM): the
  // entry stays.
  std::vector<Status> ReadBatch(std::span<const SsdRead> reads);
  Status Read(const SsdRead& read);

  // Index lookup; no I/O. Expired entries are misses.
  std::optional<SsdEntryMeta> Lookup(const SsdKey& key) const;
  bool Contains(const SsdKey& key) const { return Lookup(key).has_value(); }
  // Records a use or a renewal (for eviction order) without reading.
  // `earlier_uses`: how often the tier above used the block (a hint for the
  // deadline policy's class). Never waits for the tier's lock: queued,
  // applied before the eviction order is next read.
  void Touch(const SsdKey& key, SsdTouch what = SsdTouch::kUse, uint32_t earlier_uses = 0);
  // Out of memory at once. UNAVAILABLE if the index cannot record the delete
  // yet: it is retried when the index recovers (and at close), and until it
  // is durable, erasing the key again also returns UNAVAILABLE.
  Status Erase(const SsdKey& key);
  // A page of namespace `ns`'s unexpired entries for admin calls, in
  // (chain key, kind, model) order, from just past `after` (the start
  // without it): at most `limit`, unless the last (chain key, kind) has
  // entries under several models, which are all on the page, so a cursor
  // without a model never splits them. `more`: entries may follow the last
  // one. No I/O, and no scan of the tier: the in-memory index is ordered,
  // so a page is a merge of one range per model the namespace stored,
  // O(models x (log entries + limit)) under the tier's lock, plus any
  // expired entries not swept yet that it steps over. Times are on the
  // tier's clock, see Now().
  SsdListPage List(std::string_view ns, const std::optional<SsdListCursor>& after,
                   size_t limit) const;
  // The unexpired entries of `ns` under this chain key and kind, whatever
  // their model (admin calls name no model; a chain key is derived from one,
  // so there is at most one in practice). Index lookups, one per model the
  // namespace ever stored: no scan, however many entries the tier holds.
  std::vector<std::pair<SsdKey, SsdEntryMeta>> Find(std::string_view ns, const ChainKey& chain,
                                                    StateKind kind) const;
  Nanos Now() const;

  // TTL expiry, then eviction down to the low watermark if above the high
  // one. Returns how many entries went.
  uint64_t RunMaintenance();

  SsdTierStats Stats() const;
  const SsdTierOptions& options() const;
  // Test hooks: where an entry's bytes live on disk; every io_uring ring's
  // next submission fails with `rc` (a ring-level failure: the ring breaks
  // and is replaced when released). Call with no I/O in flight.
  std::string DataFilePathForTesting(uint32_t file) const;
  void FailNextSubmitsForTesting(int rc);
  // Test hook: whether the eviction order (kept as entries change, not
  // sorted at eviction time) holds every entry where it ranks now.
  bool EvictionOrderConsistentForTesting() const;

 private:
  struct Impl;
  explicit SsdTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata

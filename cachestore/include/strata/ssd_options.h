// Options and statistics of the SSD tier (DESIGN §4, §5), part of
// CacheStoreOptions and CacheStoreStats. The tier itself is internal
// (cachestore/src/ssd/ssd_tier.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "strata/clock.h"
#include "strata/metrics.h"
#include "strata/status.h"

namespace strata {

// Alignment of every extent, offset and I/O length (O_DIRECT).
constexpr uint64_t kSsdBlockBytes = 4096;
constexpr uint64_t SsdIoBytes(uint64_t payload_bytes) {
  return (payload_bytes + kSsdBlockBytes - 1) / kSsdBlockBytes * kSsdBlockBytes;
}
// The largest entry the tier takes (and trusts in its index on open).
constexpr uint64_t kMaxSsdPayloadBytes = uint64_t{1} << 30;

struct SsdTierOptions {
  std::string dir;                        // data files live here, and the index by default
  std::string index_dir;                  // the RocksDB index; default <dir>/index
  uint64_t capacity_bytes = 64ull << 30;  // over all data files
  uint32_t data_files = 1;                // data-0.bin ... spread round-robin
  uint32_t queue_depth = 32;              // I/Os in flight per batch
  uint32_t rings = 4;                     // batches that can run at once
  uint64_t io_buffer_bytes = 256 << 10;   // each registered bounce buffer
  double high_watermark = 0.95;           // eviction starts above high x capacity
  double low_watermark = 0.85;            // ... and stops below low x capacity
  Nanos ttl = Hours(72);
  // Eviction order: "lru" (least recently used first) or "deadline" (per
  // use-count class holding times learned from reuse distances, as the DRAM
  // tier's policy of that name; docs/eviction-policy.md). The learned state
  // lives in memory only: after a restart the tier learns again.
  std::string eviction_policy = "lru";
  // fdatasync the data before the index points at it, and sync the index
  // write. Off trades crash safety for speed (checksums still catch tears).
  bool sync = true;
  // After a disk-full or I/O error writes stop for this long, then retry. A
  // failed index write stops index writes (and so writes, eviction and
  // deletes) as long; the index is then reopened and the deletes it missed
  // are retried.
  Nanos write_retry_interval = Seconds(30);
  // A write batch is refused (and writes stop) unless the file system would
  // keep this much free after it: the data files are sparse, so a batch
  // consumes space for the extents it writes for the first time, and the
  // index (RocksDB, same file system) needs room.
  uint64_t min_free_bytes = 64ull << 20;
  // Last-access times are persisted at most this often per entry.
  Nanos access_persist_interval = Minutes(10);
  // Default: the wall clock, so TTLs survive a reboot.
  const Clock* clock = nullptr;
  MetricsRegistry* metrics = nullptr;  // default: the tier's own registry
  // Fault injection for tests: runs after a batch's data is durable and
  // before its index entries are written.
  std::function<void()> before_index_write_hook;
  // Fault injection for tests: runs when entries taken out of memory
  // (erased, evicted) are about to be deleted from the index; an error is
  // taken as the index's own.
  std::function<Status()> before_index_delete_hook;
  // Fault injection for tests: runs (under the index lock: it must not call
  // the tier) before each index put, a batch's entries or an access-time
  // hint; an error is taken as the index's own.
  std::function<Status()> before_index_put_hook;
  // Fault injection for tests: runs (under the index lock, as above) after
  // a batch's index put succeeded; an error fails the put after the fact,
  // as a failed sync of a write that reached RocksDB's log would.
  std::function<Status()> after_index_put_hook;
  // Test hook: runs once a batch has passed the free-space check, before
  // any of its data is written.
  std::function<void()> before_data_write_hook;
};

struct SsdTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // extents of indexed entries
  uint64_t entries = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t write_failures = 0;  // batches failed by I/O errors or a full disk
  uint64_t checksum_failures = 0;
  uint64_t evictions = 0;
  uint64_t ttl_expired = 0;
  bool writes_enabled = true;
};

}  // namespace strata

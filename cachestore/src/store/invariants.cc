// CheckInvariantsForTesting: walks every structure and checks it.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

Status CacheStore::CheckInvariantsForTesting() const {
  const Impl& s = *impl_;
  MutexLock lock(s.structure_mu);
  if (s.scan_starts.empty() && !s.demoted.empty()) {
    return Internal("entries that left DRAM are still logged with no SSD scan running");
  }
  uint64_t extents = 0, extent_bytes = 0, payload = 0, reserved = 0;
  uint64_t reserved_bytes = 0;
  uint64_t committed[2] = {0, 0};
  std::unordered_map<uint32_t, int64_t> lease_pinned;  // by namespace
  const Nanos now = s.clock->Now();
  for (uint32_t i = 0; i <= s.shard_mask; ++i) {
    ReaderLock slock(s.shards[i].mu);
    for (const auto& [k, e] : s.shards[i].map) {
      if (!(e->key == k)) return Internal("index key differs from entry key");
      if (e->leases.load() != 0) lease_pinned[k.ns] += static_cast<int64_t>(e->extent.length);
      ++extents;
      extent_bytes += e->extent.length;
      payload += e->payload_bytes;
      switch (e->state.load()) {
        case EntryState::kReserved:
          ++reserved;
          reserved_bytes += e->extent.length;
          if (e->in_policy || e->in_ttl) return Internal("reserved entry is evictable");
          break;
        case EntryState::kDeleting:
          return Internal("deleting entry still indexed");
        case EntryState::kCommitted:
          ++committed[static_cast<int>(k.kind) - 1];
          if (!e->in_policy || !e->in_ttl) return Internal("committed entry not tracked");
          if (e->parent != nullptr && e->parent->state.load() != EntryState::kCommitted) {
            return Internal("committed entry under a parent that is not committed");
          }
          if (e->leases.load() == 0 && e->readers.load() == 0 && e->first_child == nullptr &&
              e->pinned_until.load() <= now && !s.Evictable(*e, now)) {
            return Internal("unpinned leaf is not evictable");
          }
          break;
      }
    }
  }
  uint64_t deleting_keyed = 0;
  for (const auto& [k, n] : s.deleting_keys) deleting_keyed += n;
  if (deleting_keyed != s.deleting.size()) return Internal("deleting keys drifted");
  for (const Entry* e : s.deleting) {
    if (e->state.load() != EntryState::kDeleting) {
      return Internal("deleting set holds a live entry");
    }
    if (!s.deleting_keys.contains(e->key)) return Internal("deleting entry's key not counted");
    if (e->in_policy || e->in_ttl || e->parent || e->first_child) {
      return Internal("deleting entry still linked");
    }
    if (e->leases.load() == 0 && e->readers.load() == 0) {
      return Internal("deleting entry with no pins was not reclaimed");
    }
    if (e->leases.load() != 0) lease_pinned[e->key.ns] += static_cast<int64_t>(e->extent.length);
    ++extents;
    extent_bytes += e->extent.length;
    payload += e->payload_bytes;
  }
  if (extents != s.pool.live()) return Internal("pool and index disagree on entry count");
  if (extent_bytes != s.arena->used_bytes()) {
    return Internal("arena occupancy " + std::to_string(s.arena->used_bytes()) +
                    " != sum of live extents " + std::to_string(extent_bytes));
  }
  if (extents != s.arena->allocated_extents()) return Internal("arena extent count differs");
  if (!s.arena->CheckConsistency()) return Internal("arena allocator inconsistent");
  if (payload != s.payload_bytes.load()) return Internal("payload byte count drifted");
  if (reserved != s.reserved_entries || reserved_bytes != s.reserved_bytes) {
    return Internal("reserved/deleting counts drifted");
  }
  if (static_cast<int64_t>(committed[0]) != s.m.entries_global->Value() ||
      static_cast<int64_t>(committed[1]) != s.m.entries_swa->Value()) {
    return Internal("entry gauges drifted");
  }
  ReaderLock ns_lock(s.ns_mu);
  for (uint32_t ns = 0; ns < s.ns_lease_pinned.size(); ++ns) {
    if (s.ns_lease_pinned[ns].load() != lease_pinned[ns]) {
      return Internal("namespace '" + s.ns_names[ns] + "': its read leases pin " +
                      std::to_string(lease_pinned[ns]) + " bytes, counted " +
                      std::to_string(s.ns_lease_pinned[ns].load()));
    }
  }
  return Status::Ok();
}

}  // namespace strata

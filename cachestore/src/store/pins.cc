// Pins and leases on entries: unpinning, reclaiming, ending a lease.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

void CacheStore::Impl::MaybeReclaim(const EntryRef& ref) {
  Entry* e = ref.entry;
  if (e->state.load() != EntryState::kDeleting) return;
  MutexLock lock(structure_mu);
  if (e->generation != ref.generation || e->state.load() != EntryState::kDeleting) return;
  EraseIfUnpinned(e);
}

void CacheStore::Impl::Unpin(const EntryRef& ref, bool lease) {
  Entry* e = ref.entry;
  bool deleting;
  {
    Shard& shard = ShardFor(e->key);
    ReaderLock lock(shard.mu);
    if (!lease) {
      e->readers.fetch_sub(1);
    } else if (e->leases.fetch_sub(1) == 1) {
      e->ns_lease_pinned_bytes->fetch_sub(static_cast<int64_t>(e->extent.length));
    }
    deleting = e->state.load() == EntryState::kDeleting;
  }
  if (deleting) MaybeReclaim(ref);
}

void CacheStore::Impl::EndLease(LeaseRecord& rec, bool expired) {
  if (rec.write) {
    m.leases_live_write->Add(-1);
    if (expired) m.leases_expired_write->Increment();
    MutexLock lock(structure_mu);
    for (const EntryRef& ref : rec.entries) {
      if (ref.entry->generation == ref.generation &&
          ref.entry->state.load() == EntryState::kReserved) {
        EraseReserved(ref.entry);
      }
    }
    return;
  }
  m.leases_live_read->Add(-1);
  if (expired) m.leases_expired_read->Increment();
  for (const EntryRef& ref : rec.entries) Unpin(ref, /*lease=*/true);
}

}  // namespace strata

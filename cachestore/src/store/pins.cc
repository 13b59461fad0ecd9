// Pins and leases on entries: unpinning, reclaiming, ending a lease; checking
// a block before it is reserved.
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

Status CacheStore::Impl::ValidateCommitBlock(const CommitBlock& b,
                                             const Layout** layout_out) const {
  const Layout* layout = FindLayout(b.layout_id);
  if (layout == nullptr) {
    return InvalidArgument("unknown layout id " + std::to_string(b.layout_id));
  }
  if (layout->kind != b.kind) {
    return InvalidArgument("layout " + std::to_string(b.layout_id) + " is for " +
                           std::string(StateKindName(layout->kind)) + ", block is " +
                           std::string(StateKindName(b.kind)));
  }
  if (b.payload_bytes == 0 || b.payload_bytes > kMaxPayloadBytes ||
      b.payload_bytes != layout->PayloadBytes()) {
    return InvalidArgument("payload of " + std::to_string(b.payload_bytes) + " bytes; layout " +
                           std::to_string(layout->id) + " needs " +
                           std::to_string(layout->PayloadBytes()));
  }
  if (b.kind == StateKind::kSwaState && b.parent.has_value()) {
    return InvalidArgument("SWA_STATE entries have no parent");
  }
  *layout_out = layout;
  return Status::Ok();
}

}  // namespace strata

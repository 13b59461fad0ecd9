// The entry tree and eviction: TTL queues, prefix links, erasing entries and
// subtrees, choosing victims, allocating under the watermarks.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

void CacheStore::Impl::TtlUnlink(Entry* e) {
  if (!e->in_ttl) return;
  const int q = static_cast<int>(e->key.kind) - 1;
  (e->ttl_prev ? e->ttl_prev->ttl_next : ttl_head[q]) = e->ttl_next;
  (e->ttl_next ? e->ttl_next->ttl_prev : ttl_tail[q]) = e->ttl_prev;
  e->ttl_prev = e->ttl_next = nullptr;
  e->in_ttl = false;
}

void CacheStore::Impl::TtlAppend(Entry* e) {
  const int q = static_cast<int>(e->key.kind) - 1;
  e->ttl_prev = ttl_tail[q];
  e->ttl_next = nullptr;
  (ttl_tail[q] ? ttl_tail[q]->ttl_next : ttl_head[q]) = e;
  ttl_tail[q] = e;
  e->in_ttl = true;
}

void CacheStore::Impl::TreeLink(Entry* child, Entry* parent) {
  child->parent = parent;
  child->prev_sibling = nullptr;
  child->next_sibling = parent->first_child;
  if (parent->first_child) parent->first_child->prev_sibling = child;
  parent->first_child = child;
}

void CacheStore::Impl::TreeUnlink(Entry* e) {
  if (e->parent == nullptr) return;
  (e->prev_sibling ? e->prev_sibling->next_sibling : e->parent->first_child) = e->next_sibling;
  if (e->next_sibling) e->next_sibling->prev_sibling = e->prev_sibling;
  e->parent = e->prev_sibling = e->next_sibling = nullptr;
}

void CacheStore::Impl::CountEviction(EvictReason reason, uint32_t ns) {
  const auto r = static_cast<size_t>(reason);
  evictions[r].fetch_add(1);
  m.evictions[r]->Increment();
  CountersOf(ns).evictions[r].fetch_add(1, std::memory_order_relaxed);
}

void CacheStore::Impl::CountEntry(const Entry* e, int delta) {
  const bool global = e->key.kind == StateKind::kGlobalKv;
  (global ? m.entries_global : m.entries_swa)->Add(delta);
  NamespaceCounters& c = CountersOf(e->key.ns);
  (global ? c.global_kv_entries : c.swa_entries).fetch_add(delta, std::memory_order_relaxed);
  c.used_bytes.fetch_add(delta * static_cast<int64_t>(e->extent.length), std::memory_order_relaxed);
}

void CacheStore::Impl::EraseEntry(Entry* e) {
  {
    Shard& shard = ShardFor(e->key);
    WriterLock lock(shard.mu);
    Unindex(shard, e);
  }
  ForgetUnindexed(e);
}

void CacheStore::Impl::MarkDeleting(Shard& shard, Entry* e) {
  shard.map.erase(e->key);
  e->state.store(EntryState::kDeleting);
  deleting.insert(e);
  ++deleting_keys[e->key];
}

void CacheStore::Impl::EraseReserved(Entry* e) {
  {
    Shard& shard = ShardFor(e->key);
    WriterLock lock(shard.mu);
    if (e->readers.load() != 0) {
      MarkDeleting(shard, e);
      --reserved_entries;
      reserved_bytes -= e->extent.length;
      return;
    }
    shard.map.erase(e->key);
  }
  ForgetUnindexed(e);
}

bool CacheStore::Impl::EraseIfUnpinned(Entry* e) {
  {
    Shard& shard = ShardFor(e->key);
    WriterLock lock(shard.mu);
    if (e->leases.load() != 0 || e->readers.load() != 0) return false;
    Unindex(shard, e);
  }
  ForgetUnindexed(e);
  return true;
}

void CacheStore::Impl::ForgetUnindexed(Entry* e) {
  if (e->pinned_until.load() != 0) leases.DropPin(e);  // deleted while an admin pinned it
  const EntryState state = e->state.load();
  if (state == EntryState::kCommitted) CountEntry(e, -1);
  if (state == EntryState::kReserved) {
    --reserved_entries;
    reserved_bytes -= e->extent.length;
  }
  if (state == EntryState::kDeleting) {
    deleting.erase(e);
    auto it = deleting_keys.find(e->key);
    if (--it->second == 0) deleting_keys.erase(it);
  }
  policy->OnErase(e);
  TtlUnlink(e);
  TreeUnlink(e);
  payload_bytes.fetch_sub(e->payload_bytes);
  arena->Free(e->extent);
  m.used_bytes->Set(static_cast<int64_t>(arena->used_bytes()));
  pool.Release(e);
}

void CacheStore::Impl::DeleteLeaf(Entry* e, EvictReason reason) {
  // An explicit delete erases the SSD copy too; the others leave it.
  if (reason != EvictReason::kExplicit) LogLeftDram(e->key);
  TreeUnlink(e);
  policy->OnErase(e);
  TtlUnlink(e);
  CountEviction(reason, e->key.ns);
  Shard& shard = ShardFor(e->key);
  WriterLock lock(shard.mu);
  if (e->leases.load() != 0 || e->readers.load() != 0) {
    // Pinned: invisible from now on, freed by the last Unpin.
    if (e->state.load() == EntryState::kCommitted) {
      MarkDeleting(shard, e);
      CountEntry(e, -1);
    }
    return;
  }
  shard.map.erase(e->key);
  lock.Unlock();
  ForgetUnindexed(e);
}

uint64_t CacheStore::Impl::DeleteSubtree(Entry* root, EvictReason reason) {
  uint64_t n = 0;
  Entry* e = root;
  while (true) {
    while (e->first_child != nullptr) e = e->first_child;
    Entry* up = e == root ? nullptr : e->parent;
    DeleteLeaf(e, reason);
    ++n;
    if (up == nullptr) return n;
    e = up;
  }
}

bool CacheStore::Impl::Evictable(const Entry& e, Nanos now) const {
  return e.state.load() == EntryState::kCommitted && e.leases.load() == 0 &&
         e.readers.load() == 0 && e.first_child == nullptr && e.pinned_until.load() <= now;
}

bool CacheStore::Impl::EvictOne(EvictReason reason, Nanos now, uint64_t incoming_bytes,
                                std::span<const Entry* const> keep,
                                std::optional<TenantSharePolicy::Room> room) {
  auto evictable = [&](const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu) {
    return Evictable(e, now) && !std::binary_search(keep.begin(), keep.end(), &e);
  };
  Entry* victim =
      shares != nullptr
          ? shares->PickVictimFor(room, evictable, kMaxVictimScan, reserved_bytes + incoming_bytes)
          : policy->PickVictim(evictable, kMaxVictimScan, reserved_bytes + incoming_bytes);
  if (victim == nullptr) return false;
  const EntryKey key = victim->key;
  const ModelId model = victim->model_id;
  const auto hits = static_cast<uint32_t>(
      std::min<uint64_t>(victim->hits.load(std::memory_order_relaxed), UINT32_MAX));
  // A reader may have pinned it since PickVictim looked.
  if (!EraseIfUnpinned(victim)) {
    policy->OnAccess(victim);
    return true;  // not evicted, but progress: try the next one
  }
  // Leaving DRAM renews the SSD copy: hits served from DRAM never reach
  // it, so it would otherwise age from its write and be evicted first
  // exactly when the block was hot. For the SSD tier's deadline policy
  // this starts the copy's holding time, classed by the DRAM hits.
  if (SsdAdmits(key.kind)) {
    ssd->Touch(SsdKeyOf(key, model), SsdTouch::kRenew, hits);
    LogLeftDram(key);
  }
  CountEviction(reason, key.ns);
  return true;
}

uint64_t CacheStore::Impl::EvictToWatermark(Nanos now, std::span<const Entry* const> keep) {
  const uint64_t cap = arena->capacity_bytes();
  if (arena->used_bytes() <= static_cast<uint64_t>(opts.high_watermark * cap)) return 0;
  const uint64_t target = static_cast<uint64_t>(opts.low_watermark * cap);
  uint64_t n = 0;
  while (arena->used_bytes() > target && EvictOne(EvictReason::kWatermark, now, 0, keep)) {
    ++n;
  }
  return n;
}

std::optional<Extent> CacheStore::Impl::AllocateExtent(uint64_t bytes, Nanos now,
                                                       TenantSharePolicy::Room room,
                                                       std::span<const Entry* const> keep) {
  room.bytes += bytes;
  for (size_t attempt = 0; attempt < kMaxVictimScan; ++attempt) {
    if (auto extent = arena->Allocate(bytes)) return extent;
    if (!EvictOne(EvictReason::kCapacity, now, bytes, keep, room)) break;
  }
  return std::nullopt;
}

std::string CacheStore::Impl::NoRoom(uint64_t bytes, const TenantSharePolicy::Room& room) const {
  std::string why = "no room for " + std::to_string(bytes) + " bytes in the DRAM tier";
  if (shares != nullptr && shares->PassesShare({room.ns, room.bytes + bytes})) {
    return why + ": the namespace has its share (" + std::to_string(shares->share_bytes()) +
           " bytes, committed_share_per_namespace) and none of its entries can be evicted "
           "now (pinned, leased or in use); other tenants' entries are theirs";
  }
  return why + " (all remaining entries are pinned, leased or in use)";
}

}  // namespace strata

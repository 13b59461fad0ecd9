#include "eviction/tenant_share_policy.h"

#include <algorithm>

namespace strata {

TenantSharePolicy::TenantSharePolicy(std::unique_ptr<EvictionPolicy> inner, uint64_t share_bytes)
    : inner_(std::move(inner)), share_bytes_(share_bytes) {}

TenantSharePolicy::NamespaceList& TenantSharePolicy::ListOf(uint32_t ns) {
  if (ns >= lists_.size()) lists_.resize(ns + 1);
  return lists_[ns];
}

void TenantSharePolicy::OnInsert(Entry* e) {
  inner_->OnInsert(e);
  ListOf(e->key.ns).PushFront(e);
  e->in_ns_list = true;
}

void TenantSharePolicy::OnAccess(Entry* e) {
  inner_->OnAccess(e);
  if (e->in_ns_list) ListOf(e->key.ns).MoveToFront(e);
}

void TenantSharePolicy::OnHit(Entry* e) {
  inner_->OnHit(e);
  if (e->in_ns_list) ListOf(e->key.ns).MoveToFront(e);
}

void TenantSharePolicy::OnErase(Entry* e) {
  inner_->OnErase(e);
  if (!e->in_ns_list) return;
  ListOf(e->key.ns).Unlink(e);
  e->in_ns_list = false;
}

Entry* TenantSharePolicy::PickVictim(absl::FunctionRef<bool(const Entry&)> evictable,
                                     size_t max_scan, uint64_t incoming_bytes) {
  return PickVictimFor(std::nullopt, evictable, max_scan, incoming_bytes);
}

Entry* TenantSharePolicy::PickVictimFor(std::optional<Room> room,
                                        absl::FunctionRef<bool(const Entry&)> evictable,
                                        size_t max_scan, uint64_t incoming_bytes) {
  const bool passes = room.has_value() && PassesShare(*room);
  if (passes) {
    if (Entry* own = PickFrom(room->ns, evictable, max_scan, incoming_bytes)) return own;
  }
  const std::vector<uint32_t> over = OverShare();
  for (uint32_t other : over) {
    if (passes && other == room->ns) continue;  // looked at already
    if (Entry* e = PickFrom(other, evictable, max_scan, incoming_bytes)) return e;
  }
  // The watermark is kept by those past their share while there are any.
  if (passes || (!room.has_value() && !over.empty())) return nullptr;
  return inner_->PickVictim(evictable, max_scan, incoming_bytes);
}

Entry* TenantSharePolicy::PickFrom(uint32_t ns, absl::FunctionRef<bool(const Entry&)> evictable,
                                   size_t max_scan, uint64_t incoming_bytes) {
  Entry* e = inner_->PickVictim(
      [&](const Entry& candidate) { return candidate.key.ns == ns && evictable(candidate); },
      max_scan, incoming_bytes);
  return e != nullptr ? e : ListOf(ns).FindFromTail(evictable, max_scan, /*descend=*/true);
}

uint64_t TenantSharePolicy::BytesOf(uint32_t ns) const {
  return ns < lists_.size() ? lists_[ns].bytes : 0;
}

std::vector<uint32_t> TenantSharePolicy::OverShare() const {
  std::vector<uint32_t> over;
  for (uint32_t ns = 0; ns < lists_.size(); ++ns) {
    if (lists_[ns].bytes > share_bytes_) over.push_back(ns);
  }
  std::sort(over.begin(), over.end(),
            [&](uint32_t a, uint32_t b) { return lists_[a].bytes > lists_[b].bytes; });
  return over;
}

}  // namespace strata

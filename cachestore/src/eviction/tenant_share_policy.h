// Per-tenant shares of committed bytes in the DRAM tier (docs/security.md,
// "Tenants"). Wraps the tier's eviction policy and keeps one recency list
// per namespace beside it, so that room is made fairly:
//  - for a namespace that is (or would be) over its share: from its own
//    entries first, so a tenant committing a lot evicts itself, not others;
//  - otherwise, and for the watermark: from the namespaces over their
//    share, the one furthest over first;
//  - only then, the wrapped policy's choice among everyone's entries; for
//    the watermark, only when no namespace is over its share (room for a
//    tenant within its share may come from anyone's).
// A namespace past its share that can evict none of its own (all leased or
// pinned) gets no room: the others' entries stay.
// Within one namespace the wrapped policy's order holds as far as its scan
// reaches (so one tenant alone past its share evicts exactly as the policy
// would); past that, as when a tenant's entries are all new, the
// namespace's own LRU list (root-last touches keep it prefix-safe). All
// calls happen under the store's structure lock.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "eviction/eviction_policy.h"

namespace strata {

class TenantSharePolicy final : public EvictionPolicy {
 public:
  // `share_bytes`: the committed bytes of the tier each namespace is owed.
  TenantSharePolicy(std::unique_ptr<EvictionPolicy> inner, uint64_t share_bytes);

  std::string_view name() const override { return inner_->name(); }
  void OnInsert(Entry* e) override;
  void OnAccess(Entry* e) override;
  void OnHit(Entry* e) override;
  void OnErase(Entry* e) override;
  // With no namespace to make room for: PickVictimFor(nullopt, ...).
  Entry* PickVictim(absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                    uint64_t incoming_bytes) override;

  // Room being made for `bytes` more of namespace `ns`.
  struct Room {
    uint32_t ns = 0;
    uint64_t bytes = 0;
  };
  // The victim that makes `room` (none: the watermark's eviction); nullptr
  // when none may go, which for a namespace that would pass its share means
  // none of its own and none of those over theirs: the others' entries
  // stay. `incoming_bytes` is the wrapped policy's (PickVictim).
  Entry* PickVictimFor(std::optional<Room> room, absl::FunctionRef<bool(const Entry&)> evictable,
                       size_t max_scan, uint64_t incoming_bytes);

  // Whether `room` would take its namespace past its share.
  bool PassesShare(const Room& room) const { return BytesOf(room.ns) + room.bytes > share_bytes_; }
  uint64_t share_bytes() const { return share_bytes_; }
  // Committed bytes of namespace `ns` on the tier.
  uint64_t BytesOf(uint32_t ns) const;

 private:
  using NamespaceList = IntrusiveEntryList<&Entry::ns_prev, &Entry::ns_next>;

  NamespaceList& ListOf(uint32_t ns);
  // A victim of namespace `ns`: the wrapped policy's, else its list's.
  Entry* PickFrom(uint32_t ns, absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                  uint64_t incoming_bytes);
  // Namespaces over their share, the furthest over first.
  std::vector<uint32_t> OverShare() const;

  std::unique_ptr<EvictionPolicy> inner_;
  const uint64_t share_bytes_;
  std::vector<NamespaceList> lists_;  // by namespace id
};

}  // namespace strata

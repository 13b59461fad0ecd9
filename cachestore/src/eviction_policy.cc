#include "eviction_policy.h"

namespace strata {

void EntryList::PushFront(Entry* e) {
  e->policy_prev = nullptr;
  e->policy_next = head;
  if (head != nullptr) head->policy_prev = e;
  head = e;
  if (tail == nullptr) tail = e;
  bytes += e->extent.length;
  ++count;
}

void EntryList::Unlink(Entry* e) {
  (e->policy_prev != nullptr ? e->policy_prev->policy_next : head) = e->policy_next;
  (e->policy_next != nullptr ? e->policy_next->policy_prev : tail) = e->policy_prev;
  e->policy_prev = e->policy_next = nullptr;
  bytes -= e->extent.length;
  --count;
}

Entry* EntryList::FindFromTail(absl::FunctionRef<bool(const Entry&)> ok, size_t max_scan,
                               bool descend) const {
  size_t scanned = 0;
  for (Entry* e = tail; e != nullptr && scanned < max_scan; e = e->policy_prev, ++scanned) {
    if (ok(*e)) return e;
    if (descend && e->first_child != nullptr) {
      // Not counted against max_scan: the walk is bounded by the chain's
      // depth, and skipping it could leave only non-leaves in reach.
      Entry* leaf = e;
      while (leaf->first_child != nullptr) leaf = leaf->first_child;
      if (ok(*leaf)) return leaf;
    }
  }
  return nullptr;
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           uint64_t capacity_bytes) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "aslru") return MakeAdaptiveSlruPolicy(capacity_bytes);
  if (name == "deadline") return MakeReuseDeadlinePolicy(capacity_bytes);
  return InvalidArgument("unknown eviction policy '" + std::string(name) +
                         "' (known: lru, aslru, deadline)");
}

}  // namespace strata

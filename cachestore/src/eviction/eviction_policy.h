// Eviction policies for a tier (DESIGN §5). A policy orders entries; the
// store decides what may go (never a leased, read-in-progress, pinned or
// reserved entry, never a block that still has a descendant on this node).
// All calls happen under the store's structure lock.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "eviction/entry.h"
#include "strata/status.h"

namespace strata {

// A doubly linked list threaded through an Entry's `kPrev`/`kNext` links:
// most recent at head, least recent at tail. An entry is on at most one
// list per pair of links.
template <Entry* Entry::*kPrev, Entry* Entry::*kNext>
struct IntrusiveEntryList {
  Entry* head = nullptr;
  Entry* tail = nullptr;
  uint64_t bytes = 0;  // arena bytes (extent lengths), the unit of the tier's capacity
  uint64_t count = 0;

  void PushFront(Entry* e) {
    e->*kPrev = nullptr;
    e->*kNext = head;
    if (head != nullptr) head->*kPrev = e;
    head = e;
    if (tail == nullptr) tail = e;
    bytes += e->extent.length;
    ++count;
  }
  void Unlink(Entry* e) {
    (e->*kPrev != nullptr ? e->*kPrev->*kNext : head) = e->*kNext;
    (e->*kNext != nullptr ? e->*kNext->*kPrev : tail) = e->*kPrev;
    e->*kPrev = e->*kNext = nullptr;
    bytes -= e->extent.length;
    --count;
  }
  void MoveToFront(Entry* e) {
    Unlink(e);
    PushFront(e);
  }
  // The first entry from the tail for which `ok` holds, within `max_scan`.
  // With `descend`, an entry that only fails because it has descendants
  // stands for its chain: its deepest first-child descendant is tried, so
  // an old chain is trimmed from its end rather than skipped.
  Entry* FindFromTail(absl::FunctionRef<bool(const Entry&)> ok, size_t max_scan,
                      bool descend = false) const {
    size_t scanned = 0;
    for (Entry* e = tail; e != nullptr && scanned < max_scan; e = e->*kPrev, ++scanned) {
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
};

// The list a policy keeps its entries on.
using EntryList = IntrusiveEntryList<&Entry::policy_prev, &Entry::policy_next>;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual void OnInsert(Entry* e) = 0;
  // A touch that keeps an order (an ancestor of new blocks, a victim that
  // got pinned): not a use of the entry.
  virtual void OnAccess(Entry* e) = 0;
  // A use: a match found the entry.
  virtual void OnHit(Entry* e) { OnAccess(e); }
  virtual void OnErase(Entry* e) = 0;
  // The preferred victim for which `evictable` holds, looking at no more
  // than `max_scan` candidates; nullptr when there is none. `incoming_bytes`
  // is what is being made room for (reserved, not yet inserted).
  virtual Entry* PickVictim(absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                            uint64_t incoming_bytes) = 0;
};

// LRU over an intrusive list. Prefix-safe when accesses touch a chain
// root-last, which the store does: ancestors stay younger than descendants.
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

// Adaptive segmented LRU; see aslru_policy.cc and docs/eviction-policy.md.
std::unique_ptr<EvictionPolicy> MakeAdaptiveSlruPolicy(uint64_t capacity_bytes);

// Per-class holding times learned from reuse distances; see
// deadline_policy.cc and docs/eviction-policy.md.
std::unique_ptr<EvictionPolicy> MakeReuseDeadlinePolicy(uint64_t capacity_bytes);

// "lru", "aslru" or "deadline" for a tier of `capacity_bytes`. Unknown names are
// INVALID_ARGUMENT.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           uint64_t capacity_bytes);

}  // namespace strata

// Eviction policies for a tier (DESIGN §5). A policy orders entries; the
// store decides what may go (never a leased, read-in-progress, pinned or
// reserved entry, never a block that still has a descendant on this node).
// All calls happen under the store's structure lock.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "entry.h"
#include "strata/status.h"

namespace strata {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual void OnInsert(Entry* e) = 0;
  virtual void OnAccess(Entry* e) = 0;
  virtual void OnErase(Entry* e) = 0;
  // The preferred victim for which `evictable` holds, looking at no more
  // than `max_scan` candidates; nullptr when there is none.
  virtual Entry* PickVictim(const std::function<bool(const Entry&)>& evictable,
                            size_t max_scan) = 0;
};

// LRU over an intrusive list. Prefix-safe when accesses touch a chain
// root-last, which the store does: ancestors stay younger than descendants.
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

// "lru" -> LRU. Unknown names are INVALID_ARGUMENT.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name);

}  // namespace strata

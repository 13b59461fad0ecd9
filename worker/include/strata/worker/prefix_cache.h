// The HBM tier (DESIGN §4): a local prefix cache in the block pool. Pages
// of finished work (global KV blocks and SWA states, the very bytes the
// store holds, sealed) stay cached under their chain keys until the pool
// needs them, so the next turn of a conversation on this worker finds its
// prefix here first and asks the store only for the rest.
//
// The cache holds a reference on each of its pages. Eviction is
// prefix-safe (only a leaf goes: a block none of whose children, nor its
// SWA state, is cached), never takes a page anyone else holds (a running
// request, a fetch), and is ordered by one of the store's eviction
// policies ("lru", "aslru", "deadline"). Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "strata/chain_key.h"
#include "strata/status.h"
#include "strata/store_types.h"
#include "strata/worker/block_pool.h"

namespace strata {
struct Entry;          // eviction/entry.h
class EvictionPolicy;  // eviction/eviction_policy.h
}  // namespace strata

namespace strata::worker {

class PrefixCache {
 public:
  static Result<std::unique_ptr<PrefixCache>> Create(BlockPool& pool, std::string_view policy);
  ~PrefixCache();  // lets go of every page
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Hit {
    uint32_t page = 0;  // with a reference taken for the caller: Unref it
    uint64_t checksum = 0;
  };
  // The page cached as (kind, key), without counting a use.
  std::optional<Hit> Acquire(StateKind kind, const ChainKey& key);
  // Counts a use of a prefix: `keys` from the deepest block up (so a
  // chain's ancestors stay younger than its descendants).
  void Touch(StateKind kind, const ChainKey& key);

  // Caches `page` under (kind, key), taking a reference of its own. A
  // global block is cached only over its cached parent (block 0: no
  // parent); an SWA state only over the cached block of the same key. False
  // when it is not cached: already there, or it would hang off nothing.
  bool Insert(StateKind kind, const ChainKey& key, const std::optional<ChainKey>& parent,
              uint32_t page, uint64_t checksum);

  // Lets go of one page no one else holds, the policy's pick; false when
  // there is none.
  bool EvictOne();

  uint32_t pages() const { return static_cast<uint32_t>(slots_.size()); }
  // Pages only the cache holds: what EvictOne could free, one by one.
  uint32_t EvictablePages() const;
  uint64_t evictions() const { return evictions_; }

 private:
  struct Slot {
    std::unique_ptr<Entry> entry;
    uint32_t page = 0;
  };
  struct KeyHash {
    size_t operator()(const std::pair<StateKind, ChainKey>& k) const noexcept {
      return k.second.Prefix64() ^ static_cast<size_t>(k.first);
    }
  };
  using Key = std::pair<StateKind, ChainKey>;

  PrefixCache(BlockPool& pool, std::unique_ptr<EvictionPolicy> policy);
  Slot* Find(StateKind kind, const ChainKey& key);
  bool Evictable(const Entry& e) const;
  void Erase(const Key& key);

  BlockPool& pool_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unordered_map<Key, Slot, KeyHash> slots_;
  std::unordered_map<const Entry*, uint32_t> page_of_;  // for Evictable
  uint64_t evictions_ = 0;
};

}  // namespace strata::worker

// One stored block of one state kind, and the pool entries come from.
// Internal to the store; callers see EntryInfo.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/chain_key.h"
#include "strata/clock.h"
#include "strata/layout.h"
#include "util/extent_allocator.h"

namespace strata {

// Index identity: tenant, kind and chain key. The namespace is part of the
// key, so one tenant can never reach another's entry, even with its key.
struct EntryKey {
  uint32_t ns = 0;
  StateKind kind = StateKind::kGlobalKv;
  ChainKey chain;
  friend bool operator==(const EntryKey&, const EntryKey&) = default;
};
struct EntryKeyHash {
  size_t operator()(const EntryKey& k) const noexcept {
    return k.chain.Prefix64() ^ (uint64_t{k.ns} * 0x9E3779B97F4A7C15ull) ^ uint64_t(k.kind);
  }
};

enum class EntryState : uint8_t {
  kReserved,   // bytes being written under a write lease; invisible
  kCommitted,  // visible to match and fetch
  kDeleting,   // invisible; freed when the last lease or reader lets go
};

// Field ownership (see CacheStore's lock order):
//  - identity and bytes: written before the entry is published, then const.
//  - state, commit_time, expiry: changed under the structure lock and, once
//    the entry is indexed, its shard lock (exclusive); state is read
//    lock-free, the others under either lock (the commit path reads them
//    under the structure lock alone: IndexedUnderStructureMu).
//  - leases, readers: incremented under the shard lock (shared or exclusive)
//    or while a live lease already holds the entry; decremented lock-free.
//  - tree, policy and TTL links, generation: under the store's structure lock.
struct Entry {
  EntryKey key;
  ModelId model_id;
  uint32_t layout_id = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
  Extent extent;
  Nanos commit_time = 0;
  Nanos expiry = 0;
  // Its namespace's count of the bytes that namespace's read leases pin,
  // each entry once (the store's, set when the entry is made).
  std::atomic<int64_t>* ns_lease_pinned_bytes = nullptr;

  std::atomic<EntryState> state{EntryState::kReserved};
  std::atomic<uint32_t> leases{0};
  std::atomic<uint32_t> readers{0};
  std::atomic<Nanos> pinned_until{0};
  std::atomic<uint64_t> hits{0};

  // Bumped each time the slot is recycled, so a stale pointer is detected.
  uint64_t generation = 0;

  // Prefix tree of GLOBAL_KV blocks on this node.
  Entry* parent = nullptr;
  Entry* first_child = nullptr;
  Entry* next_sibling = nullptr;
  Entry* prev_sibling = nullptr;

  // Eviction policy bookkeeping (owned by the policy).
  Entry* policy_prev = nullptr;
  Entry* policy_next = nullptr;
  bool in_policy = false;
  uint64_t policy_aux = 0;
  // Its namespace's recency list (TenantSharePolicy, when shares are on).
  Entry* ns_prev = nullptr;
  Entry* ns_next = nullptr;
  bool in_ns_list = false;

  // TTL queue of its kind, in commit order.
  Entry* ttl_prev = nullptr;
  Entry* ttl_next = nullptr;
  bool in_ttl = false;

  Entry* pool_next = nullptr;
};

// A pointer plus the generation it was taken at.
struct EntryRef {
  Entry* entry = nullptr;
  uint64_t generation = 0;
};

// Hands out entries from chunks that are never returned to the allocator
// while the pool lives, so a stale Entry* is always safe to read and its
// generation tells whether it still names the same entry. Not thread-safe:
// used under the structure lock.
class EntryPool {
 public:
  Entry* Acquire();
  void Release(Entry* e);  // bumps the generation
  size_t live() const { return live_; }

 private:
  static constexpr size_t kChunk = 1024;
  std::vector<std::unique_ptr<Entry[]>> chunks_;
  Entry* free_ = nullptr;
  size_t live_ = 0;
};

}  // namespace strata

#include "eviction/entry.h"

namespace strata {

Entry* EntryPool::Acquire() {
  if (free_ == nullptr) {
    chunks_.push_back(std::make_unique<Entry[]>(kChunk));
    Entry* chunk = chunks_.back().get();
    for (size_t i = kChunk; i-- > 0;) {
      chunk[i].pool_next = free_;
      free_ = &chunk[i];
    }
  }
  Entry* e = free_;
  free_ = e->pool_next;
  e->pool_next = nullptr;
  ++live_;
  return e;
}

void EntryPool::Release(Entry* e) {
  const uint64_t next_generation = e->generation + 1;
  e->key = {};
  e->model_id = {};
  e->layout_id = 0;
  e->payload_bytes = 0;
  e->checksum = 0;
  e->extent = {};
  e->commit_time = e->expiry = 0;
  // Relaxed: a released entry is out of the index, and anyone still holding
  // a pointer to it re-checks the generation under structure_mu (or the
  // lease table's lock) before trusting these fields; its next owner takes
  // structure_mu before publishing it. Five sequentially consistent stores
  // were most of a release's cost.
  constexpr auto kRelaxed = std::memory_order_relaxed;
  e->state.store(EntryState::kReserved, kRelaxed);
  e->leases.store(0, kRelaxed);
  e->readers.store(0, kRelaxed);
  e->pinned_until.store(0, kRelaxed);
  e->hits.store(0, kRelaxed);
  e->generation = next_generation;
  e->parent = e->first_child = e->next_sibling = e->prev_sibling = nullptr;
  e->policy_prev = e->policy_next = nullptr;
  e->in_policy = false;
  e->policy_aux = 0;
  e->ns_prev = e->ns_next = nullptr;
  e->in_ns_list = false;
  e->ttl_prev = e->ttl_next = nullptr;
  e->in_ttl = false;
  e->pool_next = free_;
  free_ = e;
  --live_;
}

}  // namespace strata

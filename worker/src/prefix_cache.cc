#include "strata/worker/prefix_cache.h"

#include <utility>

#include "eviction/entry.h"
#include "eviction/eviction_policy.h"

namespace strata::worker {
namespace {

// Candidates a victim search looks at: enough to step past the pages that
// running requests hold, bounded so an eviction stays cheap.
constexpr size_t kMaxScan = 4096;

}  // namespace

Result<std::unique_ptr<PrefixCache>> PrefixCache::Create(BlockPool& pool, std::string_view policy) {
  Result<std::unique_ptr<EvictionPolicy>> p =
      MakeEvictionPolicy(policy, pool.page_bytes() * pool.capacity());
  if (!p.ok()) return p.status();
  return std::unique_ptr<PrefixCache>(new PrefixCache(pool, std::move(p).value()));
}

PrefixCache::PrefixCache(BlockPool& pool, std::unique_ptr<EvictionPolicy> policy)
    : pool_(pool), policy_(std::move(policy)) {}

PrefixCache::~PrefixCache() {
  for (auto& [key, slot] : slots_) {
    policy_->OnErase(slot.entry.get());
    pool_.Unref(slot.page);
  }
}

PrefixCache::Slot* PrefixCache::Find(StateKind kind, const ChainKey& key) {
  auto it = slots_.find({kind, key});
  return it == slots_.end() ? nullptr : &it->second;
}

std::optional<PrefixCache::Hit> PrefixCache::Acquire(StateKind kind, const ChainKey& key) {
  Slot* slot = Find(kind, key);
  if (slot == nullptr) return std::nullopt;
  pool_.Ref(slot->page);
  return Hit{slot->page, slot->entry->checksum};
}

void PrefixCache::Touch(StateKind kind, const ChainKey& key) {
  if (Slot* slot = Find(kind, key)) policy_->OnHit(slot->entry.get());
}

bool PrefixCache::Insert(StateKind kind, const ChainKey& key, const std::optional<ChainKey>& parent,
                         uint32_t page, uint64_t checksum) {
  if (Find(kind, key) != nullptr) return false;
  // What it hangs off: the parent block, or for an SWA state the block it
  // follows. Without it the page could never be part of a matched prefix.
  Slot* above = nullptr;
  if (kind == StateKind::kSwaState) {
    above = Find(StateKind::kGlobalKv, key);
    if (above == nullptr) return false;
  } else if (parent.has_value()) {
    above = Find(StateKind::kGlobalKv, *parent);
    if (above == nullptr) return false;
  }
  auto entry = std::make_unique<Entry>();
  entry->key = {0, kind, key};
  entry->checksum = checksum;
  entry->extent.length = pool_.page_bytes();
  if (above != nullptr) {
    Entry* p = above->entry.get();
    entry->parent = p;
    entry->next_sibling = p->first_child;
    if (p->first_child != nullptr) p->first_child->prev_sibling = entry.get();
    p->first_child = entry.get();
  }
  pool_.Ref(page);
  page_of_[entry.get()] = page;
  policy_->OnInsert(entry.get());
  slots_.emplace(Key{kind, key}, Slot{std::move(entry), page});
  return true;
}

bool PrefixCache::Evictable(const Entry& e) const {
  if (e.first_child != nullptr) return false;  // a leaf only: prefixes stay whole
  auto it = page_of_.find(&e);
  return it != page_of_.end() && pool_.RefCount(it->second) == 1;
}

bool PrefixCache::EvictOne() {
  Entry* victim = policy_->PickVictim([this](const Entry& e) { return Evictable(e); }, kMaxScan,
                                      pool_.page_bytes());
  if (victim == nullptr) return false;
  Erase({victim->key.kind, victim->key.chain});
  ++evictions_;
  return true;
}

void PrefixCache::Erase(const Key& key) {
  auto it = slots_.find(key);
  Entry* e = it->second.entry.get();
  if (Entry* p = e->parent) {  // unlink from its parent's children
    (e->prev_sibling != nullptr ? e->prev_sibling->next_sibling : p->first_child) = e->next_sibling;
    if (e->next_sibling != nullptr) e->next_sibling->prev_sibling = e->prev_sibling;
  }
  policy_->OnErase(e);
  page_of_.erase(e);
  pool_.Unref(it->second.page);
  slots_.erase(it);
}

uint32_t PrefixCache::EvictablePages() const {
  uint32_t n = 0;
  for (const auto& [key, slot] : slots_) n += pool_.RefCount(slot.page) == 1 ? 1 : 0;
  return n;
}

}  // namespace strata::worker

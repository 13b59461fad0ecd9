#include "eviction/eviction_policy.h"

namespace strata {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void OnInsert(Entry* e) override {
    e->in_policy = true;
    list_.PushFront(e);
  }
  void OnAccess(Entry* e) override {
    if (e->in_policy && list_.head != e) list_.MoveToFront(e);
  }
  void OnErase(Entry* e) override {
    if (!e->in_policy) return;
    list_.Unlink(e);
    e->in_policy = false;
  }
  Entry* PickVictim(absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                    uint64_t /*incoming_bytes*/) override {
    return list_.FindFromTail(evictable, max_scan, /*descend=*/true);
  }

 private:
  EntryList list_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace strata

#include "eviction_policy.h"

namespace strata {

namespace {

// Most recent at head_, least recent at tail_.
class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }

  void OnInsert(Entry* e) override {
    e->in_policy = true;
    PushFront(e);
  }
  void OnAccess(Entry* e) override {
    if (!e->in_policy || head_ == e) return;
    Unlink(e);
    PushFront(e);
  }
  void OnErase(Entry* e) override {
    if (!e->in_policy) return;
    Unlink(e);
    e->in_policy = false;
  }
  Entry* PickVictim(const std::function<bool(const Entry&)>& evictable, size_t max_scan) override {
    size_t scanned = 0;
    for (Entry* e = tail_; e != nullptr && scanned < max_scan; e = e->policy_prev, ++scanned) {
      if (evictable(*e)) return e;
    }
    return nullptr;
  }

 private:
  void PushFront(Entry* e) {
    e->policy_prev = nullptr;
    e->policy_next = head_;
    if (head_ != nullptr) head_->policy_prev = e;
    head_ = e;
    if (tail_ == nullptr) tail_ = e;
  }
  void Unlink(Entry* e) {
    (e->policy_prev != nullptr ? e->policy_prev->policy_next : head_) = e->policy_next;
    (e->policy_next != nullptr ? e->policy_next->policy_prev : tail_) = e->policy_prev;
    e->policy_prev = e->policy_next = nullptr;
  }

  Entry* head_ = nullptr;
  Entry* tail_ = nullptr;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  if (name == "lru") return MakeLruPolicy();
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: lru)");
}

}  // namespace strata

// Learned reuse deadlines ("deadline").
//
// In conversation traffic a block's next use, if it comes at all, comes when
// the user's next turn does: almost never within the first minute, then
// spread over many minutes. LRU keeps every block for the same time, which
// at a realistic capacity is shorter than most turns take, so it evicts most
// blocks just before their reuse. What varies between blocks is how likely
// the reuse is, and the one strong online signal for that is how often the
// block was used already: 24% of first-seen blocks come back, 42% of those
// seen twice, 84% of those seen five times or more (the Mooncake trace).
//
// So each entry belongs to a class, the number of earlier uses (0..4+),
// and each class c gets a holding time A_c: an entry's deadline is its last
// use plus A_c, and the victim is the leaf whose deadline is earliest. The
// holding times come from a HoldTimeModel (hold_time_model.h), fed with
// every use and every reuse distance, including reuses of evicted keys,
// remembered as fingerprints in a ghost table. A class whose reuses mostly
// come later than the cache could afford to wait gets a short holding time:
// it is evicted first and its space goes to the classes that pay it back.
//
// Time is counted in uses (inserts and hits), not seconds, so a replay at any
// speed sees the same policy. Measurements: docs/eviction-policy.md.
#include <algorithm>
#include <array>

#include "eviction/eviction_policy.h"
#include "eviction/ghost_table.h"
#include "eviction/hold_time_model.h"

namespace strata {
namespace {

class ReuseDeadlinePolicy final : public EvictionPolicy {
 public:
  explicit ReuseDeadlinePolicy(uint64_t capacity_bytes)
      : model_(static_cast<double>(capacity_bytes)), ghosts_(kMinGhosts) {}

  std::string_view name() const override { return "deadline"; }

  void OnInsert(Entry* e) override {
    e->in_policy = true;
    const uint64_t now = model_.Advance();
    uint64_t uses = 0;
    if (const std::optional<GhostTable::Remembered> g = ghosts_.Take(EntryKeyHash{}(e->key))) {
      // Back after an eviction: a reuse the cache did not wait for.
      model_.Reused(ClassOf(g->value), now - Tick(g->value), e->extent.length);
      uses = Uses(g->value) + 1;
    }
    Place(e, uses, now);
  }

  void OnHit(Entry* e) override {
    if (!e->in_policy) return;
    const uint64_t now = model_.Advance();
    model_.Reused(ClassOf(e->policy_aux), now - Tick(e->policy_aux), e->extent.length);
    List(e).Unlink(e);
    Place(e, Uses(e->policy_aux) + 1, now);
  }

  // An ordering touch (an ancestor of new blocks, a victim a reader pinned):
  // renews the entry's deadline, not a use.
  void OnAccess(Entry* e) override {
    if (!e->in_policy) return;
    List(e).MoveToFront(e);
    e->policy_aux = Pack(Uses(e->policy_aux), model_.now());
  }

  void OnErase(Entry* e) override {
    if (!e->in_policy) return;
    List(e).Unlink(e);
    e->in_policy = false;
    size_t resident = 0;
    for (const EntryList& l : lists_) resident += l.count;
    // The remembered aux carries the class; no tag needed.
    ghosts_.Add(EntryKeyHash{}(e->key), 0, e->policy_aux,
                std::max(kGhostFactor * resident, kMinGhosts));
  }

  Entry* PickVictim(absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                    uint64_t /*incoming_bytes*/) override {
    // Each class list is in use order, so its tail holds its earliest
    // deadline: try the classes by their tails' deadlines.
    std::array<uint64_t, kClasses> deadline{};
    for (int c = 0; c < kClasses; ++c) {
      const Entry* tail = lists_[c].tail;
      deadline[c] = tail == nullptr ? kNever : Tick(tail->policy_aux) + model_.hold(c);
    }
    for (int tried = 0; tried < kClasses; ++tried) {
      const auto first = std::min_element(deadline.begin(), deadline.end());
      if (*first == kNever) break;
      *first = kNever;
      const EntryList& list = lists_[first - deadline.begin()];
      if (Entry* v = list.FindFromTail(evictable, max_scan, /*descend=*/true)) return v;
    }
    return nullptr;
  }

 private:
  static constexpr int kClasses = HoldTimeModel::kClasses;
  static constexpr size_t kGhostFactor = 8;    // remembered keys per resident entry
  static constexpr size_t kMinGhosts = 65536;  // reuse is minutes away even in a small cache
  static constexpr int kTickBits = 56;
  static constexpr uint64_t kTickMask = (uint64_t{1} << kTickBits) - 1;
  static constexpr uint64_t kNever = ~uint64_t{0};

  // policy_aux = uses (8 bits, saturating) | tick of the last use or touch.
  static uint64_t Pack(uint64_t uses, uint64_t tick) {
    return (std::min<uint64_t>(uses, 255) << kTickBits) | (tick & kTickMask);
  }
  static uint64_t Uses(uint64_t aux) { return aux >> kTickBits; }
  static uint64_t Tick(uint64_t aux) { return aux & kTickMask; }
  static int ClassOf(uint64_t aux) { return HoldTimeModel::ClassOf(Uses(aux)); }
  EntryList& List(const Entry* e) { return lists_[ClassOf(e->policy_aux)]; }

  void Place(Entry* e, uint64_t uses, uint64_t now) {
    e->policy_aux = Pack(uses, now);
    const int c = ClassOf(e->policy_aux);
    lists_[c].PushFront(e);
    model_.Start(c, e->extent.length);
  }

  HoldTimeModel model_;
  std::array<EntryList, kClasses> lists_;
  GhostTable ghosts_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeReuseDeadlinePolicy(uint64_t capacity_bytes) {
  return std::make_unique<ReuseDeadlinePolicy>(capacity_bytes);
}

}  // namespace strata

// Adaptive segmented LRU ("aslru").
//
// A KV-cache block is worth keeping if its prefix comes back, and in real
// traffic most blocks never do: the first turn of a conversation that never
// continues, the partial tail of every prompt. Plain LRU lets each of them
// push out a block that has already proven it is reused. So:
//  - New entries enter a probation LRU; a hit promotes them to a protected
//    LRU. Eviction takes from probation while it is above its target size.
//  - Evicted keys are remembered (64-bit fingerprints, no bytes) in a ghost
//    list per segment. A key that returns from the probation ghost says
//    probation was too small to keep it until its reuse: grow the target.
//    One returning from the protected ghost says the opposite. (ARC's
//    adaptation, Megiddo and Modha, FAST '03, plus a windowed multiplicative
//    correction, below.) Either way the returning entry has proven reuse
//    and goes straight to protected.
// The target adapts to the capacity and the traffic: small when reuse
// distances exceed what probation could hold anyway, large when most
// first reuses fit. Measurements: docs/eviction-policy.md.
//
// Within each segment the store's root-last touches keep ancestors younger
// than descendants; across segments that order can break, and the store's
// rule that only leaves are evicted keeps eviction prefix-safe regardless.
#include <algorithm>
#include <vector>

#include "eviction/eviction_policy.h"
#include "eviction/ghost_table.h"

namespace strata {
namespace {

class AdaptiveSlruPolicy final : public EvictionPolicy {
 public:
  explicit AdaptiveSlruPolicy(uint64_t capacity_bytes)
      : capacity_(static_cast<double>(capacity_bytes)), target_(kInitialTarget * capacity_) {}

  std::string_view name() const override { return "aslru"; }

  void OnInsert(Entry* e) override {
    e->in_policy = true;
    const uint64_t fp = EntryKeyHash{}(e->key);
    const double size = static_cast<double>(e->extent.length);
    const std::optional<GhostTable::Remembered> ghost = ghosts_.Take(fp);
    if (ghost && ghost->tag == kProbation) {
      target_ += kStep * size * Ratio(ghosts_.count(kProtected), ghosts_.count(kProbation));
      ++window_hits_[kProbation];
      Place(e, kProtected);
    } else if (ghost) {
      target_ -= kStep * size * Ratio(ghosts_.count(kProbation), ghosts_.count(kProtected));
      ++window_hits_[kProtected];
      Place(e, kProtected);
    } else {
      Place(e, kProbation);
    }
    // ARC's per-hit steps are a fraction of an entry: far too slow to move
    // the target across orders of magnitude within a trace. So also, every
    // kWindow insertions, scale it towards the segment whose ghosts were hit
    // more often.
    if (++window_inserts_ >= kWindow) {
      if (window_hits_[kProbation] > window_hits_[kProtected]) target_ *= kWindowFactor;
      if (window_hits_[kProbation] < window_hits_[kProtected]) target_ /= kWindowFactor;
      window_inserts_ = 0;
      window_hits_[kProbation] = window_hits_[kProtected] = 0;
    }
    target_ = std::clamp(target_, kMinTarget * capacity_, kMaxTarget * capacity_);
  }

  void OnAccess(Entry* e) override {
    if (!e->in_policy) return;
    List(e).Unlink(e);
    Place(e, kProtected);
  }

  void OnErase(Entry* e) override {
    if (!e->in_policy) return;
    const bool was_probation = e->policy_aux == static_cast<uint64_t>(kProbation);
    List(e).Unlink(e);
    e->in_policy = false;
    // Both segments' ghosts share one table: kGhostFactor keys per
    // resident entry for each.
    const size_t limit = static_cast<size_t>(
        2 * kGhostFactor * static_cast<double>(probation_.count + protected_.count + 1));
    ghosts_.Add(EntryKeyHash{}(e->key), was_probation ? kProbation : kProtected, 0, limit);
  }

  Entry* PickVictim(absl::FunctionRef<bool(const Entry&)> evictable, size_t max_scan,
                    uint64_t incoming_bytes) override {
    // New entries land in probation: count them, or room for them would
    // always be taken from protected while probation sits at its target.
    const bool probation_first =
        static_cast<double>(probation_.bytes + incoming_bytes) > target_ || protected_.count == 0;
    EntryList& first = probation_first ? probation_ : protected_;
    EntryList& second = probation_first ? protected_ : probation_;
    if (Entry* v = first.FindFromTail(evictable, max_scan, /*descend=*/true)) return v;
    return second.FindFromTail(evictable, max_scan, /*descend=*/true);
  }

 private:
  enum : uint8_t { kProbation = 0, kProtected = 1 };
  // Tuned on the Mooncake conversation trace at 1M, 3M and 10M tokens; see
  // docs/eviction-policy.md for the sweep.
  static constexpr double kStep = 0.5;        // target change per ghost hit, in entry sizes
  static constexpr double kGhostFactor = 8;   // ghost keys per resident entry, per segment
  static constexpr double kMinTarget = 0.01;  // of capacity
  static constexpr double kMaxTarget = 0.9;
  static constexpr double kInitialTarget = 0.05;
  static constexpr size_t kWindow = 2048;  // insertions per windowed adjustment
  static constexpr double kWindowFactor = 1.15;

  static double Ratio(size_t other, size_t self) {
    return std::max(1.0,
                    static_cast<double>(other) / static_cast<double>(std::max<size_t>(1, self)));
  }
  EntryList& List(const Entry* e) {
    return e->policy_aux == static_cast<uint64_t>(kProbation) ? probation_ : protected_;
  }
  void Place(Entry* e, int segment) {
    e->policy_aux = static_cast<uint64_t>(segment);
    (segment == kProbation ? probation_ : protected_).PushFront(e);
  }

  EntryList probation_;
  EntryList protected_;
  GhostTable ghosts_;
  size_t window_inserts_ = 0;
  size_t window_hits_[2] = {0, 0};
  const double capacity_;  // of the tier, bytes
  double target_;          // probation's target size, bytes
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeAdaptiveSlruPolicy(uint64_t capacity_bytes) {
  return std::make_unique<AdaptiveSlruPolicy>(capacity_bytes);
}

}  // namespace strata

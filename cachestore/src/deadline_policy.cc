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
// holding times are chosen online, as a knapsack: per class the policy
// measures how many uses it sees and the distribution of reuse distances
// (including reuses of evicted keys, remembered as fingerprints in a ghost
// table), and picks the A_c that maximise the expected hits subject to the
// expected occupancy, sum over uses of min(reuse distance, A_c), fitting the
// capacity (a Lagrange multiplier, found by bisection). Statistics decay so
// the choice follows the traffic. A class whose reuses mostly come later
// than the cache could afford to wait gets a short holding time: it is
// evicted first and its space goes to the classes that pay it back.
//
// Time is counted in uses (inserts and hits), not seconds, so a replay at any
// speed sees the same policy. Measurements: docs/eviction-policy.md.
#include <algorithm>
#include <array>
#include <cmath>

#include "eviction_policy.h"
#include "ghost_table.h"

namespace strata {
namespace {

class ReuseDeadlinePolicy final : public EvictionPolicy {
 public:
  explicit ReuseDeadlinePolicy(uint64_t capacity_bytes)
      : capacity_(static_cast<double>(capacity_bytes)) {
    for (int b = 0; b < kBuckets; ++b) bound_[b] = kFirstBound * std::pow(kBucketRatio, b);
    for (int b = 0; b < kBuckets; ++b) {
      mid_[b] = b == 0 ? bound_[0] / 2 : std::sqrt(bound_[b - 1] * bound_[b]);
    }
  }

  std::string_view name() const override { return "deadline"; }

  void OnInsert(Entry* e) override {
    e->in_policy = true;
    const uint64_t now = Advance();
    uint64_t uses = 0;
    if (const std::optional<GhostTable::Remembered> g = ghosts_.Take(EntryKeyHash{}(e->key))) {
      // Back after an eviction: a reuse the cache did not wait for.
      Record(ClassOf(g->value), now - Tick(g->value), e->extent.length);
      uses = Uses(g->value) + 1;
    }
    Place(e, uses, now);
  }

  void OnHit(Entry* e) override {
    if (!e->in_policy) return;
    const uint64_t now = Advance();
    Record(ClassOf(e->policy_aux), now - Tick(e->policy_aux), e->extent.length);
    List(e).Unlink(e);
    Place(e, Uses(e->policy_aux) + 1, now);
  }

  // An ordering touch (an ancestor of new blocks, a victim a reader pinned):
  // renews the entry's deadline, not a use.
  void OnAccess(Entry* e) override {
    if (!e->in_policy) return;
    List(e).MoveToFront(e);
    e->policy_aux = Pack(Uses(e->policy_aux), tick_);
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

  Entry* PickVictim(const std::function<bool(const Entry&)>& evictable, size_t max_scan,
                    uint64_t /*incoming_bytes*/) override {
    // Each class list is in use order, so its tail holds its earliest
    // deadline: try the classes by their tails' deadlines.
    std::array<uint64_t, kClasses> deadline{};
    for (int c = 0; c < kClasses; ++c) {
      const Entry* tail = lists_[c].tail;
      deadline[c] = tail == nullptr ? kNever : Tick(tail->policy_aux) + hold_[c];
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
  static constexpr int kClasses = 5;   // earlier uses: 0, 1, 2, 3, 4 or more
  static constexpr int kBuckets = 56;  // reuse distances, geometric: 16 .. 2.4e8 uses
  static constexpr double kFirstBound = 16;
  static constexpr double kBucketRatio = 1.35;
  static constexpr uint64_t kSolveEvery = 4096;  // uses between choices of holding times
  static constexpr double kDecay = 0.95;         // statistics kept per choice
  static constexpr size_t kGhostFactor = 8;      // remembered keys per resident entry
  static constexpr size_t kMinGhosts = 65536;    // reuse is minutes away even in a small cache
  static constexpr int kTickBits = 56;
  static constexpr uint64_t kTickMask = (uint64_t{1} << kTickBits) - 1;
  static constexpr uint64_t kNever = ~uint64_t{0};

  // policy_aux = uses (8 bits, saturating) | tick of the last use or touch.
  static uint64_t Pack(uint64_t uses, uint64_t tick) {
    return (std::min<uint64_t>(uses, 255) << kTickBits) | (tick & kTickMask);
  }
  static uint64_t Uses(uint64_t aux) { return aux >> kTickBits; }
  static uint64_t Tick(uint64_t aux) { return aux & kTickMask; }
  static int ClassOf(uint64_t aux) {
    return static_cast<int>(std::min<uint64_t>(Uses(aux), kClasses - 1));
  }
  EntryList& List(const Entry* e) { return lists_[ClassOf(e->policy_aux)]; }

  void Place(Entry* e, uint64_t uses, uint64_t now) {
    e->policy_aux = Pack(uses, now);
    const int c = ClassOf(e->policy_aux);
    lists_[c].PushFront(e);
    uses_[c] += static_cast<double>(e->extent.length);
  }

  uint64_t Advance() {
    ++tick_;
    ++window_ticks_;
    if (++since_solve_ >= kSolveEvery) {
      since_solve_ = 0;
      Solve();
    }
    return tick_;
  }

  int Bucket(uint64_t distance) const {
    const double d = static_cast<double>(distance);
    if (d <= kFirstBound) return 0;
    const int b = static_cast<int>(std::ceil(std::log(d / kFirstBound) / std::log(kBucketRatio)));
    return std::min(b, kBuckets - 1);
  }

  void Record(int c, uint64_t distance, uint64_t bytes) {
    reuses_[c][Bucket(distance)] += static_cast<double>(bytes);
  }

  // Chooses hold_[c] for every class: for a multiplier lambda, each class
  // takes the holding time that maximises hits - lambda * occupancy; lambda
  // is bisected until the occupancy fits the capacity.
  void Solve() {
    struct Option {
      double hits;
      double cost;  // byte-uses of occupancy
    };
    std::array<std::array<Option, kBuckets>, kClasses> options{};
    for (int c = 0; c < kClasses; ++c) {
      double hits = 0;
      double reused_cost = 0;
      for (int b = 0; b < kBuckets; ++b) {
        hits += reuses_[c][b];
        reused_cost += reuses_[c][b] * mid_[b];
        options[c][b] = {hits, reused_cost + std::max(uses_[c] - hits, 0.0) * bound_[b]};
      }
    }
    std::array<int, kClasses> choice{};
    auto choose = [&](double lambda) {
      double cost = 0;
      for (int c = 0; c < kClasses; ++c) {
        int best = 0;
        for (int b = 1; b < kBuckets; ++b) {
          const Option& o = options[c][b];
          const Option& x = options[c][best];
          if (o.hits - lambda * o.cost > x.hits - lambda * x.cost) best = b;
        }
        choice[c] = best;
        cost += options[c][best].cost;
      }
      return cost;
    };
    const double budget = capacity_ * window_ticks_;
    double lo = 0;
    double hi = 1;
    for (int i = 0; i < 50; ++i) {
      const double mid = (lo + hi) / 2;
      (choose(mid) > budget ? lo : hi) = mid;
    }
    choose(hi);
    for (int c = 0; c < kClasses; ++c) {
      hold_[c] = static_cast<uint64_t>(bound_[choice[c]]);
      uses_[c] *= kDecay;
      for (double& r : reuses_[c]) r *= kDecay;
    }
    window_ticks_ *= kDecay;
  }

  const double capacity_;  // of the tier, bytes
  std::array<EntryList, kClasses> lists_;
  GhostTable ghosts_;
  uint64_t tick_ = 0;
  uint64_t since_solve_ = 0;
  double window_ticks_ = 0;                                      // decayed like the statistics
  std::array<double, kClasses> uses_{};                          // bytes used, per class
  std::array<std::array<double, kBuckets>, kClasses> reuses_{};  // bytes reused, by distance
  std::array<uint64_t, kClasses> hold_{};                        // 0 until the first choice: LRU
  std::array<double, kBuckets> bound_{};
  std::array<double, kBuckets> mid_{};
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeReuseDeadlinePolicy(uint64_t capacity_bytes) {
  return std::make_unique<ReuseDeadlinePolicy>(capacity_bytes);
}

}  // namespace strata

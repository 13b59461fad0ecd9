// Per-class holding times chosen from measured reuse distances: the learning
// half of the "deadline" eviction policies (DRAM: deadline_policy.cc; SSD:
// ssd/ssd_tier.cc). The tier decides what a class is and what a unit of time
// is; the model only sees holding intervals, which start at a use (or a
// write) and end in a reuse, a renewal, or never, and picks for each class c
// the holding time A_c that maximises the expected hits while the expected
// occupancy, the sum over intervals of bytes x min(length, A_c), fits the
// capacity (a knapsack, solved with a Lagrange multiplier found by
// bisection). Holding times never fall as the class rises: with classes
// counting earlier uses, a block is used at least as often as any of its
// descendants (a prefix hit uses every ancestor), so this keeps a chain's
// ancestors at least as long as its tail, which is worthless without them.
// Statistics decay, so the choice follows the traffic. Not
// thread-safe: the owning tier serialises calls. docs/eviction-policy.md has
// the reasoning and the measurements.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace strata {

class HoldTimeModel {
 public:
  static constexpr int kClasses = 5;  // earlier uses: 0, 1, 2, 3, 4 or more
  static constexpr double kDefaultDecay = 0.95;

  // `decay`: the share of the statistics kept at each choice of holding
  // times; closer to 1 remembers longer (for reuse distances that are long
  // next to kSolveEvery).
  explicit HoldTimeModel(double capacity_bytes, double decay = kDefaultDecay);

  static int ClassOf(uint64_t uses) {
    return static_cast<int>(std::min<uint64_t>(uses, kClasses - 1));
  }

  // One unit of time passes; every kSolveEvery units the holding times are
  // chosen again. Returns the new time.
  uint64_t Advance();
  uint64_t now() const { return tick_; }
  // Sets the time before the first use (past times handed out otherwise,
  // e.g. to entries restored from disk).
  void StartAt(uint64_t tick) { tick_ = tick; }

  // An interval of `bytes` starts in class `c`.
  void Start(int c, uint64_t bytes) { starts_[c] += static_cast<double>(bytes); }
  // An interval of class `c` ended in a reuse the tier could serve,
  // `distance` after it started.
  void Reused(int c, uint64_t distance, uint64_t bytes) {
    reused_[c][Bucket(distance)] += static_cast<double>(bytes);
  }
  // An interval of class `c` ended `distance` after it started without a
  // reuse to serve (something renewed it): it cost occupancy, earned nothing.
  void Ended(int c, uint64_t distance, uint64_t bytes) {
    ended_[c][Bucket(distance)] += static_cast<double>(bytes);
  }

  // What the intervals may occupy on average, bytes (a tier whose room
  // changes, e.g. the SSD tier net of its shadow copies, updates it).
  void set_capacity(double bytes) { capacity_ = bytes; }

  // The holding time of class `c`; 0 until the first choice (so the tier
  // starts as LRU).
  uint64_t hold(int c) const { return hold_[c]; }

 private:
  static constexpr int kBuckets = 56;  // interval lengths, geometric: 16 .. 2.4e8 units
  static constexpr double kFirstBound = 16;
  static constexpr double kBucketRatio = 1.35;
  static constexpr uint64_t kSolveEvery = 4096;  // units between choices of holding times

  int Bucket(uint64_t distance) const;
  void Solve();

  double capacity_;  // bytes
  const double decay_;
  uint64_t tick_ = 0;
  uint64_t since_solve_ = 0;
  double window_ticks_ = 0;                                      // decayed like the statistics
  std::array<double, kClasses> starts_{};                        // bytes of intervals started
  std::array<std::array<double, kBuckets>, kClasses> reused_{};  // bytes, by interval length
  std::array<std::array<double, kBuckets>, kClasses> ended_{};   // bytes, by interval length
  std::array<uint64_t, kClasses> hold_{};
  std::array<double, kBuckets> bound_{};  // upper end of each bucket
  std::array<double, kBuckets> mid_{};    // a typical length in each bucket
};

}  // namespace strata

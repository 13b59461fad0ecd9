#include "eviction/hold_time_model.h"

#include <cmath>

namespace strata {

HoldTimeModel::HoldTimeModel(double capacity_bytes, double decay)
    : capacity_(capacity_bytes), decay_(decay) {
  for (int b = 0; b < kBuckets; ++b) bound_[b] = kFirstBound * std::pow(kBucketRatio, b);
  for (int b = 0; b < kBuckets; ++b) {
    mid_[b] = b == 0 ? bound_[0] / 2 : std::sqrt(bound_[b - 1] * bound_[b]);
  }
}

uint64_t HoldTimeModel::Advance() {
  ++tick_;
  ++window_ticks_;
  if (++since_solve_ >= kSolveEvery) {
    since_solve_ = 0;
    Solve();
  }
  return tick_;
}

int HoldTimeModel::Bucket(uint64_t distance) const {
  const double d = static_cast<double>(distance);
  if (d <= kFirstBound) return 0;
  const int b = static_cast<int>(std::ceil(std::log(d / kFirstBound) / std::log(kBucketRatio)));
  return std::min(b, kBuckets - 1);
}

// For a multiplier lambda, the classes take the holding times that maximise
// hits - lambda x occupancy, never shorter for a higher class; lambda is
// bisected until the occupancy fits the capacity over the (decayed) window.
void HoldTimeModel::Solve() {
  struct Option {
    double hits;
    double cost;  // byte-units of occupancy
  };
  std::array<std::array<Option, kBuckets>, kClasses> options{};
  for (int c = 0; c < kClasses; ++c) {
    double hits = 0;
    double closed = 0;  // intervals shorter than this bucket's bound
    double closed_cost = 0;
    for (int b = 0; b < kBuckets; ++b) {
      hits += reused_[c][b];
      closed += reused_[c][b] + ended_[c][b];
      closed_cost += (reused_[c][b] + ended_[c][b]) * mid_[b];
      // The rest are held for the whole holding time, then evicted.
      options[c][b] = {hits, closed_cost + std::max(starts_[c] - closed, 0.0) * bound_[b]};
    }
  }
  std::array<int, kClasses> choice{};
  // A dynamic program over the classes in order, each taking the best
  // bucket at or above its predecessor's.
  auto choose = [&](double lambda) {
    auto value = [&](int c, int b) { return options[c][b].hits - lambda * options[c][b].cost; };
    std::array<std::array<int, kBuckets>, kClasses> from{};
    std::array<double, kBuckets> best{};
    for (int b = 0; b < kBuckets; ++b) best[b] = value(0, b);
    for (int c = 1; c < kClasses; ++c) {
      std::array<double, kBuckets> next{};
      int arg = 0;  // the best predecessor bucket at or below b
      for (int b = 0; b < kBuckets; ++b) {
        if (best[b] > best[arg]) arg = b;
        next[b] = value(c, b) + best[arg];
        from[c][b] = arg;
      }
      best = next;
    }
    int b = static_cast<int>(std::max_element(best.begin(), best.end()) - best.begin());
    double cost = 0;
    for (int c = kClasses - 1; c >= 0; --c) {
      choice[c] = b;
      cost += options[c][b].cost;
      if (c > 0) b = from[c][b];
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
    starts_[c] *= decay_;
    for (double& r : reused_[c]) r *= decay_;
    for (double& r : ended_[c]) r *= decay_;
  }
  window_ticks_ *= decay_;
}

}  // namespace strata

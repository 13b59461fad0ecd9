// Time source for leases, TTLs and pins. Injectable so tests control time
// instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace strata {

using Nanos = int64_t;  // nanoseconds on a monotonic clock
constexpr Nanos kNanosPerMilli = 1'000'000;
constexpr Nanos kNanosPerSecond = 1'000'000'000;
constexpr Nanos Seconds(int64_t s) { return s * kNanosPerSecond; }
constexpr Nanos Minutes(int64_t m) { return Seconds(60 * m); }
constexpr Nanos Hours(int64_t h) { return Minutes(60 * h); }

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos Now() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  Nanos Now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static SteadyClock* Default();
};

// A clock that moves only when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = Seconds(1000)) : now_(start) {}
  Nanos Now() const override { return now_.load(std::memory_order_acquire); }
  void Advance(Nanos d) { now_.fetch_add(d, std::memory_order_acq_rel); }

 private:
  std::atomic<Nanos> now_;
};

}  // namespace strata

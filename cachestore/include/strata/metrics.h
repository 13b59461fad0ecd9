#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata {

// Label name -> value pairs, rendered in the given order.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Monotonic counter. Updates are lock-free; relaxed ordering is enough because readers only need
// an eventually consistent value, not ordering with other memory.
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { value_.fetch_add(d, std::memory_order_relaxed); }
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Histogram with fixed upper bounds ("le" semantics: a value equal to a bound counts in that
// bound's bucket). Observe is lock-free: one atomic add on the bucket plus a CAS loop on the sum,
// which is kept as an atomic double. The count is not stored separately; it is the sum of the
// buckets, so a rendered _count always equals the +Inf bucket even under concurrent updates.
class Histogram {
 public:
  // Bounds must be finite and strictly increasing (aborts otherwise); a trailing +Inf is dropped
  // because the +Inf bucket is always implicit.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  uint64_t Count() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  // Per-bucket (non-cumulative) counts; size is Bounds().size() + 1, the last being +Inf.
  std::vector<uint64_t> BucketCounts() const;
  const std::vector<double>& Bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
};

// Owns all metrics and renders them in the Prometheus text exposition format 0.0.4.
// Get* calls lock a mutex (registration is rare); metric updates never touch it.
// Misuse (invalid names, a name reused with another type or other bounds) is a programming error
// and aborts with a message on stderr.
class MetricsRegistry {
 public:
  // The returned pointer is owned by the registry and stays valid for its lifetime. The same
  // name + label set (in any order) returns the same object; the first help text wins.
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const MetricLabels& labels = {});

  // Families sorted by name, series in registration order. Safe to call concurrently with updates.
  std::string RenderPrometheus() const;

  // {start, start*factor, ..., start*factor^(count-1)}; aborts unless start > 0, factor > 1 and
  // count >= 1.
  static std::vector<double> ExponentialBuckets(double start, double factor, int count);

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    MetricLabels labels;         // As given, for rendering.
    MetricLabels sorted_labels;  // For identity: label order must not create a new series.
    Counter* counter = nullptr;
    Gauge* gauge = nullptr;
    Histogram* histogram = nullptr;
  };
  struct Family {
    std::string help;
    Type type;
    std::vector<double> bounds;  // Histograms only.
    std::vector<Series> series;
  };

  // Requires mu_. Validates names and returns the existing or a newly added (empty) series.
  Series* FindOrAdd(const std::string& name, const std::string& help, Type type,
                    const MetricLabels& labels, const std::vector<double>* bounds);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // std::map keeps families sorted for rendering.
  // Deques never move existing elements on emplace_back, so handed-out pointers stay stable.
  std::deque<Counter> counters_;
  std::deque<Gauge> gauges_;
  std::deque<Histogram> histograms_;
};

}  // namespace strata

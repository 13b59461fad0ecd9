#include "strata/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace strata {
namespace {

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "strata metrics: %s: '%s'\n", what, detail.c_str());
  std::abort();
}

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*.
bool IsValidName(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest round-trip digits; fixed notation in the common range so bounds print as "0.005" or
  // "1000000" rather than "5e-03" / "1e+06", general (exponent) notation only for extremes.
  const double mag = std::fabs(v);
  const auto fmt = (v == 0 || (mag >= 1e-4 && mag < 1e15)) ? std::chars_format::fixed
                                                           : std::chars_format::general;
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, fmt);
  return std::string(buf, res.ptr);
}

// Label values escape \, " and newline; HELP text escapes only \ and newline.
std::string Escape(const std::string& s, bool quotes) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string RenderLabels(const MetricLabels& labels, const char* extra_name = nullptr,
                         const std::string& extra_value = "") {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  for (const auto& [name, value] : labels) {
    if (out.size() > 1) out += ',';
    out += name + "=\"" + Escape(value, true) + "\"";
  }
  if (extra_name != nullptr) {
    if (out.size() > 1) out += ',';
    out += std::string(extra_name) + "=\"" + extra_value + "\"";
  }
  return out + "}";
}

std::vector<double> NormalizeBounds(std::vector<double> bounds) {
  if (!bounds.empty() && bounds.back() == std::numeric_limits<double>::infinity()) {
    bounds.pop_back();
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      Die("histogram bounds must be finite and strictly increasing", FormatDouble(bounds[i]));
    }
  }
  return bounds;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(NormalizeBounds(std::move(bounds))),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  // lower_bound finds the first bound >= value, i.e. "le". NaN compares false everywhere, so it
  // is sent to +Inf explicitly (as the Go client does) rather than landing in bucket 0.
  const size_t i =
      std::isnan(value)
          ? bounds_.size()
          : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  double old = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(old, old + value, std::memory_order_relaxed)) {
  }
}

uint64_t Histogram::Count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) total += buckets_[i].load(std::memory_order_relaxed);
  return total;
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

MetricsRegistry::Series* MetricsRegistry::FindOrAdd(const std::string& name,
                                                    const std::string& help, Type type,
                                                    const MetricLabels& labels,
                                                    const std::vector<double>* bounds) {
  if (!IsValidName(name, /*allow_colon=*/true)) Die("invalid metric name", name);
  MetricLabels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& label = sorted[i].first;
    const std::string where = std::string(name).append("/").append(label);
    if (!IsValidName(label, /*allow_colon=*/false)) Die("invalid label name", where);
    if (i > 0 && label == sorted[i - 1].first) Die("duplicate label name", where);
    // "le" would clash with the bucket label in the rendered output.
    if (type == Type::kHistogram && label == "le") Die("reserved label name", name + "/le");
  }
  auto [it, inserted] = families_.try_emplace(name);
  Family& family = it->second;
  if (inserted) {
    family.help = help;
    family.type = type;
    if (bounds != nullptr) family.bounds = *bounds;
  } else if (family.type != type) {
    Die("metric already registered with a different type", name);
  } else if (bounds != nullptr && family.bounds != *bounds) {
    Die("histogram already registered with different bounds", name);
  }
  for (Series& s : family.series) {
    if (s.sorted_labels == sorted) return &s;
  }
  family.series.push_back(Series{labels, std::move(sorted)});
  return &family.series.back();
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Series* s = FindOrAdd(name, help, Type::kCounter, labels, nullptr);
  if (s->counter == nullptr) s->counter = &counters_.emplace_back();
  return s->counter;
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Series* s = FindOrAdd(name, help, Type::kGauge, labels, nullptr);
  if (s->gauge == nullptr) s->gauge = &gauges_.emplace_back();
  return s->gauge;
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const MetricLabels& labels) {
  bounds = NormalizeBounds(std::move(bounds));  // So {..., +Inf} and {...} compare equal.
  std::lock_guard<std::mutex> lock(mu_);
  Series* s = FindOrAdd(name, help, Type::kHistogram, labels, &bounds);
  if (s->histogram == nullptr) s->histogram = &histograms_.emplace_back(std::move(bounds));
  return s->histogram;
}

std::string MetricsRegistry::RenderPrometheus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    static constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};
    out += "# HELP " + name + " " + Escape(family.help, false) + "\n";
    out += "# TYPE " + name + " " + kTypeNames[static_cast<int>(family.type)] + "\n";
    for (const Series& s : family.series) {
      const std::string labels = RenderLabels(s.labels);
      switch (family.type) {
        case Type::kCounter:
          out += name + labels + " " + std::to_string(s.counter->Value()) + "\n";
          break;
        case Type::kGauge:
          out += name + labels + " " + std::to_string(s.gauge->Value()) + "\n";
          break;
        case Type::kHistogram: {
          const std::vector<uint64_t> counts = s.histogram->BucketCounts();
          const std::vector<double>& bounds = s.histogram->Bounds();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            cumulative += counts[i];
            const std::string le = i < bounds.size() ? FormatDouble(bounds[i]) : "+Inf";
            out.append(name).append("_bucket").append(RenderLabels(s.labels, "le", le));
            out.append(" ").append(std::to_string(cumulative)).append("\n");
          }
          out.append(name).append("_sum").append(labels).append(" ");
          out.append(FormatDouble(s.histogram->Sum())).append("\n");
          // Same snapshot as the buckets, so _count always equals the +Inf bucket.
          out.append(name).append("_count").append(labels).append(" ");
          out.append(std::to_string(cumulative)).append("\n");
          break;
        }
      }
    }
  }
  return out;
}

std::vector<double> MetricsRegistry::ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die("ExponentialBuckets needs start > 0, factor > 1, count >= 1",
        FormatDouble(start) + "," + FormatDouble(factor) + "," + std::to_string(count));
  }
  std::vector<double> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i, start *= factor) out.push_back(start);
  return out;
}

}  // namespace strata

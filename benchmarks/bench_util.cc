#include "bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "strata/json_text.h"

namespace strata::bench {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

void Progress(const char* label, size_t i, size_t n) {
  std::fprintf(stderr, "\r  %s: %zu/%zu", label, i, n);
  if (i == n) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void Table::Add(std::string name, std::string value, std::string note) {
  rows.push_back({std::move(name), std::move(value), std::move(note)});
}

void Table::Print(const std::string& title) const {
  size_t w0 = 0, w1 = 0;
  for (const auto& r : rows) {
    w0 = std::max(w0, r[0].size());
    w1 = std::max(w1, r[1].size());
  }
  std::printf("\n%s\n", title.c_str());
  std::printf("%s\n", std::string(title.size(), '=').c_str());
  for (const auto& r : rows) {
    std::printf("  %-*s  %*s  %s\n", static_cast<int>(w0), r[0].c_str(), static_cast<int>(w1),
                r[1].c_str(), r[2].c_str());
  }
  std::printf("\n");
}

void JsonObject::Add(const std::string& key, double value) {
  char buf[64];
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 0x1p53) {
    std::snprintf(buf, sizeof(buf), "%.0f", value);  // counts stay exact: 1234567, not 1.23457e+06
  } else if (std::isfinite(value)) {
    std::snprintf(buf, sizeof(buf), "%.6g", value);
  } else {
    std::snprintf(buf, sizeof(buf), "null");
  }
  fields_.emplace_back(key, buf);
}

void JsonObject::Add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, JsonString(value));
}

void JsonObject::AddBool(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
}

std::string JsonObject::Dump() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += "\"" + fields_[i].first + "\": " + fields_[i].second;
  }
  return out + "}";
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace strata::bench

#include "table.h"

#include <algorithm>
#include <cinttypes>

namespace strata::admin {

void Table::Print(std::FILE* out) const {
  std::vector<size_t> width(headers_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  measure(headers_);
  for (const auto& row : rows_) measure(row);
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      line += cell;
      if (i + 1 < width.size()) line += std::string(width[i] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  };
  print(headers_);
  for (const auto& row : rows_) print(row);
}

void KeyValues::Print(std::FILE* out) const {
  size_t width = 0;
  for (const auto& [name, value] : lines_) width = std::max(width, name.size());
  for (const auto& [name, value] : lines_) {
    std::fprintf(out, "%s:%s %s\n", name.c_str(), std::string(width - name.size(), ' ').c_str(),
                 value.c_str());
  }
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string FormatMs(int64_t ms) {
  char buf[32];
  const int64_t s = ms / 1000;
  if (ms < 0) return "-" + FormatMs(-ms);
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "ms", ms);
  } else if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(ms) / 1000);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
  } else if (s < 86400) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "h%02" PRId64 "m", s / 3600, s / 60 % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "d%02" PRId64 "h", s / 86400, s / 3600 % 24);
  }
  return buf;
}

std::string FormatRatio(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string FormatRate(double per_second) {
  char buf[32];
  if (per_second >= 100 || per_second == 0) {
    std::snprintf(buf, sizeof(buf), "%.0f", per_second);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f", per_second);
  }
  return buf;
}

}  // namespace strata::admin

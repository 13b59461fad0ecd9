// Small helpers shared by the benchmarks: timing, percentiles, tables, JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::bench {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// q in [0, 1]; sorts a copy.
double Percentile(std::vector<double> v, double q);
double Median(std::vector<double> v);

// Prints "label: i/n" on stderr, overwriting the line; a newline at the end.
void Progress(const char* label, size_t i, size_t n);

// Rows of (name, value, note) printed as an aligned table.
struct Table {
  std::vector<std::vector<std::string>> rows;
  void Add(std::string name, std::string value, std::string note = "");
  void Print(const std::string& title) const;
};

// A flat JSON object built in insertion order. Whole numbers print exactly;
// nan and inf print as null.
class JsonObject {
 public:
  void Add(const std::string& key, double value);
  void Add(const std::string& key, const std::string& value);
  void AddBool(const std::string& key, bool value);
  std::string Dump() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

std::string Fixed(double v, int digits);

}  // namespace strata::bench

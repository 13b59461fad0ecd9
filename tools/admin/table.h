// Human-readable output: aligned tables and key/value blocks, plus the
// number formats they share.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace strata::admin {

// Columns separated by two spaces, each as wide as its widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  size_t rows() const { return rows_.size(); }
  void Print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// "name:   value" lines, names padded to one width.
class KeyValues {
 public:
  void Add(std::string name, std::string value) {
    lines_.emplace_back(std::move(name), std::move(value));
  }
  void Print(std::FILE* out) const;

 private:
  std::vector<std::pair<std::string, std::string>> lines_;
};

// 1536 -> "1.5 KiB"; below 1 KiB the exact count ("512 B").
std::string FormatBytes(uint64_t bytes);
// Milliseconds as "850ms", "12.5s", "3m20s", "2h05m", "3d04h".
std::string FormatMs(int64_t ms);
// A ratio as a percentage with one decimal ("87.5%"); "-" when undefined.
std::string FormatRatio(uint64_t part, uint64_t whole);
std::string FormatRate(double per_second);

}  // namespace strata::admin

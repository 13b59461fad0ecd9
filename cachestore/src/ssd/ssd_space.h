// Free space of one SSD data file: 4 KiB-aligned extents, best fit, with
// immediate coalescing. Unlike the DRAM ExtentAllocator it can claim a given
// extent, which is how restart rebuilds occupancy from the index. Not
// thread-safe: SsdTier guards it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata {

class SsdSpace {
 public:
  explicit SsdSpace(uint64_t capacity_bytes);

  // An offset for `bytes` (a 4 KiB multiple), or nullopt.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Marks [offset, offset + bytes) used; false if any of it is not free.
  bool Claim(uint64_t offset, uint64_t bytes);
  void Free(uint64_t offset, uint64_t bytes);

  // The longest free run (0 when full): what one Allocate can take.
  uint64_t largest_free_bytes() const {
    return by_length_.empty() ? 0 : by_length_.rbegin()->first;
  }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const { return used_; }

 private:
  void AddFree(uint64_t offset, uint64_t bytes);
  void RemoveFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;             // free runs: offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_length_;  // (length, offset)
};

}  // namespace strata

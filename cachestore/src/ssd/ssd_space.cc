#include "ssd/ssd_space.h"

#include <cassert>
#include <cstdlib>

namespace strata {

SsdSpace::SsdSpace(uint64_t capacity_bytes) : capacity_(capacity_bytes) {
  if (capacity_ > 0) AddFree(0, capacity_);
}

void SsdSpace::AddFree(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_length_.emplace(bytes, offset);
}

void SsdSpace::RemoveFree(std::map<uint64_t, uint64_t>::iterator it) {
  by_length_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> SsdSpace::Allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  auto fit = by_length_.lower_bound({bytes, 0});
  if (fit == by_length_.end()) return std::nullopt;
  const auto [length, offset] = *fit;
  RemoveFree(by_offset_.find(offset));
  if (length > bytes) AddFree(offset + bytes, length - bytes);
  used_ += bytes;
  return offset;
}

bool SsdSpace::Claim(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || offset + bytes > capacity_ || offset + bytes < offset) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t run_start = it->first, run_end = it->first + it->second;
  if (offset + bytes > run_end) return false;
  RemoveFree(it);
  if (offset > run_start) AddFree(run_start, offset - run_start);
  if (offset + bytes < run_end) AddFree(offset + bytes, run_end - offset - bytes);
  used_ += bytes;
  return true;
}

void SsdSpace::Free(uint64_t offset, uint64_t bytes) {
  // A double free would corrupt occupancy for good: a bug, not an input.
  if (bytes == 0 || bytes > used_) std::abort();
  used_ -= bytes;
  uint64_t start = offset, end = offset + bytes;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < end) std::abort();  // overlaps a free run
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    RemoveFree(next);
  }
  auto prev = by_offset_.lower_bound(offset);
  if (prev != by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second > start) std::abort();
    if (prev->first + prev->second == start) {
      start = prev->first;
      RemoveFree(prev);
    }
  }
  AddFree(start, end - start);
}

}  // namespace strata

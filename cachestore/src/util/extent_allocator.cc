#include "util/extent_allocator.h"

#include <cstdio>
#include <cstdlib>

namespace strata {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint32_t granule_bytes)
    : granule_(granule_bytes) {
  if (granule_ == 0 || capacity_bytes / granule_ >= kNone) {
    std::fprintf(stderr, "ExtentAllocator: bad granule %u for %llu bytes\n", granule_,
                 static_cast<unsigned long long>(capacity_bytes));
    std::abort();
  }
  granules_ = static_cast<uint32_t>(capacity_bytes / granule_);
  size_.assign(granules_, 0);
  head_.assign(granules_, 0);
  state_.assign(granules_, kInterior);
  next_.assign(granules_, kNone);
  prev_.assign(granules_, kNone);
  for (uint32_t& h : class_head_) h = kNone;
  if (granules_ > 0) MakeFree(0, granules_);
}

void ExtentAllocator::MakeFree(uint32_t start, uint32_t len) {
  const uint32_t last = start + len - 1;
  size_[start] = len;
  head_[last] = start;
  state_[start] = kFreeEdge;
  state_[last] = kFreeEdge;
  const int c = FloorLog2(len);
  prev_[start] = kNone;
  next_[start] = class_head_[c];
  if (class_head_[c] != kNone) prev_[class_head_[c]] = start;
  class_head_[c] = start;
  nonempty_ |= uint64_t{1} << c;
}

void ExtentAllocator::Unlink(uint32_t start) {
  const int c = FloorLog2(size_[start]);
  if (prev_[start] != kNone) {
    next_[prev_[start]] = next_[start];
  } else {
    class_head_[c] = next_[start];
  }
  if (next_[start] != kNone) prev_[next_[start]] = prev_[start];
  if (class_head_[c] == kNone) nonempty_ &= ~(uint64_t{1} << c);
}

std::optional<Extent> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || granules_ == 0) return std::nullopt;
  const uint64_t want64 = (bytes + granule_ - 1) / granule_;
  if (want64 > granules_) return std::nullopt;
  const uint32_t want = static_cast<uint32_t>(want64);

  // Any extent in a class at or above ceil(log2(want)) fits: take the head.
  const int floor_c = FloorLog2(want);
  const int fit_c = (want & (want - 1)) == 0 ? floor_c : floor_c + 1;
  uint32_t found = kNone;
  const uint64_t candidates = fit_c < 64 ? nonempty_ & (~uint64_t{0} << fit_c) : 0;
  if (candidates != 0) {
    found = class_head_[__builtin_ctzll(candidates)];
  } else if (fit_c != floor_c) {
    // Only the class holding `want` itself is left: first fit within it.
    for (uint32_t s = class_head_[floor_c]; s != kNone; s = next_[s]) {
      if (size_[s] >= want) {
        found = s;
        break;
      }
    }
  }
  if (found == kNone) return std::nullopt;

  const uint32_t len = size_[found];
  Unlink(found);
  size_[found] = want;
  state_[found] = kUsedStart;
  if (want > 1) state_[found + want - 1] = kInterior;
  if (len > want) MakeFree(found + want, len - want);
  used_granules_ += want;
  ++allocated_extents_;
  return Extent{uint64_t{found} * granule_, uint64_t{want} * granule_};
}

void ExtentAllocator::Free(const Extent& extent) {
  const uint64_t start64 = extent.offset / granule_;
  if (extent.offset % granule_ != 0 || start64 >= granules_ || state_[start64] != kUsedStart ||
      uint64_t{size_[start64]} * granule_ != extent.length) {
    std::fprintf(stderr, "ExtentAllocator: free of an extent not allocated (offset %llu)\n",
                 static_cast<unsigned long long>(extent.offset));
    std::abort();
  }
  uint32_t start = static_cast<uint32_t>(start64);
  uint32_t len = size_[start];
  used_granules_ -= len;
  --allocated_extents_;
  state_[start] = kInterior;
  // Coalesce with the following extent, then with the preceding one.
  const uint32_t after = start + len;
  if (after < granules_ && state_[after] == kFreeEdge) {
    const uint32_t after_len = size_[after];
    Unlink(after);
    state_[after] = kInterior;
    state_[after + after_len - 1] = kInterior;
    len += after_len;
  }
  if (start > 0 && state_[start - 1] == kFreeEdge) {
    const uint32_t before = head_[start - 1];
    Unlink(before);
    state_[start - 1] = kInterior;
    state_[before] = kInterior;
    len += size_[before];
    start = before;
  }
  MakeFree(start, len);
}

bool ExtentAllocator::CheckConsistency() const {
  uint64_t free_granules = 0, used = 0, extents = 0;
  bool prev_free = false;
  for (uint32_t s = 0; s < granules_;) {
    const uint32_t len = size_[s];
    if (len == 0 || uint64_t{s} + len > granules_) return false;
    if (state_[s] == kFreeEdge) {
      if (prev_free) return false;  // two adjacent free extents were not merged
      if (state_[s + len - 1] != kFreeEdge || head_[s + len - 1] != s) return false;
      free_granules += len;
      prev_free = true;
    } else if (state_[s] == kUsedStart) {
      used += len;
      ++extents;
      prev_free = false;
    } else {
      return false;
    }
    s += len;
  }
  uint64_t listed = 0;
  for (int c = 0; c < kClasses; ++c) {
    if (((nonempty_ >> c) & 1) != (class_head_[c] != kNone)) return false;
    for (uint32_t s = class_head_[c]; s != kNone; s = next_[s]) {
      if (state_[s] != kFreeEdge || FloorLog2(size_[s]) != c) return false;
      listed += size_[s];
    }
  }
  return listed == free_granules && used == used_granules_ && extents == allocated_extents_ &&
         used + free_granules == granules_;
}

}  // namespace strata

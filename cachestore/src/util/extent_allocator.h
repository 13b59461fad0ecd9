// Allocates extents (contiguous runs of fixed-size granules) inside one
// address range. All metadata is sized up front from the range, so a put
// never calls malloc. Segregated free lists with power-of-two size classes
// and boundary tags give O(1) allocate/free and immediate coalescing.
//
// Not thread-safe; DramArena wraps it with a lock.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace strata {

struct Extent {
  uint64_t offset = 0;  // bytes from the start of the range
  uint64_t length = 0;  // bytes, a multiple of the granule
};

class ExtentAllocator {
 public:
  // Manages [0, capacity_bytes) rounded down to whole granules.
  ExtentAllocator(uint64_t capacity_bytes, uint32_t granule_bytes);

  // An extent of at least `bytes` (rounded up to the granule), or nullopt
  // when no free run is large enough.
  std::optional<Extent> Allocate(uint64_t bytes);
  // `extent` must be exactly one returned by Allocate and not yet freed;
  // anything else aborts (a double free is a bug, not an input error).
  void Free(const Extent& extent);

  uint64_t capacity_bytes() const { return uint64_t{granules_} * granule_; }
  uint64_t used_bytes() const { return uint64_t{used_granules_} * granule_; }
  uint64_t free_bytes() const { return capacity_bytes() - used_bytes(); }
  uint32_t granule_bytes() const { return granule_; }
  uint64_t allocated_extents() const { return allocated_extents_; }
  // Checks every invariant by walking the whole range; for tests.
  bool CheckConsistency() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr int kClasses = 33;
  enum : uint8_t { kInterior = 0, kFreeEdge = 1, kUsedStart = 2 };

  static int FloorLog2(uint32_t n) { return 31 - __builtin_clz(n); }
  void MakeFree(uint32_t start, uint32_t len);  // marks, then links into its class
  void Unlink(uint32_t start);

  uint32_t granule_;
  uint32_t granules_;
  uint32_t used_granules_ = 0;
  uint64_t allocated_extents_ = 0;
  std::vector<uint32_t> size_;  // at an extent's first granule: its length
  std::vector<uint32_t> head_;  // at a free extent's last granule: its first
  std::vector<uint8_t> state_;  // kFreeEdge at both ends of a free extent
  std::vector<uint32_t> next_;  // free-list links, at a free extent's start
  std::vector<uint32_t> prev_;
  uint32_t class_head_[kClasses];
  uint64_t nonempty_ = 0;  // bit c set when class c has a free extent
};

}  // namespace strata

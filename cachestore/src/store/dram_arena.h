// The node's DRAM tier memory: one mapping made at start (2 MiB huge pages
// when the system has them, else transparent huge pages), carved into
// extents. Later registered once with the transport, so bytes never move
// between put and fetch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "strata/arena_options.h"
#include "strata/status.h"
#include "util/extent_allocator.h"
#include "util/mutex.h"

namespace strata {

class DramArena {
 public:
  static Result<std::unique_ptr<DramArena>> Create(const DramArenaOptions& options);
  ~DramArena();
  DramArena(const DramArena&) = delete;
  DramArena& operator=(const DramArena&) = delete;

  std::optional<Extent> Allocate(uint64_t bytes);
  void Free(const Extent& extent);

  std::span<std::byte> Bytes(const Extent& extent, uint64_t length) const {
    return {base_ + extent.offset, length};
  }
  std::byte* base() const { return base_; }
  uint64_t capacity_bytes() const { return capacity_; }
  // The length of the extent Allocate(bytes) returns (the granule is
  // const after construction: no lock, and no analysis).
  uint64_t ExtentBytes(uint64_t bytes) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const uint64_t granule = alloc_.granule_bytes();
    return (bytes + granule - 1) / granule * granule;
  }
  // Lock-free read of the allocator's count, for watermarks and gauges.
  uint64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  uint64_t allocated_extents() const;
  bool huge_pages() const { return huge_pages_; }
  bool CheckConsistency() const;

 private:
  DramArena(std::byte* base, uint64_t mapped, uint64_t capacity, uint32_t granule, bool huge);

  // 0 for an external region: nothing to unmap.

  std::byte* base_;
  uint64_t mapped_;
  uint64_t capacity_;
  bool huge_pages_;
  mutable Mutex mu_;
  ExtentAllocator alloc_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> used_{0};
};

}  // namespace strata

// The worker's block pool: fixed-size pages, each holding one store block's
// whole payload (header + layer groups), so a fetch lands in its page and a
// commit sends the page as is. "HBM" in DESIGN §4; host memory on CPU builds.
//
// Pages are reference counted: a sequence holds a reference on each page of
// its block table, an in-flight fetch holds one on the pages it writes, so
// an abort can never free a page under a transfer. A page returns to the
// free list when its count drops to zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "strata/status.h"

namespace strata::worker {

class BlockPool {
 public:
  BlockPool(uint64_t page_bytes, uint32_t pages);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A zeroed page with a count of one; RESOURCE_EXHAUSTED when none is free.
  Result<uint32_t> Allocate();
  void Ref(uint32_t page);
  void Unref(uint32_t page);

  std::span<std::byte> Page(uint32_t page);
  uint64_t page_bytes() const { return page_bytes_; }
  uint32_t capacity() const { return static_cast<uint32_t>(refs_.size()); }
  uint32_t used_pages() const;
  uint32_t RefCount(uint32_t page) const;
  uint64_t total_refs() const;

 private:
  const uint64_t page_bytes_;
  std::unique_ptr<std::byte[]> memory_;  // not zeroed up front: pages are zeroed on allocation
  mutable std::mutex mu_;                // fetch threads unref pages they held
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> free_;
};

}  // namespace strata::worker

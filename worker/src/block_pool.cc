#include "strata/worker/block_pool.h"

#include <cassert>
#include <cstring>

namespace strata::worker {

BlockPool::BlockPool(uint64_t page_bytes, uint32_t pages)
    : page_bytes_(page_bytes), memory_(new std::byte[page_bytes * pages]), refs_(pages, 0) {
  free_.reserve(pages);
  for (uint32_t p = pages; p > 0; --p) free_.push_back(p - 1);  // page 0 first
}

Result<uint32_t> BlockPool::Allocate() {
  uint32_t page;
  {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      return ResourceExhausted("block pool: all " + std::to_string(refs_.size()) + " pages in use");
    }
    page = free_.back();
    free_.pop_back();
    refs_[page] = 1;
  }
  std::memset(memory_.get() + page * page_bytes_, 0, page_bytes_);
  return page;
}

void BlockPool::Ref(uint32_t page) {
  std::lock_guard lock(mu_);
  assert(refs_[page] > 0);
  ++refs_[page];
}

void BlockPool::Unref(uint32_t page) {
  std::lock_guard lock(mu_);
  assert(refs_[page] > 0);
  if (--refs_[page] == 0) free_.push_back(page);
}

std::span<std::byte> BlockPool::Page(uint32_t page) {
  return {memory_.get() + page * page_bytes_, page_bytes_};
}

uint32_t BlockPool::used_pages() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(refs_.size() - free_.size());
}

uint32_t BlockPool::RefCount(uint32_t page) const {
  std::lock_guard lock(mu_);
  return refs_[page];
}

uint64_t BlockPool::total_refs() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (uint32_t r : refs_) n += r;
  return n;
}

}  // namespace strata::worker

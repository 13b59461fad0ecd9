#include "strata/kernels/block_copy.h"

#include <cassert>
#include <cstring>

namespace strata::kernels {

uint64_t GroupOffset(const PagedPool& pool, const PayloadBuffers& payloads, uint32_t g) {
  uint64_t off = payloads.body_offset;
  for (uint32_t i = 0; i < g; ++i) off += pool.group_page_bytes[i];
  return off;
}

void GatherBlocks(const PagedPool& pool, std::span<const uint32_t> pages,
                  const PayloadBuffers& payloads) {
  assert(pool.group_base.size() == pool.group_page_bytes.size());
  for (size_t b = 0; b < pages.size(); ++b) {
    uint8_t* dst = payloads.base + b * payloads.stride + payloads.body_offset;
    for (size_t g = 0; g < pool.group_base.size(); ++g) {
      const uint64_t n = pool.group_page_bytes[g];
      std::memcpy(dst, pool.group_base[g] + pages[b] * n, n);
      dst += n;
    }
  }
}

void ScatterGroup(const PayloadBuffers& payloads, uint32_t group, std::span<const uint32_t> pages,
                  const PagedPool& pool) {
  const uint64_t off = GroupOffset(pool, payloads, group);
  const uint64_t n = pool.group_page_bytes[group];
  for (size_t b = 0; b < pages.size(); ++b) {
    std::memcpy(pool.group_base[group] + pages[b] * n, payloads.base + b * payloads.stride + off,
                n);
  }
}

void ScatterBlocks(const PayloadBuffers& payloads, std::span<const uint32_t> pages,
                   const PagedPool& pool) {
  for (uint32_t g = 0; g < pool.group_base.size(); ++g) ScatterGroup(payloads, g, pages, pool);
}

}  // namespace strata::kernels

// CUDA block copy: GatherBlocks and ScatterBlocks between a paged block
// pool and layer-group-major payloads (block_copy.h; the CPU reference is
// kernels/src/block_copy.cc).

#include <cstdint>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"

namespace strata::kernels::cuda {
namespace {

// grid (blocks, tiles): copies one group of one block between a page and a
// payload. Vec: 16-byte words when everything is 16-byte aligned.
template <typename Word>
__global__ void CopyGroupKernel(uint8_t* pool_base, uint64_t page_bytes, const uint32_t* pages,
                                uint8_t* payloads, uint64_t stride, uint64_t offset,
                                bool to_payload) {
  const uint64_t b = blockIdx.x;
  uint8_t* page = pool_base + pages[b] * page_bytes;
  uint8_t* pay = payloads + b * stride + offset;
  const Word* src = reinterpret_cast<const Word*>(to_payload ? page : pay);
  Word* dst = reinterpret_cast<Word*>(to_payload ? pay : page);
  const uint64_t words = page_bytes / sizeof(Word);
  for (uint64_t w = uint64_t{blockIdx.y} * blockDim.x + threadIdx.x; w < words;
       w += uint64_t{gridDim.y} * blockDim.x) {
    dst[w] = src[w];
  }
}

void CopyGroups(const PagedPool& pool, const uint32_t* pages, uint32_t blocks, uint8_t* payloads,
                uint64_t stride, uint64_t body_offset, bool to_payload, Stream s) {
  if (blocks == 0) return;
  uint64_t off = body_offset;
  for (size_t g = 0; g < pool.group_base.size(); ++g) {
    const uint64_t pb = pool.group_page_bytes[g];
    const bool vec = (reinterpret_cast<uintptr_t>(pool.group_base[g]) |
                      reinterpret_cast<uintptr_t>(payloads) | pb | stride | off) %
                         16 ==
                     0;
    const dim3 grid(blocks, 8);
    if (vec) {
      CopyGroupKernel<uint4>
          <<<grid, 256, 0, s>>>(pool.group_base[g], pb, pages, payloads, stride, off, to_payload);
    } else {
      CopyGroupKernel<uint8_t>
          <<<grid, 256, 0, s>>>(pool.group_base[g], pb, pages, payloads, stride, off, to_payload);
    }
    CheckLaunch("CopyGroupKernel");
    off += pb;
  }
}

}  // namespace

// ---- Host API ----------------------------------------------------------------

void GatherBlocks(const PagedPool& pool, const uint32_t* pages, uint32_t blocks,
                  const PayloadBuffers& payloads, Stream s) {
  CopyGroups(pool, pages, blocks, payloads.base, payloads.stride, payloads.body_offset, true, s);
}

void ScatterBlocks(const PayloadBuffers& payloads, const uint32_t* pages, uint32_t blocks,
                   const PagedPool& pool, Stream s) {
  CopyGroups(pool, pages, blocks, payloads.base, payloads.stride, payloads.body_offset, false, s);
}

}  // namespace strata::kernels::cuda

// Block copy between the worker's paged block pool and the store's payload
// buffers (DESIGN §8).
//
// Pool: one page array per layer group; group g's pages are
// group_page_bytes[g] bytes each, page p at group_base[g] + p * that. A
// block occupies the same page id in every group (one block table, as in
// paged-attention engines).
// Payload: block i's payload starts at payloads + i * payload_stride; its
// body (after body_offset header bytes) holds the groups back to back, group
// 0 first: layer-group-major, the order a fetch completes in.
#pragma once

#include <cstdint>
#include <span>

namespace strata::kernels {

struct PagedPool {
  std::span<uint8_t* const> group_base;
  std::span<const uint64_t> group_page_bytes;
};

struct PayloadBuffers {
  uint8_t* base = nullptr;
  uint64_t stride = 0;       // bytes from one block's payload to the next
  uint64_t body_offset = 0;  // header bytes before group 0
};

// Offset of group g inside a payload.
uint64_t GroupOffset(const PagedPool& pool, const PayloadBuffers& payloads, uint32_t g);

// pool -> payloads, every group, for blocks at pages[0..n).
void GatherBlocks(const PagedPool& pool, std::span<const uint32_t> pages,
                  const PayloadBuffers& payloads);
// payloads -> pool, every group.
void ScatterBlocks(const PayloadBuffers& payloads, std::span<const uint32_t> pages,
                   const PagedPool& pool);
// payloads -> pool for one group: lets a worker place group g as soon as it
// has been fetched and verified.
void ScatterGroup(const PayloadBuffers& payloads, uint32_t group, std::span<const uint32_t> pages,
                  const PagedPool& pool);

}  // namespace strata::kernels

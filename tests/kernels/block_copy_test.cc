// Block copy: gather from a paged pool into layer-group-major payloads and
// scatter back (all groups, and group by group), byte for byte.
#include "strata/kernels/block_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace strata::kernels {
namespace {

TEST(BlockCopyTest, GatherScatterRoundTrip) {
  const std::vector<uint64_t> page_bytes = {96, 48, 80};
  const uint32_t pages = 10;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> base;
  for (uint64_t b : page_bytes) {
    storage.emplace_back(pages * b);
    for (size_t i = 0; i < storage.back().size(); ++i)
      storage.back()[i] = static_cast<uint8_t>(i * 7 + b);
    base.push_back(storage.back().data());
  }
  const PagedPool pool{base, page_bytes};
  const std::vector<uint32_t> blocks = {7, 2, 9};
  const uint64_t header = 64, stride = 64 + 96 + 48 + 80 + 16;  // 16 bytes of slack per payload
  std::vector<uint8_t> payloads(blocks.size() * stride, 0xee);
  const PayloadBuffers buf{payloads.data(), stride, header};
  GatherBlocks(pool, blocks, buf);
  EXPECT_EQ(GroupOffset(pool, buf, 2), 64u + 96 + 48);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const uint8_t* p = payloads.data() + b * stride;
    EXPECT_EQ(p[0], 0xee);  // the header is not touched
    uint64_t off = header;
    for (size_t g = 0; g < page_bytes.size(); ++g) {
      EXPECT_EQ(0, std::memcmp(p + off, base[g] + blocks[b] * page_bytes[g], page_bytes[g]))
          << b << g;
      off += page_bytes[g];
    }
    EXPECT_EQ(p[off], 0xee);  // nor the slack after the body
  }
  // Scatter into a second pool at other pages, group by group and whole.
  std::vector<std::vector<uint8_t>> storage2;
  std::vector<uint8_t*> base2;
  for (uint64_t b : page_bytes) {
    storage2.emplace_back(pages * b, 0);
    base2.push_back(storage2.back().data());
  }
  const PagedPool pool2{base2, page_bytes};
  const std::vector<uint32_t> other = {0, 5, 3};
  ScatterGroup(buf, 1, other, pool2);
  EXPECT_EQ(0, std::memcmp(base2[1] + 5 * 48, base[1] + 2 * 48, 48));
  EXPECT_EQ(base2[0][5 * 96], 0);  // other groups untouched so far
  ScatterBlocks(buf, other, pool2);
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t g = 0; g < page_bytes.size(); ++g) {
      EXPECT_EQ(0, std::memcmp(base2[g] + other[b] * page_bytes[g],
                               base[g] + blocks[b] * page_bytes[g], page_bytes[g]));
    }
  }
}

}  // namespace
}  // namespace strata::kernels

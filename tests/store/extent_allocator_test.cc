// The extent allocator against a simple model: random allocate/free keeps
// exact accounting, never overlaps, and coalesces back to one free extent.
#include "util/extent_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "store/dram_arena.h"

namespace strata {
namespace {

TEST(ExtentAllocatorTest, RoundsToGranulesAndAccountsExactly) {
  ExtentAllocator a(1 << 20, 4096);
  auto e1 = a.Allocate(1);
  ASSERT_TRUE(e1.has_value());
  EXPECT_EQ(e1->length, 4096u);
  auto e2 = a.Allocate(227'840 + 64);
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(e2->length, 56u * 4096);  // 227,904 B -> 55.6 granules
  EXPECT_EQ(a.used_bytes(), 57u * 4096);
  EXPECT_EQ(a.allocated_extents(), 2u);
  a.Free(*e1);
  a.Free(*e2);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_TRUE(a.CheckConsistency());
  EXPECT_FALSE(a.Allocate(0).has_value());
}

TEST(ExtentAllocatorTest, FillsCompletelyThenRefuses) {
  ExtentAllocator a(64 * 4096, 4096);
  std::vector<Extent> all;
  while (auto e = a.Allocate(4096)) all.push_back(*e);
  EXPECT_EQ(all.size(), 64u);
  EXPECT_EQ(a.free_bytes(), 0u);
  a.Free(all[10]);
  a.Free(all[11]);
  auto two = a.Allocate(8192);  // the two freed neighbours coalesced
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->offset, 10u * 4096);
  EXPECT_FALSE(a.Allocate(4096).has_value());
  EXPECT_TRUE(a.CheckConsistency());
}

TEST(ExtentAllocatorTest, RandomOpsMatchModel) {
  constexpr uint64_t kCap = 8 << 20;
  ExtentAllocator a(kCap, 512);
  std::mt19937_64 rng(1234);
  std::map<uint64_t, Extent> live;  // offset -> extent
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const uint64_t bytes = 1 + rng() % (rng() % 8 == 0 ? 300'000 : 20'000);
      auto e = a.Allocate(bytes);
      if (!e) continue;
      ASSERT_GE(e->length, bytes);
      ASSERT_LE(e->offset + e->length, kCap);
      // No overlap with neighbours.
      auto next = live.lower_bound(e->offset);
      if (next != live.end()) {
        ASSERT_LE(e->offset + e->length, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.length, e->offset);
      }
      live[e->offset] = *e;
      used += e->length;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      used -= it->second.length;
      a.Free(it->second);
      live.erase(it);
    }
    ASSERT_EQ(a.used_bytes(), used);
    if (step % 1000 == 0) {
      ASSERT_TRUE(a.CheckConsistency()) << "step " << step;
    }
  }
  for (auto& [off, e] : live) a.Free(e);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_TRUE(a.CheckConsistency());
  auto whole = a.Allocate(kCap);  // everything coalesced back into one run
  EXPECT_TRUE(whole.has_value());
}

TEST(ExtentAllocatorDeathTest, DoubleFreeAborts) {
  ExtentAllocator a(1 << 16, 4096);
  auto e = a.Allocate(4096).value();
  a.Free(e);
  EXPECT_DEATH(a.Free(e), "not allocated");
}

TEST(DramArenaTest, MapsAndServesExtents) {
  DramArenaOptions o;
  o.capacity_bytes = 4 << 20;
  o.prefault = true;
  auto arena = DramArena::Create(o);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  auto e = (*arena)->Allocate(10'000).value();
  auto bytes = (*arena)->Bytes(e, 10'000);
  std::fill(bytes.begin(), bytes.end(), std::byte{0xab});
  EXPECT_EQ(bytes[9'999], std::byte{0xab});
  EXPECT_EQ((*arena)->used_bytes(), 12'288u);
  (*arena)->Free(e);
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  o.granule_bytes = 3000;  // not a power of two
  EXPECT_EQ(DramArena::Create(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata

// GhostTable: what a policy remembers of the keys it evicted, oldest
// forgotten first, whether sized up front or grown on demand.
#include "eviction/ghost_table.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace strata {
namespace {

// Adds keys 1..n (value = key * 10, tag = key % kTags) under `limit`.
void AddKeys(GhostTable& t, uint64_t n, size_t limit) {
  for (uint64_t k = 1; k <= n; ++k) {
    t.Add(k, static_cast<uint8_t>(k % GhostTable::kTags), k * 10, limit);
  }
}

TEST(GhostTableTest, RemembersUpToItsLimitAndForgetsTheOldestFirst) {
  for (size_t expected_live : {size_t{0}, size_t{1000}, size_t{65536}}) {
    GhostTable t(expected_live);
    // Far past the initial size when unsized: the table grows on the way.
    AddKeys(t, 5000, 3000);
    EXPECT_EQ(t.live(), 3000u) << expected_live;
    size_t per_tag = 0;
    for (uint8_t tag = 0; tag < GhostTable::kTags; ++tag) per_tag += t.count(tag);
    EXPECT_EQ(per_tag, 3000u);
    // Keys 1..2000 were the oldest: gone. 2001..5000 remembered.
    EXPECT_FALSE(t.Take(1).has_value());
    EXPECT_FALSE(t.Take(2000).has_value());
    for (uint64_t k = 2001; k <= 5000; k += 499) {
      const auto r = t.Take(k);
      ASSERT_TRUE(r.has_value()) << k;
      EXPECT_EQ(r->value, k * 10);
      EXPECT_EQ(r->tag, k % GhostTable::kTags);
      EXPECT_FALSE(t.Take(k).has_value()) << "taken once";
    }
  }
}

TEST(GhostTableTest, ReAddingAKeyReplacesItAndMakesItTheYoungest) {
  GhostTable t(16);
  AddKeys(t, 4, 4);    // 1 2 3 4
  t.Add(1, 3, 99, 4);  // 2 3 4 1
  t.Add(5, 0, 50, 4);  // 3 4 1 5: 2 is forgotten, not 1
  EXPECT_EQ(t.live(), 4u);
  EXPECT_FALSE(t.Take(2).has_value());
  const auto one = t.Take(1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->value, 99u);
  EXPECT_EQ(one->tag, 3u);
  EXPECT_TRUE(t.Take(3).has_value());
}

TEST(GhostTableTest, KeyZeroIsRemembered) {
  GhostTable t;
  t.Add(0, 1, 7, 8);  // 0 marks an empty slot inside: must still be found
  const auto r = t.Take(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->value, 7u);
  EXPECT_EQ(t.live(), 0u);
}

}  // namespace
}  // namespace strata

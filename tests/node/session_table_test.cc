// The node's data-plane sessions: bounded per tenant and in all, so one
// tenant's Hello loop never pushes another tenant's sessions out.
#include <gtest/gtest.h>

#include <vector>

#include "node/node_service.h"

namespace strata {
namespace {

TEST(SessionTableTest, ATenantOverItsBoundLosesOnlyItsOwnOldestSessions) {
  SessionTable table(/*per_tenant=*/4, /*capacity=*/100);
  const Principal a{"tenant-a", Role::kRead}, b{"tenant-b", Role::kWrite};
  const uint64_t b_session = table.Open(b);
  std::vector<uint64_t> a_sessions;
  a_sessions.reserve(10);
  for (int i = 0; i < 10; ++i) a_sessions.push_back(table.Open(a));
  ASSERT_TRUE(table.Find(b_session).has_value());
  EXPECT_EQ(table.Find(b_session)->ns, "tenant-b");
  for (size_t i = 0; i < 6; ++i) EXPECT_FALSE(table.Find(a_sessions[i]).has_value()) << i;
  for (size_t i = 6; i < 10; ++i) EXPECT_TRUE(table.Find(a_sessions[i]).has_value()) << i;
  EXPECT_EQ(table.size(), 5u);
}

TEST(SessionTableTest, AtTheGlobalBoundTheLargestTenantGivesWay) {
  SessionTable table(/*per_tenant=*/8, /*capacity=*/10);
  std::vector<uint64_t> small;
  small.reserve(3);
  for (int t = 0; t < 3; ++t) small.push_back(table.Open({"t" + std::to_string(t), Role::kRead}));
  std::vector<uint64_t> big;
  big.reserve(8);
  for (int i = 0; i < 8; ++i) big.push_back(table.Open({"big", Role::kRead}));
  EXPECT_EQ(table.size(), 10u);
  for (uint64_t s : small) EXPECT_TRUE(table.Find(s).has_value());
  EXPECT_FALSE(table.Find(big[0]).has_value());
  EXPECT_TRUE(table.Find(big[7]).has_value());
}

}  // namespace
}  // namespace strata

// The trace replay against a real strata-node process: the node, configured
// like the in-process store, gives the same hits block for block, with
// metadata-only and full-payload blocks; without the replay's layout it
// refuses with a message that says which setting is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "node_process.h"
#include "strata/trace/reference_policies.h"
#include "strata/trace/replay.h"
#include "strata/trace/trace_generator.h"

namespace strata::trace {
namespace {

using strata::testing::kTokenA;
using strata::testing::NodeProcess;

class TraceNodeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = strata::testing::TempDir("trace-node"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A node holding `blocks` replay blocks, evicting on demand with `policy`.
  std::unique_ptr<NodeProcess> StartNode(uint64_t blocks, const std::string& policy, bool full,
                                         bool with_layout = true) {
    NodeProcess::Options no;
    no.settings = {
        "dram_bytes=" + std::to_string(ReplayNodeDramBytes(blocks * kTraceBlockTokens, full)),
        "high_watermark=1", "low_watermark=1", "max_held_share_per_namespace=1",
        "eviction_policy=" + policy};
    if (with_layout) no.settings.push_back("extra_layouts=" + FormatLayoutSpec(ReplayLayout(full)));
    std::string error;
    auto node = NodeProcess::Start(dir_, no, &error);
    EXPECT_NE(node, nullptr) << error;
    return node;
  }

  static std::vector<TraceRequest> Trace() {
    TraceGeneratorOptions g;
    // Big enough (15,000 block operations) for `deadline` to learn holding
    // times and part from LRU.
    g.conversations = 300;
    g.duration_s = 900;
    return GenerateTrace(g).value();
  }

  std::string dir_;
};

TEST_F(TraceNodeTest, NodeReplayEqualsTheInProcessReplay) {
  const auto t = Trace();
  constexpr uint64_t kBlocks = 100;
  std::map<std::string, uint64_t> hits;
  for (const char* policy : {"lru", "deadline"}) {
    auto node = StartNode(kBlocks, policy, /*full=*/false);
    ASSERT_NE(node, nullptr);
    ReplayOptions o;
    o.capacity_tokens = kBlocks * kTraceBlockTokens;
    o.policy = policy;
    auto local = ReplayThroughStore(t, o);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    o.policy = ReplayOptions().policy;  // the node's own configuration decides
    o.store_uri = node->uri();
    o.token = kTokenA.token;
    auto remote = ReplayThroughStore(t, o);
    ASSERT_TRUE(remote.ok()) << policy << ": " << remote.status().ToString() << "\n" << node->Log();
    EXPECT_GT(local->hit_tokens, 0u) << policy;
    EXPECT_EQ(remote->hit_tokens, local->hit_tokens) << policy;
    EXPECT_EQ(remote->inserts, local->inserts) << policy;
    hits[policy] = remote->hit_tokens;
  }
  EXPECT_EQ(hits["lru"], SimulateLru(t, kBlocks).hit_tokens);
  EXPECT_NE(hits["deadline"], hits["lru"]);  // the node really ran its own policy
}

TEST_F(TraceNodeTest, FullPayloadReplayFetchesVerifiedBytesFromTheNode) {
  auto t = Trace();
  t.resize(60);
  constexpr uint64_t kBlocks = 24;
  auto node = StartNode(kBlocks, "lru", /*full=*/true);
  ASSERT_NE(node, nullptr);
  ReplayOptions o;
  o.capacity_tokens = kBlocks * kTraceBlockTokens;
  o.full_payload = true;
  o.policy = "lru";
  auto local = ReplayThroughStore(t, o);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  o.policy = ReplayOptions().policy;
  o.store_uri = node->uri();
  o.token = kTokenA.token;
  auto r = ReplayThroughStore(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << node->Log();
  EXPECT_GT(r->hit_tokens, 0u);
  EXPECT_EQ(r->hit_tokens, SimulateLru(t, kBlocks).hit_tokens);
  // Only verified bytes count as a hit, and the node served all of them.
  EXPECT_EQ(r->hit_tokens, local->hit_tokens);
  EXPECT_EQ(r->fetched_bytes, local->fetched_bytes);
  EXPECT_EQ(r->inserts, local->inserts);
}

TEST_F(TraceNodeTest, ANodeWithoutTheLayoutIsRefusedWithTheSettingToAdd) {
  auto node = StartNode(40, "lru", /*full=*/false, /*with_layout=*/false);
  ASSERT_NE(node, nullptr);
  ReplayOptions o;
  o.capacity_tokens = 40 * kTraceBlockTokens;
  o.store_uri = node->uri();
  o.token = kTokenA.token;
  auto r = ReplayThroughStore(Trace(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("extra_layouts=\"" + FormatLayoutSpec(ReplayLayout(false))),
            std::string::npos)
      << r.status().ToString();
}

TEST(TraceNodeOptionsTest, ANodeReplayRefusesSettingsOnlyTheNodeCanMake) {
  ReplayOptions o;
  o.capacity_tokens = 40 * kTraceBlockTokens;
  o.store_uri = "strata://127.0.0.1:1";
  o.policy = "lru";  // the node's settings, not the replay's, decide policy and tiers
  auto r = ReplayThroughStore({}, o);
  EXPECT_NE(r.status().message().find("its own configuration"), std::string::npos)
      << r.status().ToString();
  o.policy = ReplayOptions().policy;
  o.ssd_capacity_tokens = 80 * kTraceBlockTokens;
  r = ReplayThroughStore({}, o);
  EXPECT_NE(r.status().message().find("its own configuration"), std::string::npos)
      << r.status().ToString();
  o.ssd_capacity_tokens = 0;
  for (const char* uri : {"inproc://", "strata://a:1,b:2", "strata+etcd://h:2379/c"}) {
    o.store_uri = uri;
    r = ReplayThroughStore({}, o);
    EXPECT_NE(r.status().message().find("expected strata://host:port"), std::string::npos)
        << uri << ": " << r.status().ToString();
  }
}

}  // namespace
}  // namespace strata::trace

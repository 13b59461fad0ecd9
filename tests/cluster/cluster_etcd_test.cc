// The cluster client with etcd membership: three real strata-node processes
// registered in a real etcd, opened as strata+etcd://. R = 2 survives
// kill -9; the killed node leaves routing within the lease TTL; a drained
// node takes no new writes and keeps serving reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "cluster/etcd_client.h"
#include "cluster/etcd_membership.h"
#include "etcd_test_util.h"
#include "node_test_util.h"
#include "strata/membership.h"

namespace strata::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr const char* kLeaseTtl = "2s";

class ClusterEtcdTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (const char* id : {"n1", "n2", "n3"}) {
      NodeProcess::Options o;
      o.settings = {std::string("node_id=") + id, "cluster.etcd_endpoints=" + etcd_->endpoint(),
                    "cluster.name=test", std::string("cluster.lease_ttl=") + kLeaseTtl,
                    "dram_bytes=64MiB"};
      std::string error;
      auto node = NodeProcess::Start(dir_, o, &error);
      ASSERT_NE(node, nullptr) << error;
      nodes_.push_back(std::move(node));
    }
    EtcdMembershipOptions mo;
    mo.endpoints = {etcd_->endpoint()};
    mo.cluster = "test";
    auto m = OpenEtcdMembership(mo);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    membership_ = std::move(m).value();
    ASSERT_TRUE(WaitFor([&] { return membership_->Nodes().size() == 3; }, milliseconds(10000)));
  }

  // "strata+etcd://127.0.0.1:<port>/test".
  std::string Uri() const {
    std::string endpoint = etcd_->endpoint();
    endpoint.erase(0, endpoint.find("//") + 2);
    return "strata+etcd://" + endpoint + "/test";
  }

  std::unique_ptr<Store> OpenCluster(uint32_t replicas) {
    ClientOptions options;
    options.token = kTokenA.token;
    options.replication_factor = replicas;
    options.timeout = Seconds(6);
    auto store = OpenStore(Uri(), options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  size_t Held(const NodeProcess& node, std::span<const ChainKey> keys) {
    std::unique_ptr<Store> direct = Open(node, kTokenA.token);
    if (direct == nullptr) return 0;
    MatchKeysRequest req;
    req.model_id = TestModel();
    req.keys = keys;
    req.want_swa = false;
    req.independent_keys = true;
    auto m = direct->MatchKeys(req);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? m->blocks.size() : 0;
  }

  // Commits a fresh 8-block prompt; true when every block got `replicas`.
  static bool EveryBlockGetsReplicas(Store& store, uint32_t seed, uint32_t replicas) {
    const Prompt q = MakePrompt(store, 8, seed);
    auto r = store.Commit(TestModel(), Payloads(q, 0, 8, false));
    if (!r.ok()) return false;
    return std::all_of(r->replicas.begin(), r->replicas.end(),
                       [&](uint32_t n) { return n == replicas; });
  }

  std::vector<std::unique_ptr<NodeProcess>> nodes_;
  std::unique_ptr<Membership> membership_;
};

TEST_F(ClusterEtcdTest, KilledNodeLosesNoReplicatedHitAndLeavesRoutingWithinTheLeaseTtl) {
  auto store = OpenCluster(2);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 24, 21);
  auto committed = store->Commit(TestModel(), Payloads(p, 0, 24, true));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  for (size_t b = 0; b < committed->replicas.size(); ++b)
    EXPECT_EQ(committed->replicas[b], 2u) << committed->blocks[b].ToString();

  const auto killed = steady_clock::now();
  nodes_[1]->Kill();
  // Every replicated entry still hits and fetches verified bytes.
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 24u);
  Fetched f = FetchAll(*store, *m);
  EXPECT_EQ(f.outcome.blocks_ready, 24u) << f.outcome.status.ToString();
  EXPECT_TRUE(f.outcome.swa_ready);
  for (size_t b = 0; b < f.outcome.blocks_ready; ++b) EXPECT_EQ(f.blocks[b], p.blocks[b].bytes);
  EXPECT_EQ(f.swa, p.swa.bytes);

  // Out of routing once its lease ends: every new block then gets both of
  // its replicas on live nodes (while the dead node is still placed, a
  // third of them would get only one).
  uint32_t seed = 100;
  // Placement is decided when a commit starts: the first attempt that finds
  // only live nodes started after the dead one left (the commit's own time,
  // long on a loaded machine, does not count).
  auto attempt = steady_clock::now();
  const bool left = WaitFor(
      [&] {
        attempt = steady_clock::now();
        return EveryBlockGetsReplicas(*store, ++seed, 2);
      },
      milliseconds(8000));
  ASSERT_TRUE(left);
  // etcd checks leases every 500 ms, a keep-alive may have renewed it just
  // before the kill, and the watch takes a moment to tell us.
  EXPECT_LE(attempt - killed, milliseconds(2000 + 2000));
}

TEST_F(ClusterEtcdTest, ReplicationFactorFollowsEtcdWithoutReopening) {
  auto store = OpenCluster(0);  // R from etcd: unset, so 1
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 12, 41);
  auto committed = store->Commit(TestModel(), Payloads(p, 0, 12, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  for (uint32_t r : committed->replicas) EXPECT_EQ(r, 1u);

  cluster::EtcdClientOptions eo;
  eo.endpoints = {etcd_->endpoint()};
  auto etcd = cluster::EtcdClient::Open(eo);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  ASSERT_TRUE(
      (*etcd)->Put(cluster::SettingKey("test", cluster::kReplicationFactorSetting), "2").ok());
  uint32_t seed = 200;
  EXPECT_TRUE(
      WaitFor([&] { return EveryBlockGetsReplicas(*store, ++seed, 2); }, milliseconds(5000)));
  // Blocks written with one replica still hit: their first replica is
  // asked first.
  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 12u);
}

TEST_F(ClusterEtcdTest, DrainedNodeTakesNoNewWritesAndServesReadsUntilItLeaves) {
  auto store = OpenCluster(1);
  ASSERT_NE(store, nullptr);
  const Prompt before = MakePrompt(*store, 24, 31);
  CommitAll(*store, before);
  const std::span<const ChainKey> before_keys(before.keys.data() + 1, 24);
  size_t drained = 0;
  while (drained < 3 && Held(*nodes_[drained], before_keys) == 0) ++drained;
  ASSERT_LT(drained, 3u);

  v1::DrainResponse resp;
  ASSERT_TRUE(RawCall(*nodes_[drained], kTokenOperator.token, [&](auto channel, auto* ctx) {
                return v1::Admin::NewStub(channel)->Drain(ctx, v1::DrainRequest(), &resp);
              }).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const NodeInfo& n : membership_->Nodes()) {
          if (n.draining) return true;
        }
        return false;
      },
      milliseconds(5000)));
  // Give the store's own watch the same chance.
  std::this_thread::sleep_for(milliseconds(300));

  const Prompt after = MakePrompt(*store, 24, 32);
  auto committed = store->Commit(TestModel(), Payloads(after, 0, 24, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  for (const Status& st : committed->blocks) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Held(*nodes_[drained], std::span<const ChainKey>(after.keys.data() + 1, 24)), 0u);

  auto m = MatchPrompt(*store, before);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 24u);
  Fetched f = FetchAll(*store, *m);
  EXPECT_EQ(f.outcome.blocks_ready, 24u) << f.outcome.status.ToString();
  for (size_t b = 0; b < f.outcome.blocks_ready; ++b) {
    EXPECT_EQ(f.blocks[b], before.blocks[b].bytes);
  }
}

TEST(ClusterEtcdUriTest, MalformedAndUnreachableAreRefused) {
  ClientOptions options;
  options.token = kTokenA.token;
  for (const char* uri : {"strata+etcd://127.0.0.1:2379", "strata+etcd://127.0.0.1:2379/",
                          "strata+etcd:///test", "strata+etcd://nohost/test"}) {
    EXPECT_EQ(OpenStore(uri, options).status().code(), StatusCode::kInvalidArgument) << uri;
  }
  // Nobody listens there: etcd is unreachable, said at once.
  const std::string dead = "strata+etcd://127.0.0.1:" + std::to_string(FreePort()) + "/test";
  EXPECT_EQ(OpenStore(dead, options).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata::testing

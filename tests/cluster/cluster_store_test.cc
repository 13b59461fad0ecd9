// The cluster client against three real strata-node processes on loopback:
// round trip, placement across real nodes, replication surviving kill -9,
// fetch failover within the deadline, drain, join, and a node that is down.
#include "cluster/cluster_store.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cluster/placement.h"
#include "node/node.h"
#include "node_test_util.h"
#include "sanitizers.h"
#include "strata/layout.h"

namespace strata::testing {
namespace {

// The cluster client's deadlines, and the waits checked against them.
constexpr int kSlowdown = kUnderTsan ? 3 : 1;
std::chrono::nanoseconds Within(Nanos deadline) {
  return std::chrono::nanoseconds(deadline * kSlowdown);
}

// A membership the test changes by hand, calling listeners as etcd's watch
// would.
class ListMembership final : public Membership {
 public:
  explicit ListMembership(std::vector<NodeInfo> nodes) : nodes_(std::move(nodes)) {}
  std::vector<NodeInfo> Nodes() const override {
    std::lock_guard lock(mu_);
    return nodes_;
  }
  ClusterSettings Settings() const override { return {}; }
  uint64_t Subscribe(Listener listener) override {
    std::lock_guard lock(mu_);
    listeners_[++next_] = std::move(listener);
    return next_;
  }
  void Unsubscribe(uint64_t id) override {
    std::lock_guard lock(mu_);
    listeners_.erase(id);
  }
  void Set(std::vector<NodeInfo> nodes) {
    std::lock_guard lock(mu_);
    nodes_ = std::move(nodes);
    for (auto& [id, listener] : listeners_) listener(nodes_);
  }

 private:
  mutable std::mutex mu_;
  std::vector<NodeInfo> nodes_;
  std::map<uint64_t, Listener> listeners_;
  uint64_t next_ = 0;
};

// This process's UCX contexts use only these transports while it lives.
// Over shared memory a killed node's arena stays mapped here (its bytes
// still verify); over TCP its death is a failed transfer, which is what the
// failover tests need.
class ScopedUcxTransports {
 public:
  explicit ScopedUcxTransports(const char* tls) {
    if (const char* old = std::getenv("UCX_TLS")) old_ = old;
    setenv("UCX_TLS", tls, 1);
  }
  ~ScopedUcxTransports() {
    if (old_.has_value()) {
      setenv("UCX_TLS", old_->c_str(), 1);
    } else {
      unsetenv("UCX_TLS");
    }
  }

 private:
  std::optional<std::string> old_;
};

NodeInfo Info(const NodeProcess& node, bool draining = false) {
  return {node.target(), node.target(), draining};
}

class ClusterStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("cluster");
    for (int i = 0; i < 3; ++i) {
      std::string error;
      auto node = NodeProcess::Start(dir_, {}, &error);
      ASSERT_NE(node, nullptr) << error;
      nodes_.push_back(std::move(node));
    }
  }

  std::vector<NodeInfo> Infos() const {
    std::vector<NodeInfo> out;
    for (const auto& n : nodes_) out.push_back(Info(*n));
    return out;
  }

  // `timeout` bounds each cluster call (times kSlowdown).
  std::unique_ptr<Store> OpenCluster(std::shared_ptr<Membership> membership, uint32_t replicas,
                                     Nanos timeout = Seconds(10)) {
    ClientOptions options;
    options.token = kTokenA.token;
    options.replication_factor = replicas;
    options.timeout = timeout * kSlowdown;
    auto store = OpenClusterStore(std::move(membership), options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // Which of `keys` the node holds, asked of the node alone.
  std::set<ChainKey> Held(const NodeProcess& node, std::span<const ChainKey> keys) {
    std::unique_ptr<Store> direct = Open(node, kTokenA.token);
    if (direct == nullptr) return {};
    MatchKeysRequest req;
    req.model_id = TestModel();
    req.keys = keys;
    req.want_swa = false;
    req.independent_keys = true;
    auto m = direct->MatchKeys(req);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    std::set<ChainKey> out;
    if (m.ok()) {
      for (const BlockMatch& b : m->blocks) out.insert(b.key);
    }
    return out;
  }

  // Read leases end on the nodes without a round trip (queued releases
  // travel with a node client's next call, or its flusher's).
  void ExpectNoReadLeasesSoon() const {
    for (const auto& node : nodes_) {
      uint64_t live = 1;
      for (int i = 0; i < 200 && live != 0; ++i) {
        live = NodeStats(*node).read_leases();
        if (live != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(live, 0u) << node->target();
    }
  }

  // The first `n` GLOBAL_KV blocks of `p`, to reserve.
  static std::vector<CommitBlock> Blocks(const Prompt& p, size_t n) {
    std::vector<CommitBlock> blocks;
    for (const CommitPayload& c : Payloads(p, 0, n, false)) blocks.push_back(c.block);
    return blocks;
  }

  // The node a key's first replica goes to.
  size_t Owner(const ChainKey& key) const {
    size_t best = 0;
    for (size_t i = 1; i < nodes_.size(); ++i) {
      if (PlacementScore(key, nodes_[i]->target()) > PlacementScore(key, nodes_[best]->target())) {
        best = i;
      }
    }
    return best;
  }

  // How many of the prompt's blocks go first to `node`, and the first that
  // does (the prompt's block count if none).
  size_t OwnedBy(const Prompt& p, size_t node) const {
    size_t n = 0;
    for (size_t b = 1; b < p.keys.size(); ++b) n += Owner(p.keys[b]) == node ? 1 : 0;
    return n;
  }
  size_t FirstOwnedBy(const Prompt& p, size_t node) const {
    size_t b = 0;
    while (b + 1 < p.keys.size() && Owner(p.keys[b + 1]) != node) ++b;
    return b;
  }

  static void ExpectSameBytes(const Prompt& p, const Fetched& f, size_t blocks) {
    ASSERT_GE(f.blocks.size(), blocks);
    for (size_t b = 0; b < blocks; ++b) {
      ASSERT_EQ(f.blocks[b], p.blocks[b].bytes) << "block " << b;
    }
  }

  std::string dir_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
};

TEST_F(ClusterStoreTest, RoundTripThroughTheClusterUri) {
  ClientOptions options;
  options.token = kTokenA.token;
  const std::string uri =
      "strata://" + nodes_[0]->target() + "," + nodes_[1]->target() + "," + nodes_[2]->target();
  auto opened = OpenStore(uri, options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const Prompt p = MakePrompt(store, 24, 1);
  auto payloads = Payloads(p, 0, 24, true);
  auto committed = store.Commit(TestModel(), payloads);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_EQ(committed->blocks.size(), 25u);
  for (size_t b = 0; b < 25; ++b) {
    EXPECT_TRUE(committed->blocks[b].ok()) << committed->blocks[b].ToString();
    EXPECT_EQ(committed->replicas[b], 1u);
  }

  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 24u);
  ASSERT_TRUE(m->swa.has_value());
  EXPECT_EQ(m->swa->boundary_blocks, 24u);
  EXPECT_EQ(m->prefix_key, p.keys[24]);
  EXPECT_NE(m->lease, 0u);
  EXPECT_TRUE(store.RenewLease(m->lease, Seconds(20)).ok());
  Fetched f = FetchAll(store, *m);
  ASSERT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 24u);
  EXPECT_TRUE(f.outcome.swa_ready);
  ExpectSameBytes(p, f, 24);
  EXPECT_EQ(f.swa, p.swa.bytes);
  std::set<uint32_t> ready;
  size_t groups_done = 0;
  size_t swa_reported = 0;
  size_t swa_at = 0;
  size_t last_group_at = 0;
  for (size_t i = 0; i < f.events.size(); ++i) {
    const FetchEvent& e = f.events[i];
    if (e.type == FetchEvent::Type::kBlockReady) ready.insert(e.block);
    if (e.type == FetchEvent::Type::kLayerGroupDone) {
      EXPECT_EQ(e.group, groups_done++);  // in order, once each
      EXPECT_EQ(e.block, 24u);
      last_group_at = i;
    }
    if (e.type == FetchEvent::Type::kSwaReady) {
      ++swa_reported;
      swa_at = i;
    }
  }
  EXPECT_EQ(ready.size(), 24u);
  EXPECT_EQ(groups_done, GlobalKv().groups.size());
  // The SWA state, once, as soon as its node verified it: ahead of the
  // prefix's last layer group (that node sends it before its blocks).
  EXPECT_EQ(swa_reported, 1u);
  EXPECT_LT(swa_at, last_group_at);
  EXPECT_TRUE(store.Abort(m->lease).ok());
  EXPECT_TRUE(store.Abort(m->lease).ok());  // twice is fine
  EXPECT_EQ(store.RenewLease(m->lease, Seconds(1)).code(), StatusCode::kLeaseExpired);

  // Release ends the nodes' read leases without a round trip: soon after,
  // no node holds one.
  auto released = MatchPrompt(store, p);
  ASSERT_TRUE(released.ok());
  store.Release(released->lease);
  EXPECT_EQ(store.RenewLease(released->lease, Seconds(1)).code(), StatusCode::kLeaseExpired);
  ExpectNoReadLeasesSoon();

  // The blocks are spread over the nodes, each on exactly one (R = 1).
  const std::span<const ChainKey> keys(p.keys.data() + 1, 24);
  size_t total = 0;
  for (const auto& node : nodes_) {
    const size_t held = Held(*node, keys).size();
    EXPECT_GT(held, 0u) << node->target();
    total += held;
  }
  EXPECT_EQ(total, 24u);

  // Committing again is an idempotent no-op; a prompt that shares only a
  // prefix hits that prefix.
  auto again = store.Commit(TestModel(), payloads);
  ASSERT_TRUE(again.ok());
  for (const Status& st : again->blocks) EXPECT_TRUE(st.ok()) << st.ToString();
  Prompt q = p;
  for (size_t t = 10 * 256; t < q.tokens.size(); ++t) q.tokens[t] ^= 1;
  auto mq = MatchPrompt(store, q, false);
  ASSERT_TRUE(mq.ok());
  EXPECT_EQ(mq->blocks.size(), 10u);
  EXPECT_FALSE(mq->swa.has_value());
  EXPECT_EQ(mq->lease, 0u);
  // A fetch without a lease takes (and drops) its own.
  Fetched fq = FetchAll(store, *mq);
  EXPECT_EQ(fq.outcome.blocks_ready, 10u) << fq.outcome.status.ToString();
  ExpectSameBytes(p, fq, 10);
}

TEST_F(ClusterStoreTest, ReserveAndPublishWriteEveryReplica) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 2);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 12, 2);
  std::vector<CommitBlock> blocks = Blocks(p, 12);
  auto r = store->Reserve(TestModel(), blocks, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(r->write_lease, 0u);
  std::vector<uint64_t> sums;
  for (size_t b = 0; b < 12; ++b) {
    ASSERT_EQ(r->blocks[b].state, ReserveState::kReserved);
    std::copy(p.blocks[b].bytes.begin(), p.blocks[b].bytes.end(), r->blocks[b].buffer.begin());
    sums.push_back(p.blocks[b].checksum);
  }
  sums[11] ^= 1;  // block 11 is corrupt: refused on every replica
  auto published = store->Publish(r->write_lease, sums);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  for (size_t b = 0; b < 11; ++b) {
    EXPECT_TRUE(published->blocks[b].ok()) << published->blocks[b].ToString();
    EXPECT_EQ(published->replicas[b], 2u);
  }
  EXPECT_EQ(published->blocks[11].code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(published->replicas[11], 0u);
  EXPECT_EQ(store->Publish(r->write_lease, sums).status().code(), StatusCode::kNotFound);

  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 11u);
  // Aborting a reservation releases every replica's space.
  auto again = store->Reserve(TestModel(), std::span<const CommitBlock>(blocks).subspan(11), 0);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(store->Abort(again->write_lease).ok());
  for (const auto& node : nodes_) EXPECT_EQ(NodeStats(*node).reserved_entries(), 0u);
}

TEST_F(ClusterStoreTest, AnOversizedBlockIsRefusedBeforeAnyNodeIsAsked) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 12, 4);
  std::vector<CommitBlock> blocks = Blocks(p, 12);
  // A block placed on another node than block 0's: that node refuses its
  // call while block 0's node answers.
  size_t other = 1;
  while (other < blocks.size() && Owner(p.keys[other]) == Owner(p.keys[0])) ++other;
  ASSERT_LT(other, blocks.size());
  blocks[other].payload_bytes = uint64_t{1} << 62;
  auto r = store->Reserve(TestModel(), blocks, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  for (const auto& node : nodes_) EXPECT_EQ(NodeStats(*node).reserved_entries(), 0u);
}

TEST_F(ClusterStoreTest, NodesWhoseHitsLiePastThePrefixKeepNoLease) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 12, 5);
  // Every block but the first: the nodes hold hits, the prefix is empty.
  auto committed = store->Commit(TestModel(), Payloads(p, 1, 12, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_GT(committed->published, 0u);
  auto m = MatchPrompt(*store, p, /*lease=*/true);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->blocks.empty());
  // Released without a round trip: soon after, no node holds a lease.
  ExpectNoReadLeasesSoon();
  store->Release(m->lease);
}

TEST_F(ClusterStoreTest, ALeaseLastsAsLongAsTheNodeLeasesItKeeps) {
  // A fourth node whose read leases are brief.
  std::string error;
  auto brief = NodeProcess::Start(dir_, {.settings = {"read_lease_ttl=1s"}}, &error);
  ASSERT_NE(brief, nullptr) << error;
  nodes_.push_back(std::move(brief));
  const size_t brief_node = nodes_.size() - 1;
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1);
  ASSERT_NE(store, nullptr);
  // A prompt whose first two blocks go to the other nodes, and a later one
  // to the brief node.
  Prompt p;
  bool found = false;
  for (uint32_t seed = 0; seed < 500 && !found; ++seed) {
    p = MakePrompt(*store, 12, 900 + seed);
    found = Owner(p.keys[1]) != brief_node && Owner(p.keys[2]) != brief_node &&
            OwnedBy(p, brief_node) > 0;
  }
  ASSERT_TRUE(found);
  // Every block but the second: the prefix is the first block, and the
  // brief node's hits all lie past it.
  for (auto [first, last] : {std::pair<size_t, size_t>{0, 1}, {2, 12}}) {
    auto committed = store->Commit(TestModel(), Payloads(p, first, last, false));
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  }
  const Nanos before = SteadyClock().Now();
  auto m = MatchPrompt(*store, p, /*lease=*/true);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 1u);
  ASSERT_NE(m->lease, 0u);
  // The brief node's lease was released: it does not shorten the rest.
  EXPECT_GT(m->lease_expiry - before, Seconds(5));
  store->Release(m->lease);
  ExpectNoReadLeasesSoon();
}

TEST_F(ClusterStoreTest, AReservationLeftAlonePastItsLeaseIsDroppedNotPublished) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 2);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 4, 3);
  std::vector<CommitBlock> blocks = Blocks(p, 4);
  const auto first_two = std::span<const CommitBlock>(blocks).first(2);
  auto abandoned = store->Reserve(TestModel(), first_two, 100 * kNanosPerMilli);
  ASSERT_TRUE(abandoned.ok()) << abandoned.status().ToString();
  for (size_t b = 0; b < 2; ++b) {
    std::copy(p.blocks[b].bytes.begin(), p.blocks[b].bytes.end(),
              abandoned->blocks[b].buffer.begin());
  }
  // Past expiry plus one more lease TTL the nodes have dropped the
  // reservation, and the next reserve reclaims what the clients staged for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto next = store->Reserve(TestModel(), std::span<const CommitBlock>(blocks).subspan(2), 0);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  const std::vector<uint64_t> sums = {p.blocks[0].checksum, p.blocks[1].checksum};
  auto late = store->Publish(abandoned->write_lease, sums);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound) << late.status().ToString();
  // The live reservation is untouched and publishes on every replica.
  std::vector<uint64_t> next_sums;
  for (size_t b = 2; b < 4; ++b) {
    std::copy(p.blocks[b].bytes.begin(), p.blocks[b].bytes.end(),
              next->blocks[b - 2].buffer.begin());
    next_sums.push_back(p.blocks[b].checksum);
  }
  auto published = store->Publish(next->write_lease, next_sums);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_TRUE(published->blocks[b].ok()) << published->blocks[b].ToString();
    EXPECT_EQ(published->replicas[b], 2u);
  }
  for (const auto& node : nodes_) EXPECT_EQ(NodeStats(*node).reserved_entries(), 0u);
}

TEST_F(ClusterStoreTest, BlocksSpreadEvenlyOverRealNodes) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1);
  ASSERT_NE(store, nullptr);
  std::vector<ChainKey> keys;
  for (uint32_t prompt = 0; prompt < 9; ++prompt) {
    const Prompt p = MakePrompt(*store, 100, 100 + prompt);
    CommitAll(*store, p, false);
    keys.insert(keys.end(), p.keys.begin() + 1, p.keys.end());
  }
  // 900 blocks of 227,840 B; placement_test checks 10,000 keys.
  for (const auto& node : nodes_) {
    size_t held = 0;
    for (size_t at = 0; at < keys.size(); at += 300) {
      held += Held(*node, std::span<const ChainKey>(keys).subspan(at, 300)).size();
    }
    EXPECT_GT(held, 300 * 0.85) << node->target();
    EXPECT_LT(held, 300 * 1.15) << node->target();
  }
}

TEST_F(ClusterStoreTest, KillNineWithTwoReplicasLosesNoHit) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 2, Seconds(4));
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 32, 3);
  auto payloads = Payloads(p, 0, 32, true);
  auto committed = store->Commit(TestModel(), payloads);
  ASSERT_TRUE(committed.ok());
  for (size_t b = 0; b < payloads.size(); ++b) EXPECT_EQ(committed->replicas[b], 2u);

  nodes_[1]->Kill();
  const auto start = std::chrono::steady_clock::now();
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 32u);
  ASSERT_TRUE(m->swa.has_value());
  Fetched f = FetchAll(*store, *m);
  EXPECT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 32u);
  EXPECT_TRUE(f.outcome.swa_ready);
  ExpectSameBytes(p, f, 32);
  EXPECT_EQ(f.swa, p.swa.bytes);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(Seconds(4)));

  // New writes still reach R replicas: the dead node's share goes to the
  // node ranked next.
  const Prompt q = MakePrompt(*store, 16, 4);
  auto more = Payloads(q, 0, 16, false);
  auto full = store->Commit(TestModel(), more);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  for (size_t b = 0; b < more.size(); ++b) {
    EXPECT_TRUE(full->blocks[b].ok()) << full->blocks[b].ToString();
    EXPECT_EQ(full->replicas[b], 2u) << b;
  }
}

TEST_F(ClusterStoreTest, InFlightFetchFailsOverToAnotherReplica) {
  const ScopedUcxTransports tcp("tcp");
  const Nanos timeout = Seconds(6);
  auto store = OpenCluster(MakeStaticMembership(Infos()), 2, timeout);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 32, 5);
  CommitAll(*store, p);
  auto m = MatchPrompt(*store, p);  // leases on every replica
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->blocks.size(), 32u);
  // The node block 0 would be read from dies between match and fetch.
  nodes_[Owner(p.keys[1])]->Kill();
  const auto start = std::chrono::steady_clock::now();
  Fetched f = FetchAll(*store, *m);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(timeout));
  EXPECT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 32u);
  EXPECT_TRUE(f.outcome.swa_ready);
  ExpectSameBytes(p, f, 32);
  EXPECT_EQ(f.swa, p.swa.bytes);
}

TEST_F(ClusterStoreTest, InFlightFetchFromAnUnreplicatedDeadNodeCutsThePrefix) {
  const ScopedUcxTransports tcp("tcp");
  const Nanos timeout = Seconds(6);
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1, timeout);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 32, 6);
  CommitAll(*store, p, false);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->blocks.size(), 32u);
  // Kill the owner of a block past the start, so a prefix survives.
  const size_t victim = Owner(p.keys[1]) == 0 ? 1 : 0;
  const size_t first_lost = FirstOwnedBy(p, victim);
  nodes_[victim]->Kill();
  const auto start = std::chrono::steady_clock::now();
  Fetched f = FetchAll(*store, *m);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(timeout));
  // No other replica: the prefix ends at the dead node's first block.
  EXPECT_EQ(f.outcome.blocks_ready, first_lost);
  EXPECT_FALSE(f.outcome.status.ok());
  ExpectSameBytes(p, f, f.outcome.blocks_ready);

  // A new match reports the dead node's blocks as misses, promptly.
  auto again = MatchPrompt(*store, p, false);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->blocks.size(), first_lost);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(2 * timeout));
}

TEST_F(ClusterStoreTest, DrainedNodeTakesNoNewWritesAndKeepsServingReads) {
  auto membership = std::make_shared<ListMembership>(Infos());
  auto store = OpenCluster(membership, 1);
  ASSERT_NE(store, nullptr);
  const Prompt before = MakePrompt(*store, 24, 7);
  CommitAll(*store, before);
  const size_t drained = Owner(before.keys[1]);
  const std::span<const ChainKey> before_keys(before.keys.data() + 1, 24);
  const size_t held_before = Held(*nodes_[drained], before_keys).size();
  ASSERT_GT(held_before, 0u);

  v1::DrainResponse resp;
  ASSERT_TRUE(RawCall(*nodes_[drained], kTokenOperator.token, [&](auto channel, auto* ctx) {
                return v1::Admin::NewStub(channel)->Drain(ctx, v1::DrainRequest(), &resp);
              }).ok());
  std::vector<NodeInfo> infos = Infos();
  infos[drained].draining = true;
  membership->Set(infos);

  const Prompt after = MakePrompt(*store, 24, 8);
  auto committed = store->Commit(TestModel(), Payloads(after, 0, 24, true));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  for (const Status& st : committed->blocks) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Held(*nodes_[drained], std::span<const ChainKey>(after.keys.data() + 1, 24)).empty());

  // Reads of what it held go on, until it leaves.
  auto m = MatchPrompt(*store, before);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 24u);
  Fetched f = FetchAll(*store, *m);
  EXPECT_EQ(f.outcome.blocks_ready, 24u) << f.outcome.status.ToString();
  ExpectSameBytes(before, f, 24);
  auto ma = MatchPrompt(*store, after, false);
  ASSERT_TRUE(ma.ok());
  EXPECT_EQ(ma->blocks.size(), 24u);
  EXPECT_TRUE(ma->swa.has_value());

  // Taken out: its blocks become misses, the rest still hit.
  infos.erase(infos.begin() + static_cast<std::ptrdiff_t>(drained));
  membership->Set(infos);
  auto gone = MatchPrompt(*store, before, false);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->blocks.size(), 0u);  // block 0 lived there
  auto still = MatchPrompt(*store, after, false);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->blocks.size(), 24u);
}

TEST_F(ClusterStoreTest, JoiningNodeTakesNewWritesAndOldEntriesStay) {
  auto membership =
      std::make_shared<ListMembership>(std::vector<NodeInfo>{Info(*nodes_[0]), Info(*nodes_[1])});
  auto store = OpenCluster(membership, 1);
  ASSERT_NE(store, nullptr);
  const Prompt old_prompt = MakePrompt(*store, 30, 9);
  CommitAll(*store, old_prompt, false);
  const std::span<const ChainKey> old_keys(old_prompt.keys.data() + 1, 30);
  const size_t on0 = Held(*nodes_[0], old_keys).size();
  const size_t on1 = Held(*nodes_[1], old_keys).size();
  EXPECT_EQ(on0 + on1, 30u);

  membership->Set(Infos());
  const Prompt fresh = MakePrompt(*store, 30, 10);
  CommitAll(*store, fresh, false);
  EXPECT_GT(Held(*nodes_[2], std::span<const ChainKey>(fresh.keys.data() + 1, 30)).size(), 0u);
  // No migration: the old entries are where they were, none on the new node.
  EXPECT_TRUE(Held(*nodes_[2], old_keys).empty());
  EXPECT_EQ(Held(*nodes_[0], old_keys).size(), on0);
  EXPECT_EQ(Held(*nodes_[1], old_keys).size(), on1);
  auto m = MatchPrompt(*store, fresh, false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 30u);
}

TEST_F(ClusterStoreTest, DeadNodeIsReportedPerBlockThenItsShareMovesToTheNextNode) {
  std::vector<NodeInfo> infos = Infos();
  auto store = OpenCluster(MakeStaticMembership(infos), 1, Seconds(4));
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 24, 11);  // a match: asks every node
  nodes_[2]->Kill();
  const auto start = std::chrono::steady_clock::now();
  // Not known down yet (a write refused says nothing: a draining node
  // refuses writes too): its blocks fail, each saying so.
  auto committed = store->Commit(TestModel(), Payloads(p, 0, 24, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  size_t lost = 0;
  for (size_t b = 0; b < 24; ++b) {
    if (Owner(p.keys[b + 1]) == 2) {
      ++lost;
      EXPECT_EQ(committed->blocks[b].code(), StatusCode::kUnavailable);
      EXPECT_EQ(committed->replicas[b], 0u);
    } else {
      EXPECT_TRUE(committed->blocks[b].ok()) << committed->blocks[b].ToString();
    }
  }
  EXPECT_GT(lost, 0u);
  // A read it does not answer marks it down.
  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const size_t first_lost = FirstOwnedBy(p, 2);
  EXPECT_EQ(m->blocks.size(), first_lost);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(Seconds(4)));

  // Known down, the node's share of the prompt goes to the nodes ranked
  // next: the worker's second commit of what it missed makes it whole,
  // which a static node list (never dropping the node) needs.
  auto second = store->Commit(TestModel(), Payloads(p, 0, 24, false));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  for (size_t b = 0; b < 24; ++b) {
    EXPECT_TRUE(second->blocks[b].ok()) << b << ": " << second->blocks[b].ToString();
  }
  const std::span<const ChainKey> keys(p.keys.data() + 1, 24);
  EXPECT_EQ(Held(*nodes_[0], keys).size() + Held(*nodes_[1], keys).size(), 24u);
  auto whole = MatchPrompt(*store, p, false);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->blocks.size(), 24u);
  Fetched f = FetchAll(*store, *whole);
  EXPECT_EQ(f.outcome.blocks_ready, 24u) << f.outcome.status.ToString();
  ExpectSameBytes(p, f, 24);

  // A client opened while the node is down knows it from the start.
  auto fresh = OpenCluster(MakeStaticMembership(infos), 1, Seconds(4));
  ASSERT_NE(fresh, nullptr);
  const Prompt q = MakePrompt(*fresh, 24, 14);
  auto first = fresh->Commit(TestModel(), Payloads(q, 0, 24, false));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->published, 24u);
}

TEST_F(ClusterStoreTest, HungNodeIsSkippedUntilAProbeFindsItAnsweringAgain) {
  // SIGSTOP keeps the node's sockets open, so a call to it hangs until its
  // deadline instead of failing at once as after kill -9.
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1, Seconds(3));
  ASSERT_NE(store, nullptr);
  // A client that knows only the hung node: with nowhere else to write,
  // its writes go to the node and say why they fail.
  auto solo = OpenCluster(MakeStaticMembership({Info(*nodes_[2])}), 1, Seconds(3));
  ASSERT_NE(solo, nullptr);
  const Prompt p = MakePrompt(*store, 24, 11);
  auto committed = store->Commit(TestModel(), Payloads(p, 0, 24, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_EQ(committed->published, 24u);
  const size_t first_hung = FirstOwnedBy(p, 2);
  ASSERT_LT(first_hung, 24u) << "the prompt needs a block on node 2";
  // Written while node 2 is skipped (within a second of its strike), so
  // made ready before.
  const Prompt q = MakePrompt(*store, 24, 12);
  const std::vector<CommitPayload> q_payloads = Payloads(q, 0, 24, false);
  ASSERT_GT(OwnedBy(q, 2), 0u);

  ASSERT_EQ(kill(nodes_[2]->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(nodes_[2]->pid()));  // a running thread may answer one more call
  // The first call waits out the node's deadline and counts as a miss...
  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), first_hung);
  // ...after which the node is skipped: its share of new blocks goes to the
  // nodes ranked next, and reads find them there without waiting for it.
  auto moved = store->Commit(TestModel(), q_payloads);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  for (size_t b = 0; b < 24; ++b) {
    EXPECT_TRUE(moved->blocks[b].ok()) << b << ": " << moved->blocks[b].ToString();
  }
  auto mq = MatchPrompt(*store, q, false);
  ASSERT_TRUE(mq.ok()) << mq.status().ToString();
  EXPECT_EQ(mq->blocks.size(), 24u);

  // The solo client strikes it the same way; its writes then fail at once.
  m = MatchPrompt(*solo, p, false);
  ASSERT_TRUE(m.ok() || m.status().code() == StatusCode::kDeadlineExceeded)
      << m.status().ToString();
  auto skipped = solo->Commit(TestModel(), q_payloads);
  ASSERT_FALSE(skipped.ok());
  EXPECT_EQ(skipped.status().code(), StatusCode::kUnavailable) << skipped.status().ToString();
  EXPECT_NE(skipped.status().message().find("not answering"), std::string::npos)
      << skipped.status().ToString();
  // Past the first second one call probes it; still hung, the wait doubles.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  (void)MatchPrompt(*solo, p, false);
  skipped = solo->Commit(TestModel(), q_payloads);
  ASSERT_FALSE(skipped.ok());
  const std::string why = skipped.status().message();
  const size_t at = why.find("skipped for another ");
  ASSERT_NE(at, std::string::npos) << why;
  EXPECT_GT(std::stoi(why.substr(at + 20)), 1000) << why;

  // Resumed, it is probed again after its back-off and serves what it held.
  ASSERT_EQ(kill(nodes_[2]->pid(), SIGCONT), 0);
  size_t served = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (served < 24 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto back = MatchPrompt(*store, p, false);
    if (back.ok()) served = back->blocks.size();
  }
  EXPECT_EQ(served, 24u);
  // What went to the next-ranked nodes in its place is found there still:
  // for a while after an outage reads ask them too.
  mq = MatchPrompt(*store, q, false);
  ASSERT_TRUE(mq.ok()) << mq.status().ToString();
  EXPECT_EQ(mq->blocks.size(), 24u);
  // Answering again, it takes its share of new blocks back.
  const Prompt r = MakePrompt(*store, 24, 13);
  auto returned = store->Commit(TestModel(), Payloads(r, 0, 24, false));
  ASSERT_TRUE(returned.ok()) << returned.status().ToString();
  EXPECT_EQ(Held(*nodes_[2], std::span<const ChainKey>(r.keys.data() + 1, 24)).size(),
            OwnedBy(r, 2));
}

// A node skipped after a strike is not asked to abort or publish, yet the
// leases the cluster held there end (its client queues them): it neither
// keeps entries pinned nor space reserved until the leases expire.
TEST_F(ClusterStoreTest, LeasesOnASkippedNodeStillEnd) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1, Seconds(2));
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 24, 21);
  auto committed = store->Commit(TestModel(), Payloads(p, 0, 24, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_LT(FirstOwnedBy(p, 2), 24u) << "the prompt needs a block on node 2";
  auto read = MatchPrompt(*store, p);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_NE(read->lease, 0u);
  auto renewed = MatchPrompt(*store, p);  // renewed while node 2 is skipped
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  const Prompt q = MakePrompt(*store, 24, 22);
  ASSERT_GT(OwnedBy(q, 2), 0u);
  const std::vector<CommitBlock> blocks = Blocks(q, 24);
  auto aborted = store->Reserve(TestModel(), std::span(blocks).first(12), 0);
  ASSERT_TRUE(aborted.ok()) << aborted.status().ToString();
  auto published = store->Reserve(TestModel(), std::span(blocks).subspan(12), 0);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  const v1::StatsResponse before = NodeStats(*nodes_[2]);
  ASSERT_EQ(before.read_leases(), 2u);
  ASSERT_GE(before.write_leases(), 1u);

  // One read waits out node 2's deadline: it is skipped for a second.
  ASSERT_EQ(kill(nodes_[2]->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(nodes_[2]->pid()));
  (void)MatchPrompt(*store, p, false);
  ASSERT_EQ(kill(nodes_[2]->pid(), SIGCONT), 0);
  EXPECT_TRUE(store->Abort(read->lease).ok());
  // Node 2's part cannot be renewed: the lease goes on without it (its
  // blocks there are lost to it), and the part ends there.
  EXPECT_FALSE(store->RenewLease(renewed->lease, Seconds(30)).ok());
  EXPECT_TRUE(store->Abort(aborted->write_lease).ok());
  std::vector<uint64_t> sums;
  for (size_t b = 12; b < 24; ++b) sums.push_back(q.blocks[b].checksum);
  auto outcome = store->Publish(published->write_lease, sums);
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();

  v1::StatsResponse after;
  for (int i = 0; i < 300; ++i) {
    after = NodeStats(*nodes_[2]);
    if (after.read_leases() == 0 && after.write_leases() == 0 && after.reserved_entries() == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(after.read_leases(), 0u);
  EXPECT_EQ(after.write_leases(), 0u);
  EXPECT_EQ(after.reserved_entries(), 0u);
}

TEST_F(ClusterStoreTest, WriteOnlyClientFindsAHungNodeBackAndReturnsItsShare) {
  auto store = OpenCluster(MakeStaticMembership(Infos()), 1, Seconds(2));
  ASSERT_NE(store, nullptr);
  // Prepared before the stop (a prompt's keys come from a match): from
  // there on this client only writes.
  const Prompt p = MakePrompt(*store, 24, 15);
  const Prompt q = MakePrompt(*store, 24, 16);
  const size_t p_on_2 = OwnedBy(p, 2);
  const size_t q_on_2 = OwnedBy(q, 2);
  ASSERT_GT(p_on_2, 0u);
  ASSERT_GT(q_on_2, 0u);

  ASSERT_EQ(kill(nodes_[2]->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(nodes_[2]->pid()));
  // A write past its deadline marks the node down...
  auto first = store->Commit(TestModel(), Payloads(p, 0, 24, false));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->published, 24 - p_on_2);
  // ...and the next writes pass it over.
  auto moved = store->Commit(TestModel(), Payloads(q, 0, 24, false));
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(moved->published, 24u);

  // Resumed, it is found answering by a write's probe, and takes its share
  // of the blocks again.
  ASSERT_EQ(kill(nodes_[2]->pid(), SIGCONT), 0);
  const std::span<const ChainKey> q_keys(q.keys.data() + 1, 24);
  size_t on_2 = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (on_2 < q_on_2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto again = store->Commit(TestModel(), Payloads(q, 0, 24, false));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    on_2 = Held(*nodes_[2], q_keys).size();
  }
  EXPECT_EQ(on_2, q_on_2);
}

// Two in-process nodes holding both replicas of a prompt. Block 1's copy on
// the node it is read from first has a corrupt layer group 1: its group 0
// verifies and is reported before group 1 fails, so the block is read again
// from the other replica. The caller may already be using group 0 in place
// (here it scribbles on it): the retry must not write it again.
TEST(ClusterFetchRetryTest, ARetryLeavesGroupsAlreadyReportedAlone) {
  const ScopedUcxTransports tcp("tcp");  // active messages: group by group
  const std::string dir = TempDir("cluster-retry");
  const std::string tokens = dir + "/tokens";
  std::ofstream(tokens) << HashToken(kTokenA.token) << " " << kTokenA.ns << " write\n";
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<NodeInfo> infos;
  for (int i = 0; i < 2; ++i) {
    NodeConfig c;
    c.listen = "127.0.0.1:0";
    c.http_listen = "";
    c.dram_bytes = 64ull << 20;
    c.tokens_file = tokens;
    auto node = Node::Start(c);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    const std::string target = "127.0.0.1:" + std::to_string((*node)->grpc_port());
    infos.push_back({target, target, false});
    nodes.push_back(std::move(node).value());
  }
  ClientOptions options;
  options.token = kTokenA.token;
  options.replication_factor = 2;
  options.timeout = Seconds(10) * kSlowdown;
  auto store = OpenClusterStore(MakeStaticMembership(infos), options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Prompt p = MakePrompt(**store, 4, 41);
  CommitAll(**store, p, /*with_swa=*/false);

  // Corrupt group 1 of block 1 on the replica read first (placement order).
  const ChainKey& key = p.keys[2];
  const size_t first =
      PlacementScore(key, infos[1].node_id) > PlacementScore(key, infos[0].node_id) ? 1 : 0;
  CacheStore& local = nodes[first]->store();
  MatchRequest direct;
  direct.model_id = TestModel();
  direct.tokens = p.tokens;
  auto held = local.Match({kTokenA.ns, Role::kRead}, direct);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_EQ(held->blocks.size(), 4u);
  auto header = ParsePayloadHeader(p.blocks[1].bytes);
  ASSERT_TRUE(header.ok());
  ASSERT_GE(header->groups.size(), 2u);
  const GroupExtent g0 = header->groups[0];
  local.ArenaRegion()[held->blocks[1].location + header->groups[1].offset] ^= std::byte{1};

  auto m = MatchPrompt(**store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 4u);
  std::vector<std::vector<std::byte>> buffers;
  FetchRequest req;
  req.match = &*m;
  for (const BlockMatch& b : m->blocks) buffers.emplace_back(b.payload_bytes);
  for (auto& b : buffers) req.block_buffers.emplace_back(b);
  std::map<uint32_t, int> reported;  // block 1's groups
  int block_1_ready = 0;
  req.on_event = [&](const FetchEvent& e) {
    if (e.block != 1) return;
    if (e.type == FetchEvent::Type::kBlockReady) ++block_1_ready;
    if (e.type != FetchEvent::Type::kGroupReady) return;
    ++reported[e.group];
    if (e.group == 0) std::memset(buffers[1].data() + g0.offset, 0, g0.length);
  };
  const FetchOutcome outcome = (*store)->Fetch(req).Wait();
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.ToString();
  EXPECT_EQ(outcome.blocks_ready, 4u);
  std::vector<std::byte> want = p.blocks[1].bytes;
  std::memset(want.data() + g0.offset, 0, g0.length);  // the caller's, left alone
  EXPECT_TRUE(buffers[1] == want);
  for (size_t b : {0, 2, 3}) EXPECT_TRUE(buffers[b] == p.blocks[b].bytes) << b;
  EXPECT_EQ(reported.size(), header->groups.size());
  for (const auto& [group, times] : reported) EXPECT_EQ(times, 1) << "group " << group;
  EXPECT_EQ(block_1_ready, 1);
  (void)(*store)->Abort(m->lease);
}

TEST(ClusterUriTest, MalformedNodeListsAreRefused) {
  ClientOptions options;
  options.token = kTokenA.token;
  for (const char* uri : {"strata://127.0.0.1:1,", "strata://127.0.0.1:1,,127.0.0.1:2",
                          "strata://127.0.0.1:1,127.0.0.1", "strata://a:1,a:1",
                          "strata://a:1,b:2/x", "strata://a:1,b:port"}) {
    auto store = OpenStore(uri, options);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << uri;
  }
  auto nodes = ParseNodeList("h1:1,h2:2");
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[1].node_id, "h2:2");
}

}  // namespace
}  // namespace strata::testing

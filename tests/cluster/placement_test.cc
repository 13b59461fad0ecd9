// Rendezvous placement: balance, minimal movement on join and leave,
// determinism, and drain (no new writes, reads still find the node).
#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "strata/chain_key.h"

namespace strata {
namespace {

// Real chain keys, as a prompt would have: one chain of `n` blocks.
std::vector<ChainKey> Keys(size_t n, uint32_t seed = 1) {
  ChainKey k = ChainKeys::Root({"tenant", ModelId{}, "seed" + std::to_string(seed)});
  std::vector<ChainKey> keys;
  std::vector<uint32_t> tokens(16);
  for (size_t i = 0; i < n; ++i) {
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(i * 31 + t);
    k = ChainKeys::Next(k, tokens);
    keys.push_back(k);
  }
  return keys;
}

std::vector<NodeInfo> Nodes(std::initializer_list<const char*> ids) {
  std::vector<NodeInfo> out;
  for (const char* id : ids) out.push_back({id, std::string(id) + ":7000", false});
  return out;
}

std::set<std::string> Ids(const Placement& p, const std::vector<size_t>& replicas) {
  std::set<std::string> out;
  for (size_t i : replicas) out.insert(p.nodes()[i].node_id);
  return out;
}

TEST(PlacementTest, BalancedWithinFifteenPercentOverTenThousandKeys) {
  const Placement p(Nodes({"node-a", "node-b", "node-c"}));
  const std::vector<ChainKey> keys = Keys(10000);
  for (uint32_t r : {1u, 2u}) {
    std::map<std::string, int> load;
    for (const ChainKey& k : keys) {
      for (const std::string& id : Ids(p, p.WriteReplicas(k, r))) ++load[id];
    }
    const double fair = 10000.0 * r / 3;
    ASSERT_EQ(load.size(), 3u);
    for (const auto& [id, n] : load) {
      EXPECT_GT(n, fair * 0.85) << id << " with R=" << r;
      EXPECT_LT(n, fair * 1.15) << id << " with R=" << r;
    }
  }
}

TEST(PlacementTest, ReplicasAreDistinctAndCappedByNodeCount) {
  const Placement p(Nodes({"a", "b", "c"}));
  for (const ChainKey& k : Keys(200)) {
    EXPECT_EQ(Ids(p, p.WriteReplicas(k, 2)).size(), 2u);
    EXPECT_EQ(p.WriteReplicas(k, 5).size(), 3u);
    EXPECT_EQ(p.ReadReplicas(k, 2), p.WriteReplicas(k, 2));  // nobody drains
  }
  EXPECT_TRUE(Placement({}).WriteReplicas(Keys(1)[0], 1).empty());
}

TEST(PlacementTest, DeterministicWhateverTheOrderOfTheNodeList) {
  const Placement p1(Nodes({"a", "b", "c", "d"}));
  const Placement p2(Nodes({"d", "b", "a", "c"}));
  for (const ChainKey& k : Keys(1000)) {
    EXPECT_EQ(Ids(p1, p1.WriteReplicas(k, 2)), Ids(p2, p2.WriteReplicas(k, 2)));
  }
  // The score is a pure function of key and node id.
  const ChainKey k = Keys(1)[0];
  EXPECT_EQ(PlacementScore(k, "a"), PlacementScore(k, "a"));
  EXPECT_NE(PlacementScore(k, "a"), PlacementScore(k, "b"));
}

TEST(PlacementTest, JoinMovesOnlyKeysTheNewNodeTakes) {
  const Placement before(Nodes({"a", "b", "c"}));
  const Placement after(Nodes({"a", "b", "c", "d"}));
  const std::vector<ChainKey> keys = Keys(10000);
  for (uint32_t r : {1u, 2u}) {
    int moved = 0;
    for (const ChainKey& k : keys) {
      const std::set<std::string> old_ids = Ids(before, before.WriteReplicas(k, r));
      const std::set<std::string> new_ids = Ids(after, after.WriteReplicas(k, r));
      if (old_ids == new_ids) continue;
      ++moved;
      // The only change: the new node displaced one old replica.
      EXPECT_TRUE(new_ids.count("d")) << "a key moved between old nodes";
      std::set<std::string> kept;
      std::set_intersection(old_ids.begin(), old_ids.end(), new_ids.begin(), new_ids.end(),
                            std::inserter(kept, kept.begin()));
      EXPECT_EQ(kept.size(), r - 1);
    }
    // The new node takes its fair share (R/4 of the keys), no more.
    const double fair = 10000.0 * r / 4;
    EXPECT_GT(moved, fair * 0.85) << "R=" << r;
    EXPECT_LT(moved, fair * 1.15) << "R=" << r;
  }
}

TEST(PlacementTest, LeaveMovesOnlyKeysTheNodeHeld) {
  const Placement before(Nodes({"a", "b", "c"}));
  const Placement after(Nodes({"a", "c"}));
  for (const ChainKey& k : Keys(5000)) {
    const std::set<std::string> old_ids = Ids(before, before.WriteReplicas(k, 1));
    const std::set<std::string> new_ids = Ids(after, after.WriteReplicas(k, 1));
    if (!old_ids.count("b")) {
      EXPECT_EQ(old_ids, new_ids);
    }
  }
}

TEST(PlacementTest, DrainingNodeTakesNoWritesButStillServesReads) {
  std::vector<NodeInfo> nodes = Nodes({"a", "b", "c"});
  const Placement live(nodes);
  nodes[1].draining = true;  // "b"
  const Placement drained(nodes);
  int on_b = 0;
  for (const ChainKey& k : Keys(3000)) {
    const std::set<std::string> writes = Ids(drained, drained.WriteReplicas(k, 1));
    EXPECT_FALSE(writes.count("b"));
    EXPECT_EQ(writes.size(), 1u);
    // Whatever was written before the drain is still looked for.
    const std::set<std::string> before = Ids(live, live.WriteReplicas(k, 1));
    const std::set<std::string> reads = Ids(drained, drained.ReadReplicas(k, 1));
    for (const std::string& id : before) EXPECT_TRUE(reads.count(id));
    for (const std::string& id : writes) EXPECT_TRUE(reads.count(id));
    if (before.count("b")) {
      ++on_b;
      EXPECT_EQ(reads.size(), 2u);
    } else {
      EXPECT_EQ(reads, writes);  // keys b never held are not asked of b
    }
  }
  EXPECT_GT(on_b, 0);
}

TEST(PlacementTest, DownNodesShareGoesToTheNextRankedAndItIsStillAsked) {
  const Placement p(Nodes({"a", "b", "c", "d"}));
  const std::vector<bool> down = {false, true, false, false};  // "b" (sorted by id)
  int moved = 0;
  for (const ChainKey& k : Keys(3000)) {
    for (uint32_t r : {1u, 2u}) {
      const std::vector<size_t> live = p.WriteReplicas(k, r);
      const std::vector<size_t> writes = p.WriteReplicas(k, r, down);
      EXPECT_EQ(writes.size(), r);
      EXPECT_EQ(std::count(writes.begin(), writes.end(), 1u), 0);
      // Only b's replica moves; the other replicas stay where they were.
      for (size_t n : live) {
        if (n == 1) continue;
        EXPECT_EQ(std::count(writes.begin(), writes.end(), n), 1);
      }
      // Reads ask b (it answers again some day) and where its share went.
      const std::vector<size_t> reads = p.ReadReplicas(k, r, down);
      for (size_t n : live) EXPECT_EQ(std::count(reads.begin(), reads.end(), n), 1);
      for (size_t n : writes) EXPECT_EQ(std::count(reads.begin(), reads.end(), n), 1);
      if (std::count(live.begin(), live.end(), 1u) == 1) {
        ++moved;
        EXPECT_EQ(reads.size(), r + 1);
      } else {
        EXPECT_EQ(reads, writes);
      }
    }
  }
  EXPECT_GT(moved, 0);
  // Every node down: nothing is writable, as when all drain.
  EXPECT_TRUE(p.WriteReplicas(Keys(1)[0], 1, {true, true, true, true}).empty());
}

}  // namespace
}  // namespace strata

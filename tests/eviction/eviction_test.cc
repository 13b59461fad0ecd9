// Eviction: capacity and watermarks, prefix safety, leases and pins that
// block eviction, and TTL expiry.
#include <gtest/gtest.h>

#include <random>

#include "eviction/entry.h"
#include "strata/cache_store.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::TestStore;
using testing::Tokens;

// Tiny global payloads take 320 B, i.e. 2 granules of 256 B = 512 B each.
constexpr uint64_t kSlot = 512;

class EvictionTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Status st = t_->store->CheckInvariantsForTesting();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  size_t Hits(const std::vector<uint32_t>& tokens) {
    return t_->store->Match(t_->writer, t_->Request(tokens))->blocks.size();
  }
  // Room for `slots` tiny blocks; watermarks off unless given.
  void MakeStore(uint64_t slots, double high = 1.0, double low = 1.0) {
    t_ = std::make_unique<TestStore>(slots * kSlot, high, low);
  }
  std::unique_ptr<TestStore> t_;
};

TEST_F(EvictionTest, CapacityEvictsLeastRecentLeavesFirst) {
  MakeStore(6);
  const auto a = Tokens(20, 1), b = Tokens(12, 2);
  ASSERT_EQ(t_->CommitBlocks(a, 0, 5)->published, 5u);
  // Chain b needs 3 slots; only 1 is free. LRU must take a's deepest blocks
  // (a4, then a3), never an ancestor of a block it keeps.
  ASSERT_EQ(t_->CommitBlocks(b, 0, 3)->published, 3u);
  EXPECT_EQ(Hits(a), 3u);
  EXPECT_EQ(Hits(b), 3u);
  EXPECT_EQ(t_->store->Stats().evictions[static_cast<size_t>(EvictReason::kCapacity)], 2u);
  EXPECT_EQ(t_->store->Stats().used_bytes, 6 * kSlot);
}

TEST_F(EvictionTest, AHitMakesAChainYoungerThanOthers) {
  MakeStore(6);
  const auto a = Tokens(12, 3), b = Tokens(12, 4), c = Tokens(8, 5);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 3).ok());
  ASSERT_TRUE(t_->CommitBlocks(b, 0, 3).ok());
  EXPECT_EQ(Hits(a), 3u);  // touch a: now b is the least recent chain
  ASSERT_EQ(t_->CommitBlocks(c, 0, 2)->published, 2u);
  EXPECT_EQ(Hits(a), 3u);
  EXPECT_EQ(Hits(b), 1u);  // b lost its two deepest blocks
}

TEST_F(EvictionTest, ExtendingAChainKeepsItsAncestorsYounger) {
  MakeStore(5);
  const auto a = Tokens(16, 6), b = Tokens(8, 7);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 2).ok());
  ASSERT_TRUE(t_->CommitBlocks(b, 0, 2).ok());
  ASSERT_TRUE(t_->CommitBlocks(a, 2, 3).ok());  // a grows by one block: a0..a2 touched
  const auto c = Tokens(4, 8);
  ASSERT_EQ(t_->CommitBlocks(c, 0, 1)->published, 1u);  // evicts b1 (b's leaf), nothing of a
  EXPECT_EQ(Hits(a), 3u);
  EXPECT_EQ(Hits(b), 1u);
}

TEST_F(EvictionTest, WatermarksEvictDownToLow) {
  MakeStore(10, /*high=*/0.8, /*low=*/0.5);
  const auto a = Tokens(40, 9);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 8).ok());  // 80%: at, not above, high
  EXPECT_EQ(t_->store->Stats().used_bytes, 8 * kSlot);
  const auto b = Tokens(4, 10);
  ASSERT_TRUE(t_->CommitBlocks(b, 0, 1).ok());  // 90% > high: down to <= 50%
  EXPECT_LE(t_->store->Stats().used_bytes, 5 * kSlot);
  EXPECT_GT(t_->store->Stats().evictions[static_cast<size_t>(EvictReason::kWatermark)], 0u);
  EXPECT_EQ(Hits(b), 1u);  // the newest block survives
}

TEST_F(EvictionTest, LeasedEntriesAreNeverEvicted) {
  MakeStore(4);
  const auto a = Tokens(8, 11);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 2).ok());
  auto m = t_->store->Match(t_->writer, t_->Request(a, Seconds(60))).value();
  ASSERT_EQ(m.blocks.size(), 2u);
  for (uint32_t i = 0; i < 6; ++i) {
    const auto other = Tokens(4, 100 + i);
    ASSERT_TRUE(t_->CommitBlocks(other, 0, 1).ok());
  }
  EXPECT_EQ(Hits(a), 2u);
  // Fill what is left with leases: then nothing can go and commits fail
  // cleanly, leaving everything as it was.
  const auto x = Tokens(4, 200), y = Tokens(4, 201);
  ASSERT_TRUE(t_->CommitBlocks(x, 0, 1).ok());
  ASSERT_TRUE(t_->CommitBlocks(y, 0, 1).ok());
  auto mx = t_->store->Match(t_->writer, t_->Request(x, Seconds(60))).value();
  auto my = t_->store->Match(t_->writer, t_->Request(y, Seconds(60))).value();
  const auto z = Tokens(4, 202);
  EXPECT_EQ(t_->CommitBlocks(z, 0, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t_->store->Stats().reserved_entries, 0u);
  EXPECT_EQ(t_->store->Stats().used_bytes, 4 * kSlot);
  // Expired leases stop protecting.
  t_->clock.Advance(Seconds(61));
  t_->store->RunMaintenance();
  EXPECT_EQ(t_->CommitBlocks(z, 0, 1)->published, 1u);
}

// A reservation never evicts what its own Publish needs: the stored parent
// a block names, or a block it reported present (the caller does not send
// that one again).
TEST_F(EvictionTest, AReservationKeepsTheParentItNamesAndTheBlocksItFoundPresent) {
  MakeStore(4);
  const auto a = Tokens(8, 20);
  ASSERT_EQ(t_->CommitBlocks(a, 0, 1)->published, 1u);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(t_->CommitBlocks(Tokens(4, 21 + i), 0, 1)->published, 1u);
  }
  // a0 is the least recent entry of a full tier, and the parent of a1.
  auto r = t_->CommitBlocks(a, 1, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->published, 1u) << r->blocks[0].ToString();
  EXPECT_EQ(Hits(a), 2u);

  // x0 is the least recent entry again; a batch of x0 (present) and y0.
  const auto x = Tokens(4, 30), y = Tokens(4, 31);
  ASSERT_EQ(t_->CommitBlocks(x, 0, 1)->published, 1u);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(t_->CommitBlocks(Tokens(4, 32 + i), 0, 1)->published, 1u);
  }
  const ChainKey kx = t_->Keys(x, t_->writer)[0], ky = t_->Keys(y, t_->writer)[0];
  const CommitBlock blocks[] = {{kx, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                                 testing::TinyGlobalLayout().PayloadBytes(), std::nullopt},
                                {ky, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                                 testing::TinyGlobalLayout().PayloadBytes(), std::nullopt}};
  auto res = t_->store->Reserve(t_->writer, testing::TestModel(), blocks);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->blocks[0].state, ReserveState::kAlreadyPresent);
  EXPECT_EQ(res->blocks[1].state, ReserveState::kReserved);
  EXPECT_EQ(Hits(x), 1u);
  ASSERT_TRUE(t_->store->Abort(t_->writer, res->write_lease).ok());
}

// A batch that could not fit even if every evictable entry went is refused
// before it evicts any of them.
TEST_F(EvictionTest, ABatchThatCannotFitEvictsNothing) {
  MakeStore(8);
  const Principal other{"tenant-b", Role::kAdmin};
  const auto leased = Tokens(16, 40);
  ASSERT_EQ(t_->CommitBlocks(leased, 0, 4, other)->published, 4u);
  auto m = t_->store->Match(other, t_->Request(leased, Seconds(60))).value();
  ASSERT_EQ(m.blocks.size(), 4u);
  const auto warm = Tokens(12, 41);
  ASSERT_EQ(t_->CommitBlocks(warm, 0, 3)->published, 3u);
  auto r = t_->CommitBlocks(Tokens(20, 42), 0, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_EQ(Hits(warm), 3u);
  EXPECT_EQ(t_->store->Stats().used_bytes, 7 * kSlot);
  ASSERT_TRUE(t_->store->Abort(other, m.lease).ok());
}

TEST_F(EvictionTest, PinsProtectUntilTheyExpire) {
  MakeStore(3);
  const auto a = Tokens(4, 12);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 1).ok());
  const ChainKey k = t_->Keys(a, t_->writer)[0];
  ASSERT_TRUE(t_->store->Pin(t_->writer, k, StateKind::kGlobalKv, Minutes(5)).ok());
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(t_->CommitBlocks(Tokens(4, 300 + i), 0, 1).ok());
  EXPECT_EQ(Hits(a), 1u);
  t_->clock.Advance(Minutes(6));
  // Now the oldest entry is fair game again (and a was touched least lately).
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(t_->CommitBlocks(Tokens(4, 400 + i), 0, 1).ok());
  EXPECT_EQ(Hits(a), 0u);
  // Unpin: an explicit pin can be lifted early.
  const auto b = Tokens(4, 13);
  ASSERT_TRUE(t_->CommitBlocks(b, 0, 1).ok());
  const ChainKey kb = t_->Keys(b, t_->writer)[0];
  ASSERT_TRUE(t_->store->Pin(t_->writer, kb, StateKind::kGlobalKv, Minutes(5)).ok());
  EXPECT_GT(t_->store->Inspect(t_->writer, kb, StateKind::kGlobalKv)->pinned_until, 0);
  ASSERT_TRUE(t_->store->Unpin(t_->writer, kb, StateKind::kGlobalKv).ok());
  EXPECT_EQ(t_->store->Inspect(t_->writer, kb, StateKind::kGlobalKv)->pinned_until, 0);
}

TEST_F(EvictionTest, ExpiredEntriesStopMatchingBeforeMaintenanceRuns) {
  MakeStore(8);
  const auto a = Tokens(8, 14);
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 2).ok());
  t_->clock.Advance(Hours(72) + 1);
  EXPECT_EQ(Hits(a), 0u);  // lazily invisible
  // Re-commit over expired entries works and replaces them.
  ASSERT_EQ(t_->CommitBlocks(a, 0, 2)->published, 2u);
  EXPECT_EQ(Hits(a), 2u);
  EXPECT_EQ(t_->store->Stats().global_kv_entries, 2u);
}

TEST_F(EvictionTest, DeleteCascadesToDescendants) {
  MakeStore(16);
  const auto a = Tokens(16, 15);
  auto b = a;
  b[13] += 1;  // shares blocks 0..2 with a
  ASSERT_TRUE(t_->CommitBlocks(a, 0, 4).ok());
  ASSERT_TRUE(t_->CommitBlocks(b, 3, 4).ok());  // a sibling of a3 under a2
  EXPECT_EQ(
      t_->store->Inspect(t_->writer, t_->Keys(a, t_->writer)[2], StateKind::kGlobalKv)->children,
      2u);
  ASSERT_TRUE(t_->store->Delete(t_->writer, t_->Keys(a, t_->writer)[1], StateKind::kGlobalKv).ok());
  EXPECT_EQ(t_->store->Stats().global_kv_entries, 1u);
  EXPECT_EQ(Hits(a), 1u);
  EXPECT_EQ(Hits(b), 1u);
}

TEST_F(EvictionTest, DeepChainsDeleteWithoutRecursion) {
  constexpr size_t kBlocks = 20000;
  MakeStore(kBlocks + 8);
  const auto a = Tokens(kBlocks * testing::kTinyBlockTokens, 16);
  for (size_t b = 0; b < kBlocks; b += 2000) {
    ASSERT_EQ(t_->CommitBlocks(a, b, b + 2000)->published, 2000u);
  }
  EXPECT_EQ(t_->store->Stats().global_kv_entries, kBlocks);
  ASSERT_TRUE(t_->store->Delete(t_->writer, t_->Keys(a, t_->writer)[0], StateKind::kGlobalKv).ok());
  EXPECT_EQ(t_->store->Stats().global_kv_entries, 0u);
  EXPECT_EQ(t_->store->Stats().used_bytes, 0u);
}

// What every policy must guarantee, whatever it prefers to evict.
class PolicySafetyTest : public ::testing::TestWithParam<std::string> {
 protected:
  size_t Hits(TestStore& t, const std::vector<uint32_t>& tokens) {
    return t.store->Match(t.writer, t.Request(tokens))->blocks.size();
  }
};

TEST_P(PolicySafetyTest, LeasedAndPinnedEntriesSurviveAnyPressure) {
  TestStore t(12 * kSlot, 1.0, 1.0, GetParam());
  const auto leased = Tokens(12, 1), pinned = Tokens(8, 2);
  ASSERT_TRUE(t.CommitBlocks(leased, 0, 3).ok());
  ASSERT_TRUE(t.CommitBlocks(pinned, 0, 2).ok());
  auto m = t.store->Match(t.writer, t.Request(leased, Minutes(5))).value();
  const auto pk = t.Keys(pinned, t.writer);
  ASSERT_TRUE(t.store->Pin(t.writer, pk[0], StateKind::kGlobalKv, Minutes(5)).ok());
  ASSERT_TRUE(t.store->Pin(t.writer, pk[1], StateKind::kGlobalKv, Minutes(5)).ok());
  for (uint32_t i = 0; i < 60; ++i) {
    const auto other = Tokens(4 * (1 + i % 4), 1000 + i);
    auto r = t.CommitBlocks(other, 0, 1 + i % 4);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (i % 3 == 0) Hits(t, other);  // some reuse, so promotions happen too
    ASSERT_TRUE(t.store->CheckInvariantsForTesting().ok());
  }
  EXPECT_EQ(Hits(t, leased), 3u);
  EXPECT_EQ(Hits(t, pinned), 2u);
  EXPECT_TRUE(t.store->Abort(t.writer, m.lease).ok());
}

TEST_P(PolicySafetyTest, EvictionIsPrefixSafeUnderChurn) {
  // Families of prompts share prefixes; capacity is a fraction of the data.
  TestStore t(40 * kSlot, 0.9, 0.7, GetParam());
  std::mt19937 rng(7);
  for (int step = 0; step < 600; ++step) {
    auto tokens = Tokens(40, 100 + rng() % 6);  // 6 families
    auto tail = Tokens(40, 5000 + rng() % 40);
    const size_t diverge = 4 * (1 + rng() % 8);
    std::copy(tail.begin(), tail.begin() + (40 - diverge), tokens.begin() + diverge);
    const size_t hit = Hits(t, tokens);
    auto r = t.CommitBlocks(tokens, hit, 10);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Every stored block's ancestors are stored (the invariant check walks
    // the tree); and a match never returns a gap.
    Status st = t.store->CheckInvariantsForTesting();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_GT(t.store->Stats().evictions[static_cast<size_t>(EvictReason::kWatermark)] +
                t.store->Stats().evictions[static_cast<size_t>(EvictReason::kCapacity)],
            0u);
}

TEST_P(PolicySafetyTest, AKeyWhoseFingerprintIsZeroIsHandled) {
  // EntryKeyHash of (namespace 0, GLOBAL_KV, key with Prefix64() == 1) is 0,
  // the ghost table's empty marker. Callers choose keys, so it must work.
  TestStore t(20 * kSlot, 1.0, 1.0, GetParam());
  ChainKey k;
  k.bytes[0] = 1;
  ASSERT_EQ(EntryKeyHash{}(EntryKey{0, StateKind::kGlobalKv, k}), 0u);
  const testing::Payload p = testing::MakePayload(testing::TinyGlobalLayout(), 1);
  CommitPayload cp{
      {k, StateKind::kGlobalKv, testing::kTinyGlobalLayout, p.bytes.size(), std::nullopt},
      p.bytes,
      p.checksum};
  for (int i = 0; i < 100; ++i) {  // used to hang once ghost counts drifted
    ASSERT_EQ(t.store->Commit(t.writer, testing::TestModel(), std::span(&cp, 1))->published, 1u);
    ASSERT_TRUE(t.store->Delete(t.writer, k, StateKind::kGlobalKv).ok());
  }
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicySafetyTest, ::testing::Values("lru", "aslru", "deadline"));

TEST(AslruTest, ProtectsReusedEntriesFromAScan) {
  // Three blocks hit repeatedly, then a long scan of one-off blocks: LRU
  // loses the reused blocks, the adaptive segmented LRU keeps them.
  auto run = [](const std::string& policy) {
    TestStore t(20 * kSlot, 1.0, 1.0, policy);
    const auto hot = Tokens(12, 1);
    EXPECT_TRUE(t.CommitBlocks(hot, 0, 3).ok());
    for (int i = 0; i < 3; ++i) t.store->Match(t.writer, t.Request(hot)).value();
    for (uint32_t i = 0; i < 30; ++i) EXPECT_TRUE(t.CommitBlocks(Tokens(4, 100 + i), 0, 1).ok());
    return t.store->Match(t.writer, t.Request(hot))->blocks.size();
  };
  EXPECT_EQ(run("lru"), 0u);
  EXPECT_EQ(run("aslru"), 3u);
}

TEST(DeadlinePolicyTest, LearnsToHoldReusedBlocksPastLruReach) {
  // 20 blocks come back every ~80 uses, and between them 60 one-off blocks
  // never return; the cache holds 40. LRU evicts every reused block before
  // its reuse. The deadline policy learns (after its first 4,096 uses) that
  // first-seen blocks do not come back and blocks seen before do, 80 uses
  // later, and holds those instead.
  auto late_hit_ratio = [](const std::string& policy) {
    TestStore t(40 * kSlot, 1.0, 1.0, policy);
    std::vector<std::vector<uint32_t>> reused;
    for (uint32_t h = 0; h < 20; ++h) reused.push_back(Tokens(4, 10 + h));
    uint32_t one_off = 1000;
    size_t hits = 0;
    size_t looks = 0;
    for (int round = 0; round < 150; ++round) {
      for (const auto& tokens : reused) {
        const size_t hit = t.store->Match(t.writer, t.Request(tokens))->blocks.size();
        if (round >= 100) {
          hits += hit;
          ++looks;
        }
        if (hit == 0) {
          EXPECT_TRUE(t.CommitBlocks(tokens, 0, 1).ok());
        }
        for (int k = 0; k < 3; ++k) EXPECT_TRUE(t.CommitBlocks(Tokens(4, one_off++), 0, 1).ok());
      }
      EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
    }
    return static_cast<double>(hits) / static_cast<double>(looks);
  };
  EXPECT_EQ(late_hit_ratio("lru"), 0.0);
  EXPECT_GT(late_hit_ratio("deadline"), 0.9);
}

}  // namespace
}  // namespace strata

// What one tenant may take of a shared store: leased entries, the bytes it
// holds through leases, reservations and pins (one cap, exact under
// concurrency), and its share of committed bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "strata/cache_store.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::kTinyBlockTokens;
using testing::TestModel;
using testing::TinyGlobalLayout;
using testing::Tokens;

TEST(LeaseLimitTest, ANamespaceLeasesAtMostItsLimitOfEntries) {
  testing::TestStore t(1 << 20, 0.95, 0.85, "lru", /*max_leased_entries=*/6);
  const Principal other{"tenant-b", Role::kWrite};
  const auto tokens = Tokens(32, 21);              // 8 tiny blocks, more than the limit...
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 4).ok());  // ...of which 4 are stored
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 4, other).ok());
  // The limit counts what a lease would hold, not the prompt's blocks.
  auto first = t.store->Match(t.writer, t.Request(tokens, Seconds(10)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->blocks.size(), 4u);
  // With 2 of the 6 left, the next leased match stops its hit run there...
  auto second = t.store->Match(t.writer, t.Request(tokens, Seconds(10)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->blocks.size(), 2u);
  EXPECT_NE(second->lease, 0u);
  // ...and with none left one is refused.
  EXPECT_EQ(t.store->Match(t.writer, t.Request(tokens, Seconds(10))).status().code(),
            StatusCode::kResourceExhausted);
  // A match without a lease, and another namespace, are not limited by it.
  EXPECT_EQ(t.store->Match(t.writer, t.Request(tokens))->blocks.size(), 4u);
  EXPECT_TRUE(t.store->Match(other, t.Request(tokens, Seconds(10))).ok());
  // Reservations count too.
  const auto fresh = Tokens(20, 22);
  const auto keys = t.Keys(fresh, t.writer);
  std::vector<CommitBlock> blocks;
  for (size_t b = 0; b < 5; ++b) {
    blocks.push_back({keys[b], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                      TinyGlobalLayout().PayloadBytes(),
                      b == 0 ? std::nullopt : std::optional<ChainKey>(keys[b - 1])});
  }
  EXPECT_EQ(t.store->Reserve(t.writer, TestModel(), blocks).status().code(),
            StatusCode::kResourceExhausted);
  // Ending the leases makes room again.
  ASSERT_TRUE(t.store->Abort(t.writer, first->lease).ok());
  ASSERT_TRUE(t.store->Abort(t.writer, second->lease).ok());
  EXPECT_TRUE(t.store->Reserve(t.writer, TestModel(), blocks).ok());
}

// `count` tiny GLOBAL_KV blocks of a fresh chain, ready to reserve.
std::vector<CommitBlock> FreshChain(testing::TestStore& t, const Principal& who, uint32_t count,
                                    uint32_t seed) {
  const std::vector<ChainKey> keys = t.Keys(Tokens(kTinyBlockTokens * count, seed), who);
  std::vector<CommitBlock> blocks;
  for (size_t b = 0; b < count; ++b) {
    blocks.push_back({keys[b], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                      TinyGlobalLayout().PayloadBytes(),
                      b == 0 ? std::nullopt : std::optional<ChainKey>(keys[b - 1])});
  }
  return blocks;
}

// Reserves each block of `chain` on its own as the writer, counting grants
// in `granted`; a refusal may only be the share running out.
void ReserveEachCounting(testing::TestStore& t, const std::vector<CommitBlock>& chain,
                         std::atomic<uint64_t>& granted) {
  for (const CommitBlock& block : chain) {
    auto r = t.store->Reserve(t.writer, TestModel(), std::span(&block, 1));
    if (r.ok()) {
      granted.fetch_add(1);
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
    }
  }
}

TEST(LeaseLimitTest, ANamespaceHoldsAtMostItsShareOfTheTier) {
  // 128 KiB of 512-byte extents, a quarter each: 64 blocks per namespace.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  const Principal other{"tenant-b", Role::kWrite};
  const auto tokens = Tokens(16, 23);  // 4 tiny blocks, committed before the reservations
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 4).ok());

  const std::vector<CommitBlock> held = FreshChain(t, t.writer, 63, 24);
  auto first = t.store->Reserve(t.writer, TestModel(), held);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const LeaseHolding holding = t.store->Holding(t.writer);
  EXPECT_EQ(holding.held_bytes, 63u * 512);
  EXPECT_EQ(holding.limit_bytes, 32u << 10);
  EXPECT_EQ(holding.leased_entries, 63u);
  // 63 reserved + 2 more would pass 64: refused before anything is reserved.
  const std::vector<CommitBlock> two = FreshChain(t, t.writer, 2, 25);
  auto refused = t.store->Reserve(t.writer, TestModel(), two);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("tenant-a"), std::string::npos);
  EXPECT_NE(refused.status().message().find("bytes"), std::string::npos);
  EXPECT_EQ(t.store->Stats().reserved_entries, 63u);

  // A leased match of the 4 committed blocks would hold 67: refused when
  // the lease is granted, with every pin it took dropped.
  auto match = t.store->Match(t.writer, t.Request(tokens, Seconds(10)));
  ASSERT_EQ(match.status().code(), StatusCode::kResourceExhausted) << match.status().ToString();
  EXPECT_EQ(t.store->Stats().read_leases, 0u);
  EXPECT_EQ(
      t.store->Inspect(t.writer, t.Keys(tokens, t.writer)[0], StateKind::kGlobalKv)->live_leases,
      0u);
  EXPECT_EQ(t.store->Match(t.writer, t.Request(tokens))->blocks.size(), 4u);  // unleased: fine

  // Another namespace has its own share.
  EXPECT_TRUE(t.store->Reserve(other, TestModel(), FreshChain(t, other, 64, 26)).ok());
  // Ending the reservation makes room again.
  ASSERT_TRUE(t.store->Abort(t.writer, first->write_lease).ok());
  EXPECT_TRUE(t.store->Match(t.writer, t.Request(tokens, Seconds(10))).ok());
  EXPECT_TRUE(t.store->Reserve(t.writer, TestModel(), two).ok());
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

TEST(LeaseLimitTest, LeasesOnTheSameEntriesHoldTheirBytesOnce) {
  // Many requests sharing one prefix each lease it: the tier holds its
  // bytes once, and so does the namespace's share (64 blocks here).
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  const auto tokens = Tokens(kTinyBlockTokens * 40, 27);
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 40).ok());
  std::vector<LeaseId> leases;
  for (int i = 0; i < 10; ++i) {
    auto m = t.store->Match(t.writer, t.Request(tokens, Seconds(10)));
    ASSERT_TRUE(m.ok()) << i << ": " << m.status().ToString();
    ASSERT_EQ(m->blocks.size(), 40u);
    leases.push_back(m->lease);
  }
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, 40u * 512);
  EXPECT_EQ(t.store->Holding(t.writer).leased_entries, 400u);  // the lease table's records
  ASSERT_TRUE(t.store->Reserve(t.writer, TestModel(), FreshChain(t, t.writer, 24, 28)).ok());
  const std::vector<CommitBlock> one = FreshChain(t, t.writer, 1, 29);
  EXPECT_EQ(t.store->Reserve(t.writer, TestModel(), one).status().code(),
            StatusCode::kResourceExhausted);
  // The prefix stays pinned until its last lease ends.
  for (size_t i = 0; i + 1 < leases.size(); ++i)
    ASSERT_TRUE(t.store->Abort(t.writer, leases[i]).ok());
  EXPECT_EQ(t.store->Reserve(t.writer, TestModel(), one).status().code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.store->Abort(t.writer, leases.back()).ok());
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, 24u * 512);
  EXPECT_TRUE(t.store->Reserve(t.writer, TestModel(), one).ok());
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

TEST(LeaseLimitTest, AReservationCountsWholeExtentsOfWhatItReservesBeforeItEvicts) {
  const uint64_t payload = TinyGlobalLayout().PayloadBytes();
  const uint64_t extent = (payload + 255) / 256 * 256;  // the test store's granule
  ASSERT_LT(payload, extent);
  const uint64_t capacity = 256 * extent;
  // 63 extents and a payload: a payload more fits, its extent does not.
  const uint64_t limit = 63 * extent + payload;
  testing::TestStore t(capacity, 1.0, 1.0, "lru", uint64_t{1} << 20,
                       (static_cast<double>(limit) + 0.5) / static_cast<double>(capacity));
  ASSERT_EQ(t.store->Holding(t.writer).limit_bytes, limit);
  // The tier full: another tenant's 154 entries, 40 committed blocks of a
  // chain, and 62 reserved blocks, which leave room for one extent.
  const Principal other{"tenant-b", Role::kWrite};
  const auto others = Tokens(kTinyBlockTokens * 154, 30);
  for (size_t from = 0; from < 154; from += 60) {
    ASSERT_TRUE(t.CommitBlocks(others, from, std::min<size_t>(from + 60, 154), other).ok());
  }
  ASSERT_TRUE(t.CommitBlocks(Tokens(kTinyBlockTokens * 41, 31), 0, 40).ok());
  ASSERT_TRUE(t.store->Reserve(t.writer, TestModel(), FreshChain(t, t.writer, 62, 32)).ok());
  ASSERT_EQ(t.store->Stats().used_bytes, capacity);
  const auto evictions = [&] { return t.store->Stats().evictions; };
  const auto before = evictions();

  // Two more blocks: refused before either evicts anything.
  auto two = t.store->Reserve(t.writer, TestModel(), FreshChain(t, t.writer, 2, 33));
  EXPECT_EQ(two.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(evictions(), before);
  EXPECT_EQ(t.store->Stats().reserved_entries, 62u);

  // The whole chain: its 40 committed blocks take nothing, the 41st fits.
  auto chain = t.store->Reserve(t.writer, TestModel(), FreshChain(t, t.writer, 41, 31));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(chain->blocks[0].state, ReserveState::kAlreadyPresent);
  EXPECT_EQ(chain->blocks[40].state, ReserveState::kReserved);
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, 63 * extent);

  // One more payload fits the share, its extent does not: refused before
  // it evicts another tenant's entry.
  const auto full = evictions();
  auto one = t.store->Reserve(t.writer, TestModel(), FreshChain(t, t.writer, 1, 34));
  EXPECT_EQ(one.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(evictions(), full);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

TEST(LeaseLimitTest, ReadAndWriteLeasesGrantedAtOnceNeverPassTheShare) {
  // 64 extents of share; leased matches of 6 committed chains (60 blocks)
  // race 30 reservations of 1-block chains, and nothing is released.
  // Neither side alone can take the whole share (reads: 60 extents, writes:
  // 30), so both get some whatever the threads' order; together they ask
  // for more than the share.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  constexpr int kChains = 6;
  constexpr uint32_t kBlocks = 10;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kChains; ++i) {
    prompts.push_back(Tokens(kTinyBlockTokens * kBlocks, 200 + i));
    ASSERT_TRUE(t.CommitBlocks(prompts.back(), 0, kBlocks).ok());
  }
  std::atomic<uint64_t> read_grants{0};
  std::atomic<uint64_t> write_grants{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kChains; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round) {
        auto m = t.store->Match(t.writer, t.Request(prompts[i], Seconds(60)));
        if (m.ok()) {
          read_grants.fetch_add(1);
        } else {
          EXPECT_EQ(m.status().code(), StatusCode::kResourceExhausted) << m.status().ToString();
        }
      }
    });
    threads.emplace_back([&, i] {
      for (uint32_t b = 0; b < 5; ++b) {
        const std::vector<CommitBlock> one = FreshChain(t, t.writer, 1, 300 + i * 20 + b);
        auto r = t.store->Reserve(t.writer, TestModel(), one);
        if (r.ok()) {
          write_grants.fetch_add(1);
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const LeaseHolding held = t.store->Holding(t.writer);
  EXPECT_GT(read_grants.load(), 0u);
  EXPECT_GT(write_grants.load(), 0u);
  EXPECT_LE(held.held_bytes, held.limit_bytes);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

TEST(LeaseLimitTest, ConcurrentReservationsNeverPassTheShare) {
  // Reservations running at once each count the extents of those granted
  // before it.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  constexpr int kThreads = 8;
  constexpr uint32_t kEach = 24;  // 192 tries for 64 blocks of room
  std::vector<std::vector<CommitBlock>> chains;
  chains.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) chains.push_back(FreshChain(t, t.writer, kEach, 100 + i));
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { ReserveEachCounting(t, chains[i], granted); });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(granted.load(), 64u);
  EXPECT_EQ(t.store->Stats().reserved_entries, 64u);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

// Pinned entries are never evicted: a namespace's pins take at most its
// share of the tier, or one tenant's admin could leave the others no room.
TEST(LeaseLimitTest, ANamespacePinsAtMostItsShareOfTheTier) {
  // 128 KiB of 512-byte extents, a quarter each: 64 blocks per namespace.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  const Principal other{"tenant-b", Role::kAdmin};
  const auto tokens = Tokens(70 * kTinyBlockTokens, 31);
  for (const Principal& who : {t.writer, other}) {
    for (size_t from : {0, 35}) {  // a reservation holds at most the share too
      const Result<PublishResult> committed = t.CommitBlocks(tokens, from, from + 35, who);
      ASSERT_TRUE(committed.ok()) << committed.status().ToString();
      ASSERT_EQ(committed->published, 35u);
    }
  }
  const std::vector<ChainKey> keys = t.Keys(tokens, t.writer);
  for (size_t b = 0; b < 64; ++b) {
    ASSERT_TRUE(t.store->Pin(t.writer, keys[b], StateKind::kGlobalKv, Hours(1)).ok()) << b;
  }
  const Status refused = t.store->Pin(t.writer, keys[64], StateKind::kGlobalKv, Hours(1));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("tenant-a"), std::string::npos) << refused.ToString();
  EXPECT_EQ(t.store->Inspect(t.writer, keys[64], StateKind::kGlobalKv)->pinned_until, 0);
  // A pin renewed is not counted twice.
  EXPECT_TRUE(t.store->Pin(t.writer, keys[0], StateKind::kGlobalKv, Hours(2)).ok());
  // The other namespace has its own share.
  const std::vector<ChainKey> theirs = t.Keys(tokens, other);
  for (size_t b = 0; b < 64; ++b) {
    ASSERT_TRUE(t.store->Pin(other, theirs[b], StateKind::kGlobalKv, Hours(1)).ok()) << b;
  }
  // An unpin, or pins running out, make room again.
  ASSERT_TRUE(t.store->Unpin(t.writer, keys[1], StateKind::kGlobalKv).ok());
  EXPECT_TRUE(t.store->Pin(t.writer, keys[64], StateKind::kGlobalKv, Hours(1)).ok());
  EXPECT_EQ(t.store->Pin(t.writer, keys[65], StateKind::kGlobalKv, Hours(1)).code(),
            StatusCode::kResourceExhausted);
  t.clock.Advance(Hours(1) + Seconds(1));  // all but keys[0] (2 h) have run out
  EXPECT_TRUE(t.store->Pin(t.writer, keys[65], StateKind::kGlobalKv, Hours(1)).ok());
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

// Issue #38: pins and leases were capped apart, at the share each, so one
// tenant with its own admin token pinned half the tier and reserved the
// other half. Now they count together.
TEST(LeaseLimitTest, PinsAndLeasesShareOneCap) {
  // 128 KiB of 512-byte extents, a quarter each: 64 blocks per namespace.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  const auto tokens = Tokens(40 * kTinyBlockTokens, 41);
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 40).ok());
  const std::vector<ChainKey> keys = t.Keys(tokens, t.writer);
  for (size_t b = 0; b < 40; ++b) {
    ASSERT_TRUE(t.store->Pin(t.writer, keys[b], StateKind::kGlobalKv, Hours(1)).ok()) << b;
  }
  // 40 pinned: a reservation of 30 would pass the 64.
  const std::vector<CommitBlock> thirty = FreshChain(t, t.writer, 30, 42);
  auto refused = t.store->Reserve(t.writer, TestModel(), thirty);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("leases and pins hold"), std::string::npos)
      << refused.status().ToString();
  auto reserved = t.store->Reserve(t.writer, TestModel(), std::span(thirty).first(24));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, t.store->Holding(t.writer).limit_bytes);
  // Full: no more pins either, and a renewal still goes through.
  const auto more = Tokens(kTinyBlockTokens, 43);
  const Principal b_side{"tenant-b", Role::kAdmin};
  ASSERT_TRUE(t.CommitBlocks(more, 0, 1, b_side).ok());
  const Status full = t.store->Pin(t.writer, keys[0], StateKind::kGlobalKv, Hours(2));
  EXPECT_TRUE(full.ok()) << full.ToString();
  // The other tenant has its whole share still.
  const std::vector<CommitBlock> theirs = FreshChain(t, b_side, 64, 44);
  auto other = t.store->Reserve(b_side, TestModel(), theirs);
  EXPECT_TRUE(other.ok()) << other.status().ToString();
  // Pinned entries deleted free their part of the share at once: blocks
  // 30..39 go (a delete takes the descendants too).
  ASSERT_TRUE(t.store->Abort(t.writer, reserved->write_lease).ok());
  ASSERT_TRUE(t.store->Delete(t.writer, keys[30], StateKind::kGlobalKv).ok());
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, 30u * 512);
  auto after_delete = t.store->Reserve(t.writer, TestModel(), std::span(thirty).first(30));
  ASSERT_TRUE(after_delete.ok()) << after_delete.status().ToString();
  // And pins running out do.
  ASSERT_TRUE(t.store->Abort(t.writer, after_delete->write_lease).ok());
  t.clock.Advance(Hours(1) + Seconds(1));  // all but keys[0] (2 h) have run out
  EXPECT_EQ(t.store->Holding(t.writer).held_bytes, 512u);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

TEST(LeaseLimitTest, ConcurrentPinsAndReservationsNeverPassTheShare) {
  // 64 extents of share: an admin pins 48 committed blocks one by one while
  // 4 threads reserve 12 one-block chains each (48). Together they ask for
  // 96.
  testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, /*max_held_share=*/0.25);
  const auto tokens = Tokens(48 * kTinyBlockTokens, 51);
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 24).ok());
  ASSERT_TRUE(t.CommitBlocks(tokens, 24, 48).ok());
  const std::vector<ChainKey> keys = t.Keys(tokens, t.writer);
  constexpr int kReservers = 4;
  constexpr uint32_t kEach = 12;
  std::vector<std::vector<CommitBlock>> chains;
  chains.reserve(kReservers);
  for (int i = 0; i < kReservers; ++i) chains.push_back(FreshChain(t, t.writer, kEach, 60 + i));
  std::atomic<uint64_t> pins{0}, reservations{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (const ChainKey& k : keys) {
      const Status st = t.store->Pin(t.writer, k, StateKind::kGlobalKv, Hours(1));
      if (st.ok()) {
        pins.fetch_add(1);
      } else {
        EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
      }
    }
  });
  for (int i = 0; i < kReservers; ++i) {
    threads.emplace_back([&, i] { ReserveEachCounting(t, chains[i], reservations); });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_GT(pins.load(), 0u);
  EXPECT_GT(reservations.load(), 0u);
  EXPECT_EQ(pins.load() + reservations.load(), 64u);
  const LeaseHolding held = t.store->Holding(t.writer);
  EXPECT_EQ(held.held_bytes, held.limit_bytes);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
}

// Issue #38: a tenant committing a lot evicts its own entries before those
// of a tenant within its share; with shares off, the LRU takes the other
// tenant's older entries first (what the test would see without the fix).
TEST(CommittedShareTest, ATenantPastItsShareEvictsItsOwnEntriesFirst) {
  for (const double share : {1.0, 0.5}) {
    SCOPED_TRACE(share);
    // 128 KiB of 512-byte extents: 256 blocks, 128 per namespace's share.
    testing::TestStore t(128 << 10, 0.95, 0.85, "lru", uint64_t{1} << 20, 1.0, share);
    const Principal other{"tenant-b", Role::kAdmin};
    const auto theirs = Tokens(60 * kTinyBlockTokens, 71);
    ASSERT_TRUE(t.CommitBlocks(theirs, 0, 60, other).ok());
    auto stored_of_theirs = [&] {
      auto m = t.store->Match(other, t.Request(theirs, 0));
      return m.ok() ? m->blocks.size() : 0;
    };
    // Tenant A commits 400 blocks, twenty chains of 20, one after another.
    std::vector<std::vector<uint32_t>> ours;
    for (uint32_t c = 0; c < 20; ++c) {
      ours.push_back(Tokens(20 * kTinyBlockTokens, 100 + c));
      const Result<PublishResult> r = t.CommitBlocks(ours.back(), 0, 20);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
    if (share == 1.0) {
      EXPECT_LT(stored_of_theirs(), 60u);
      continue;
    }
    EXPECT_EQ(stored_of_theirs(), 60u);
    // Room for the tenant within its share comes from the one past it.
    const auto more = Tokens(60 * kTinyBlockTokens, 72);
    ASSERT_TRUE(t.CommitBlocks(more, 0, 60, other).ok());
    EXPECT_EQ(stored_of_theirs(), 60u);
    // Tenant A leasing all it stores and committing on goes past its share,
    // then is refused rather than evict the other's entries.
    std::vector<LeaseId> leases;
    Status refused;
    for (uint32_t c = 0; c < 20 && refused.ok(); ++c) {
      ours.push_back(Tokens(20 * kTinyBlockTokens, 200 + c));
      refused = t.CommitBlocks(ours.back(), 0, 20).status();
      for (const auto& prompt : ours) {
        auto m = t.store->Match(t.writer, t.Request(prompt, Seconds(60)));
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        if (m->lease != 0) leases.push_back(m->lease);
      }
    }
    EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(refused.message().find("committed_share_per_namespace"), std::string::npos)
        << refused.ToString();
    EXPECT_EQ(stored_of_theirs(), 60u);
    auto m = t.store->Match(other, t.Request(more, 0));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->blocks.size(), 60u);
    for (LeaseId lease : leases) ASSERT_TRUE(t.store->Abort(t.writer, lease).ok());
    EXPECT_TRUE(t.CommitBlocks(ours.back(), 0, 20).ok());
    EXPECT_EQ(stored_of_theirs(), 60u);
    EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
  }
}

TEST(LeaseLimitTest, TheHeldShareMustBeAFraction) {
  for (double share : {0.0, -0.5, 1.5}) {
    CacheStoreOptions o;
    o.dram.capacity_bytes = 1 << 20;
    o.max_held_share_per_namespace = share;
    auto store = CacheStore::Open(o);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << share;
  }
}

}  // namespace
}  // namespace strata

// The store contract end to end in one process: match, fetch, two-phase
// commit, abort, leases, deletes, tenants and roles.
#include "strata/cache_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "strata/store.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::kTinyBlockTokens;
using testing::MakePayload;
using testing::TestModel;
using testing::TestStore;
using testing::TinyGlobalLayout;
using testing::Tokens;

class CacheStoreTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Status st = t_.store->CheckInvariantsForTesting();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  // Fetches every hit block; returns the outcome and the buffers.
  FetchOutcome FetchAll(const MatchResult& m, std::vector<std::vector<std::byte>>* out,
                        std::vector<FetchEvent>* events = nullptr, const Principal* who = nullptr) {
    out->assign(m.blocks.size(), {});
    FetchRequest req;
    req.match = &m;
    for (size_t b = 0; b < m.blocks.size(); ++b) {
      (*out)[b].resize(m.blocks[b].payload_bytes);
      req.block_buffers.emplace_back((*out)[b]);
    }
    if (events) req.on_event = [events](const FetchEvent& e) { events->push_back(e); };
    return t_.store->Fetch(who ? *who : t_.writer, req).Wait();
  }
  // Commits the first two blocks of `tokens`, leases them by a match and
  // deletes the first (the second goes with it): both wait for the lease.
  MatchResult LeaseThenDelete(const std::vector<uint32_t>& tokens) {
    EXPECT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
    MatchResult m = t_.store->Match(t_.writer, t_.Request(tokens, Seconds(10))).value();
    EXPECT_TRUE(t_.store->Delete(t_.writer, m.blocks[0].key, StateKind::kGlobalKv).ok());
    EXPECT_EQ(t_.store->Stats().deleting_entries, 2u);
    return m;
  }
  // The holder of `m`'s lease reads both blocks intact, then lets go.
  void ReadUnderLeaseAndLetGo(const MatchResult& m) {
    std::vector<std::vector<std::byte>> got;
    FetchOutcome out = FetchAll(m, &got);
    EXPECT_TRUE(out.status.ok()) << out.status.ToString();
    EXPECT_EQ(out.blocks_ready, 2u);
    EXPECT_TRUE(t_.store->Abort(t_.writer, m.lease).ok());
  }
  TestStore t_;
};

TEST_F(CacheStoreTest, CommitMatchFetchRoundTrip) {
  const auto tokens = Tokens(14, 1);  // 3 full blocks and 2 spare tokens
  auto committed = t_.CommitBlocks(tokens, 0, 3);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(committed->published, 3u);

  auto m = t_.store->Match(t_.writer, t_.Request(tokens));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->prompt_blocks, 3u);
  ASSERT_EQ(m->blocks.size(), 3u);
  EXPECT_EQ(m->hit_tokens(), 12u);
  const auto keys = t_.Keys(tokens, t_.writer);
  EXPECT_EQ(m->prefix_key, keys[2]);
  EXPECT_EQ(m->lease, 0u);

  std::vector<std::vector<std::byte>> got;
  std::vector<FetchEvent> events;
  FetchOutcome out = FetchAll(*m, &got, &events);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.blocks_ready, 3u);
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(got[b], MakePayload(TinyGlobalLayout(), keys[b].Prefix64()).bytes) << b;
  }
  // Layer-group-major: group 0 of every block, then "group 0 done", ...
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[0].type, FetchEvent::Type::kGroupReady);
  EXPECT_EQ(events[0].group, 0u);
  EXPECT_EQ(events[2].block, 2u);
  EXPECT_EQ(events[3].type, FetchEvent::Type::kLayerGroupDone);
  EXPECT_EQ(events[3].group, 0u);
  EXPECT_EQ(events.back().type, FetchEvent::Type::kBlockReady);
}

TEST_F(CacheStoreTest, PartialHitStopsAtFirstMissingBlock) {
  const auto tokens = Tokens(40, 2);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 4).ok());
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  EXPECT_EQ(m.blocks.size(), 4u);
  EXPECT_EQ(m.prompt_blocks, 10u);
  auto other = tokens;
  other[9] += 1;  // differs inside block 2
  auto m2 = t_.store->Match(t_.writer, t_.Request(other)).value();
  EXPECT_EQ(m2.blocks.size(), 2u);
}

TEST_F(CacheStoreTest, RecommitIsAnIdempotentNoOp) {
  const auto tokens = Tokens(12, 3);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 3).ok());
  const uint64_t used = t_.store->Stats().used_bytes;
  auto again = t_.CommitBlocks(tokens, 0, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->published, 0u);
  for (const Status& s : again->blocks) EXPECT_TRUE(s.ok());
  EXPECT_EQ(t_.store->Stats().used_bytes, used);
  EXPECT_EQ(t_.store->Stats().global_kv_entries, 3u);
  const auto keys = t_.Keys(tokens, t_.writer);
  CommitBlock cb{keys[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1)).value();
  EXPECT_EQ(r.blocks[0].state, ReserveState::kAlreadyPresent);
  EXPECT_EQ(r.write_lease, 0u);
}

TEST_F(CacheStoreTest, ReservedBytesStayInvisibleUntilPublished) {
  const auto tokens = Tokens(8, 4);
  const auto keys = t_.Keys(tokens, t_.writer);
  CommitBlock cb{keys[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1)).value();
  ASSERT_EQ(r.blocks[0].state, ReserveState::kReserved);
  ASSERT_NE(r.write_lease, 0u);
  // A second writer of the same key is told someone else is on it.
  auto r2 = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1)).value();
  EXPECT_EQ(r2.blocks[0].state, ReserveState::kInFlight);
  testing::Payload p = MakePayload(TinyGlobalLayout(), 9);
  std::copy(p.bytes.begin(), p.bytes.end(), r.blocks[0].buffer.begin());
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 0u);
  EXPECT_EQ(t_.store->Stats().reserved_entries, 1u);
  const uint64_t sum = p.checksum;
  auto pub = t_.store->Publish(t_.writer, r.write_lease, std::span(&sum, 1));
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(pub->published, 1u);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 1u);
  // The write lease ended with the publish.
  EXPECT_EQ(t_.store->Publish(t_.writer, r.write_lease, std::span(&sum, 1)).status().code(),
            StatusCode::kLeaseExpired);
}

TEST_F(CacheStoreTest, AbortReclaimsReservedSpaceAndIsRepeatable) {
  const auto tokens = Tokens(8, 5);
  const auto keys = t_.Keys(tokens, t_.writer);
  std::vector<CommitBlock> blocks = {{keys[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                                      TinyGlobalLayout().PayloadBytes(), std::nullopt},
                                     {keys[1], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                                      TinyGlobalLayout().PayloadBytes(), keys[0]}};
  auto r = t_.store->Reserve(t_.writer, TestModel(), blocks).value();
  EXPECT_GT(t_.store->Stats().used_bytes, 0u);
  EXPECT_TRUE(t_.store->Abort(t_.writer, r.write_lease).ok());
  EXPECT_TRUE(t_.store->Abort(t_.writer, r.write_lease).ok());
  EXPECT_EQ(t_.store->Stats().used_bytes, 0u);
  EXPECT_EQ(t_.store->Stats().reserved_entries, 0u);
  EXPECT_EQ(t_.store->Stats().write_leases, 0u);
}

TEST_F(CacheStoreTest, WriteLeaseExpiryReclaimsSpace) {
  const auto tokens = Tokens(4, 6);
  CommitBlock cb{t_.Keys(tokens, t_.writer)[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1), Seconds(5)).value();
  t_.clock.Advance(Seconds(6));
  // Publishing after expiry fails and frees the space at once.
  const uint64_t sum = 0;
  EXPECT_EQ(t_.store->Publish(t_.writer, r.write_lease, std::span(&sum, 1)).status().code(),
            StatusCode::kLeaseExpired);
  // A reservation nobody comes back for is reclaimed by maintenance.
  auto r2 = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1), Seconds(5)).value();
  EXPECT_EQ(r2.blocks[0].state, ReserveState::kReserved);
  t_.clock.Advance(Seconds(6));
  MaintenanceReport rep = t_.store->RunMaintenance();
  EXPECT_EQ(rep.expired_write_leases, 1u);
  EXPECT_EQ(t_.store->Stats().used_bytes, 0u);
  EXPECT_EQ(t_.store->Stats().reserved_entries, 0u);
}

TEST_F(CacheStoreTest, RenewalsNeverKeepALeasePastItsLongestLife) {
  // The default longest life is an hour; leases of 10 min renewed every
  // 9 min reach it: the renewal that would pass it is refused, and the
  // lease ends at the expiry it had.
  const auto tokens = Tokens(8, 9);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
  auto m = t_.store->Match(t_.writer, t_.Request(tokens, kMaxLeaseTtl)).value();
  ASSERT_NE(m.lease, 0u);
  const Nanos granted = t_.clock.Now();
  Nanos applied = 0;
  for (int i = 0; i < 5; ++i) {
    t_.clock.Advance(Minutes(9));
    ASSERT_TRUE(t_.store->RenewLease(t_.writer, m.lease, kMaxLeaseTtl, &applied).ok());
    EXPECT_EQ(applied, kMaxLeaseTtl);
  }
  t_.clock.Advance(Minutes(9));  // 54 min: renewed to 64 min, past the hour
  EXPECT_EQ(t_.store->RenewLease(t_.writer, m.lease, kMaxLeaseTtl).code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(t_.store->RenewLease(t_.writer, m.lease, Minutes(6)).ok());  // to the hour: fine
  t_.clock.Advance(Minutes(6) - 1);
  std::vector<std::vector<std::byte>> got;
  EXPECT_TRUE(FetchAll(m, &got).status.ok());
  EXPECT_EQ(t_.store->RenewLease(t_.writer, m.lease, Seconds(1)).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t_.clock.Now() + 1, granted + Hours(1));
  t_.clock.Advance(1);
  EXPECT_EQ(FetchAll(m, &got).status.code(), StatusCode::kLeaseExpired);
  EXPECT_EQ(t_.store->RenewLease(t_.writer, m.lease, kMaxLeaseTtl).code(),
            StatusCode::kLeaseExpired);

  // A store refuses a longest life shorter than a lease may be granted for.
  CacheStoreOptions o;
  o.dram.capacity_bytes = 1 << 20;
  o.max_lease_life = kMaxLeaseTtl - 1;
  EXPECT_EQ(CacheStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.max_lease_life = Hours(1);
  o.default_write_lease_ttl = kMaxLeaseTtl + 1;  // would outlive a renewal's limit
  EXPECT_EQ(CacheStore::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CacheStoreTest, WriteLeasesRenewToTheWriteDefaultAndOnlyWritersDropThem) {
  const auto tokens = Tokens(4, 7);
  const ChainKey key = t_.Keys(tokens, t_.writer)[0];
  CommitBlock cb{key, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1), Seconds(5)).value();
  ASSERT_EQ(r.blocks[0].state, ReserveState::kReserved);
  // A reader of the namespace cannot drop a writer's reservation.
  const Principal reader{t_.writer.ns, Role::kRead};
  EXPECT_EQ(t_.store->Abort(reader, r.write_lease).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(t_.store->Stats().write_leases, 1u);
  // Nor keep it for ever.
  EXPECT_EQ(t_.store->RenewLease(reader, r.write_lease, Seconds(60)).code(),
            StatusCode::kPermissionDenied);
  // Renewed with ttl 0, a write lease gets the write default (30 s), not
  // the read default (10 s).
  ASSERT_TRUE(t_.store->RenewLease(t_.writer, r.write_lease, 0).ok());
  t_.clock.Advance(Seconds(20));
  const testing::Payload p = MakePayload(TinyGlobalLayout(), key.Prefix64());
  std::copy(p.bytes.begin(), p.bytes.end(), r.blocks[0].buffer.begin());
  auto published = t_.store->Publish(t_.writer, r.write_lease, std::span(&p.checksum, 1));
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_TRUE(published->blocks[0].ok()) << published->blocks[0].ToString();
}

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
    threads.emplace_back([&, i] {
      for (uint32_t b = 0; b < kEach; ++b) {
        auto r = t.store->Reserve(t.writer, TestModel(), std::span(&chains[i][b], 1));
        if (r.ok()) {
          granted.fetch_add(1);
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
        }
      }
    });
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
    threads.emplace_back([&, i] {
      for (uint32_t b = 0; b < kEach; ++b) {
        auto r = t.store->Reserve(t.writer, TestModel(), std::span(&chains[i][b], 1));
        if (r.ok()) {
          reservations.fetch_add(1);
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
        }
      }
    });
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

TEST(LeaseIdTest, StoresDoNotStartTheirLeaseIdsAtTheSamePlace) {
  // A client names a lease by id alone: a node restarted must not grant the
  // ids of its previous life, which clients may still abort or write to.
  testing::TestStore a, b;
  const auto tokens = Tokens(4, 9);
  CommitBlock cb{a.Keys(tokens, a.writer)[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  const LeaseId first = a.store->Reserve(a.writer, TestModel(), std::span(&cb, 1))->write_lease;
  const LeaseId second = b.store->Reserve(b.writer, TestModel(), std::span(&cb, 1))->write_lease;
  EXPECT_NE(first, 0u);
  EXPECT_NE(second, 0u);
  EXPECT_NE(first, second);
  EXPECT_LT(first, uint64_t{1} << 53);  // exact as a JSON number
}

TEST(ReserveTest, AnEntryLargerThanTheTierIsRefusedAsSuch) {
  testing::TestStore t(128 << 10);  // under one 227,840-byte V4.1 block
  const Layout big = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const auto tokens = Tokens(8, 41);
  const CommitBlock block{t.Keys(tokens, t.writer)[0], StateKind::kGlobalKv, big.id,
                          big.PayloadBytes(), std::nullopt};
  auto refused = t.store->Reserve(t.writer, TestModel(), std::span(&block, 1));
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("larger than the whole DRAM tier"), std::string::npos)
      << refused.status().ToString();
  EXPECT_TRUE(t.CommitBlocks(tokens, 0, 2).ok());  // tiny blocks still fit
}

TEST_F(CacheStoreTest, BadChecksumIsNeverPublishedAndOrphansAreRefused) {
  const auto tokens = Tokens(12, 7);
  const auto keys = t_.Keys(tokens, t_.writer);
  std::vector<testing::Payload> p;
  std::vector<CommitPayload> commit;
  for (size_t b = 0; b < 3; ++b) p.push_back(MakePayload(TinyGlobalLayout(), b));
  for (size_t b = 0; b < 3; ++b) {
    CommitBlock cb{keys[b], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                   TinyGlobalLayout().PayloadBytes(), std::nullopt};
    if (b > 0) cb.parent = keys[b - 1];
    commit.push_back({cb, p[b].bytes, p[b].checksum});
  }
  commit[1].checksum ^= 1;  // block 1 lies about its bytes
  auto r = t_.store->Commit(t_.writer, TestModel(), commit).value();
  EXPECT_TRUE(r.blocks[0].ok());
  EXPECT_EQ(r.blocks[1].code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(r.blocks[2].code(), StatusCode::kNotFound);  // its parent never became visible
  EXPECT_EQ(r.published, 1u);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 1u);
  EXPECT_EQ(t_.store->Stats().global_kv_entries, 1u);
  // A block whose parent is absent is refused outright.
  auto orphan = t_.store->Commit(t_.writer, TestModel(), std::span(&commit[2], 1)).value();
  EXPECT_EQ(orphan.blocks[0].code(), StatusCode::kNotFound);
}

TEST_F(CacheStoreTest, ReadLeaseRenewExpireAndRelease) {
  const auto tokens = Tokens(8, 8);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
  auto m = t_.store->Match(t_.writer, t_.Request(tokens, Seconds(10))).value();
  ASSERT_NE(m.lease, 0u);
  EXPECT_EQ(t_.store->Stats().read_leases, 1u);
  auto info = t_.store->Inspect(t_.writer, m.blocks[0].key, StateKind::kGlobalKv).value();
  EXPECT_EQ(info.live_leases, 1u);
  t_.clock.Advance(Seconds(8));
  EXPECT_TRUE(t_.store->RenewLease(t_.writer, m.lease, Seconds(10)).ok());
  t_.clock.Advance(Seconds(8));  // 16 s after match, 8 s after renew: still live
  std::vector<std::vector<std::byte>> got;
  EXPECT_TRUE(FetchAll(m, &got).status.ok());
  t_.clock.Advance(Seconds(3));
  EXPECT_EQ(FetchAll(m, &got).status.code(), StatusCode::kLeaseExpired);
  EXPECT_EQ(t_.store->RenewLease(t_.writer, m.lease, Seconds(10)).code(),
            StatusCode::kLeaseExpired);
  EXPECT_EQ(t_.store->RunMaintenance().expired_read_leases, 1u);
  EXPECT_EQ(t_.store->Stats().read_leases, 0u);
  info = t_.store->Inspect(t_.writer, m.blocks[0].key, StateKind::kGlobalKv).value();
  EXPECT_EQ(info.live_leases, 0u);
  EXPECT_TRUE(t_.store->Abort(t_.writer, m.lease).ok());  // already gone: still fine
  // take_lease without a ttl gets the default of 10 s.
  MatchRequest req = t_.Request(tokens);
  req.take_lease = true;
  auto d = t_.store->Match(t_.writer, req).value();
  EXPECT_EQ(d.lease_expiry, t_.clock.Now() + Seconds(10));
  EXPECT_TRUE(t_.store->Abort(t_.writer, d.lease).ok());
}

TEST_F(CacheStoreTest, DeleteUnderLeaseWaitsForTheLease) {
  const auto tokens = Tokens(8, 9);
  const MatchResult m = LeaseThenDelete(tokens);
  // Gone for everyone new (block 1 went with its ancestor), its bytes still
  // held...
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 0u);
  EXPECT_GT(t_.store->Stats().used_bytes, 0u);
  // ...for the lease holder, who still reads intact bytes.
  ReadUnderLeaseAndLetGo(m);
  EXPECT_EQ(t_.store->Stats().used_bytes, 0u);
  EXPECT_EQ(t_.store->Stats().deleting_entries, 0u);
}

// A deleted entry a lease still holds leaves the index at once: storing its
// key again stores a new entry (before, the reservation reported the key "in
// flight" and nothing was stored until the lease ended).
TEST_F(CacheStoreTest, ARecommitOverADeletedButLeasedEntryStoresIt) {
  const auto tokens = Tokens(8, 19);
  const MatchResult m = LeaseThenDelete(tokens);
  const uint64_t used = t_.store->Stats().used_bytes;

  auto again = t_.CommitBlocks(tokens, 0, 2);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->published, 2u);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 2u);
  EXPECT_EQ(t_.store->Stats().used_bytes, 2 * used);
  EXPECT_TRUE(t_.store->CheckInvariantsForTesting().ok());

  // The lease holder still reads its own (old) entries; letting go frees them
  // and leaves the new ones.
  ReadUnderLeaseAndLetGo(m);
  EXPECT_EQ(t_.store->Stats().deleting_entries, 0u);
  EXPECT_EQ(t_.store->Stats().used_bytes, used);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 2u);
}

TEST_F(CacheStoreTest, CorruptStoredBytesAreNeverServed) {
  const auto tokens = Tokens(16, 10);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 4).ok());
  const auto keys = t_.Keys(tokens, t_.writer);
  auto bytes = t_.store->MutablePayloadForTesting(t_.writer, keys[2], StateKind::kGlobalKv);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() - 1] ^= std::byte{1};  // last layer group of block 2
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  ASSERT_EQ(m.blocks.size(), 4u);
  std::vector<std::vector<std::byte>> got;
  FetchOutcome out = FetchAll(m, &got);
  EXPECT_EQ(out.status.code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(out.blocks_ready, 2u);
  // The bad block and its descendant are dropped; the good prefix stays.
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 2u);
  EXPECT_NE(t_.store->metrics().RenderPrometheus().find("strata_checksum_failures_total 1"),
            std::string::npos);
  // A corrupt header is caught too.
  bytes = t_.store->MutablePayloadForTesting(t_.writer, keys[0], StateKind::kGlobalKv);
  bytes[20] ^= std::byte{4};
  m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  out = FetchAll(m, &got);
  EXPECT_EQ(out.status.code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(out.blocks_ready, 0u);
}

// The SWA state is delivered ahead of the bodies (a worker needs it, with
// layer group 0, before layer 0), and is good only with the prefix under
// it: a body that fails short of its boundary voids it, kSwaReady or not.
TEST_F(CacheStoreTest, SwaStateComesBeforeTheBodiesAndFallsWithACutPrefix) {
  const auto tokens = Tokens(20, 12);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 4).ok());
  const auto keys = t_.Keys(tokens, t_.writer);
  ASSERT_TRUE(t_.CommitSwa(keys[3], 79, t_.writer).ok());  // state after 4 blocks
  auto fetch = [&](std::vector<FetchEvent>* events, std::vector<std::byte>* swa) {
    auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
    EXPECT_TRUE(m.swa.has_value());
    std::vector<std::vector<std::byte>> blocks(m.blocks.size());
    FetchRequest req;
    req.match = &m;
    for (size_t b = 0; b < m.blocks.size(); ++b) {
      blocks[b].resize(m.blocks[b].payload_bytes);
      req.block_buffers.emplace_back(blocks[b]);
    }
    swa->assign(m.swa.has_value() ? m.swa->entry.payload_bytes : 0, std::byte{0});
    req.swa_buffer = *swa;
    req.on_event = [events](const FetchEvent& e) { events->push_back(e); };
    FetchOutcome out = t_.store->Fetch(t_.writer, req).Wait();
    EXPECT_TRUE(t_.store->Abort(t_.writer, m.lease).ok());
    return out;
  };
  std::vector<FetchEvent> events;
  std::vector<std::byte> swa;
  FetchOutcome out = fetch(&events, &swa);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.blocks_ready, 4u);
  EXPECT_TRUE(out.swa_ready);
  EXPECT_EQ(swa, MakePayload(testing::TinySwaLayout(), 79, 5).bytes);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().type, FetchEvent::Type::kSwaReady);
  EXPECT_EQ(
      std::count_if(events.begin(), events.end(),
                    [](const FetchEvent& e) { return e.type == FetchEvent::Type::kSwaReady; }),
      1);

  // Block 2's last layer group goes bad: the prefix stops at 2 blocks, short
  // of the SWA boundary, so the state that was reported is void.
  auto bytes = t_.store->MutablePayloadForTesting(t_.writer, keys[2], StateKind::kGlobalKv);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() - 1] ^= std::byte{1};
  events.clear();
  out = fetch(&events, &swa);
  EXPECT_EQ(out.status.code(), StatusCode::kChecksumMismatch) << out.status.ToString();
  EXPECT_EQ(out.blocks_ready, 2u);
  EXPECT_FALSE(out.swa_ready);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().type, FetchEvent::Type::kSwaReady);
}

TEST_F(CacheStoreTest, SwaStateAtTheHitBoundaryOrEarlier) {
  const auto tokens = Tokens(20, 11);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 4).ok());
  const auto keys = t_.Keys(tokens, t_.writer);
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  EXPECT_FALSE(m.swa.has_value());
  ASSERT_TRUE(t_.CommitSwa(keys[1], 77, t_.writer).ok());  // state after 2 blocks
  m = t_.store->Match(t_.writer, t_.Request(tokens, Seconds(5))).value();
  ASSERT_TRUE(m.swa.has_value());
  EXPECT_EQ(m.swa->boundary_blocks, 2u);
  ASSERT_TRUE(t_.CommitSwa(keys[3], 78, t_.writer).ok());
  auto m2 = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  EXPECT_EQ(m2.swa->boundary_blocks, 4u);

  // The state after block 2 comes with blocks 0 and 1.
  std::vector<std::byte> swa(m.swa->entry.payload_bytes);
  std::vector<std::vector<std::byte>> blocks(2);
  FetchRequest req;
  req.match = &m;
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b].resize(m.blocks[b].payload_bytes);
    req.block_buffers.emplace_back(blocks[b]);
  }
  req.swa_buffer = swa;
  FetchOutcome out = t_.store->Fetch(t_.writer, req).Wait();
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.blocks_ready, 2u);
  EXPECT_TRUE(out.swa_ready);
  EXPECT_EQ(swa, MakePayload(testing::TinySwaLayout(), 77, 5).bytes);
  EXPECT_TRUE(t_.store->Abort(t_.writer, m.lease).ok());
  // SWA state lives minutes, global KV days.
  t_.clock.Advance(Minutes(11));
  t_.store->RunMaintenance();
  m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  EXPECT_FALSE(m.swa.has_value());
  EXPECT_EQ(m.blocks.size(), 4u);
  t_.clock.Advance(Hours(72));
  EXPECT_GE(t_.store->RunMaintenance().ttl_expired, 4u);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(tokens))->blocks.size(), 0u);
  EXPECT_EQ(t_.store->Stats().used_bytes, 0u);
}

TEST_F(CacheStoreTest, TenantsNeverSeeEachOther) {
  const auto tokens = Tokens(8, 12);
  const Principal b{"tenant-b", Role::kAdmin};
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
  EXPECT_EQ(t_.store->Match(b, t_.Request(tokens))->blocks.size(), 0u);
  // Even with A's keys in hand, B reaches nothing of A's.
  const auto a_keys = t_.Keys(tokens, t_.writer);
  EXPECT_EQ(t_.store->Inspect(b, a_keys[0], StateKind::kGlobalKv).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(t_.store->Delete(b, a_keys[0], StateKind::kGlobalKv).code(), StatusCode::kNotFound);
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  std::vector<std::vector<std::byte>> got;
  EXPECT_EQ(FetchAll(m, &got, nullptr, &b).blocks_ready, 0u);
  // B committing blocks under A's keys creates B's own entries, not A's.
  std::vector<CommitPayload> forged;
  testing::Payload p = MakePayload(TinyGlobalLayout(), 1);
  forged.push_back({{a_keys[0], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                     TinyGlobalLayout().PayloadBytes(), std::nullopt},
                    p.bytes,
                    p.checksum});
  ASSERT_EQ(t_.store->Commit(b, TestModel(), forged)->published, 1u);
  std::vector<std::vector<std::byte>> mine;
  FetchAll(m, &mine);
  EXPECT_EQ(mine[0], MakePayload(TinyGlobalLayout(), a_keys[0].Prefix64()).bytes);
}

TEST_F(CacheStoreTest, RolesAreEnforced) {
  const auto tokens = Tokens(8, 13);
  const Principal reader{"tenant-a", Role::kRead};
  const Principal writer{"tenant-a", Role::kWrite};
  EXPECT_EQ(t_.CommitBlocks(tokens, 0, 1, reader).status().code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 1, writer).ok());
  EXPECT_EQ(t_.store->Match(reader, t_.Request(tokens))->blocks.size(), 1u);
  const ChainKey k = t_.Keys(tokens, writer)[0];
  EXPECT_EQ(t_.store->Delete(writer, k, StateKind::kGlobalKv).code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(t_.store->Pin(writer, k, StateKind::kGlobalKv, Seconds(5)).code(),
            StatusCode::kPermissionDenied);
}

TEST(InProcessStoreTest, BoundToItsCaller) {
  TestStore t;
  std::shared_ptr<CacheStore> shared(std::move(t.store));
  auto a = OpenInProcessStore(shared, {"tenant-a", Role::kWrite});
  auto b = OpenInProcessStore(shared, {"tenant-b", Role::kWrite});
  const auto tokens = Tokens(4, 14);
  testing::Payload p = MakePayload(TinyGlobalLayout(), 3);
  const ChainKey k =
      ChainKeys::ForPrompt({"tenant-a", TestModel(), ""}, tokens, kTinyBlockTokens).value()[0];
  CommitPayload cp{{k, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                    TinyGlobalLayout().PayloadBytes(), std::nullopt},
                   p.bytes,
                   p.checksum};
  ASSERT_EQ(a->Commit(TestModel(), std::span(&cp, 1))->published, 1u);
  EXPECT_EQ(a->Match(t.Request(tokens))->blocks.size(), 1u);
  EXPECT_EQ(b->Match(t.Request(tokens))->blocks.size(), 0u);
  EXPECT_TRUE(shared->CheckInvariantsForTesting().ok());
}

TEST_F(CacheStoreTest, MetricsReportTraffic) {
  const auto tokens = Tokens(8, 15);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  std::vector<std::vector<std::byte>> got;
  FetchAll(m, &got);
  const std::string text = t_.store->metrics().RenderPrometheus();
  EXPECT_NE(text.find("strata_hit_tokens_total 8"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_match_requests_total 1"), std::string::npos);
  EXPECT_NE(text.find("strata_commit_entries_total 2"), std::string::npos);
  EXPECT_NE(text.find("strata_entries{tier=\"dram\",kind=\"global_kv\"} 2"), std::string::npos);
  EXPECT_NE(text.find("strata_lookup_latency_seconds_count 1"), std::string::npos);
}

TEST(CacheStoreShutdownTest, DestroyWithLiveLeasesAndReservationsReleasesAll) {
  // Run under ASan: nothing may leak or be touched after free.
  auto t = std::make_unique<TestStore>();
  const auto tokens = Tokens(8, 16);
  ASSERT_TRUE(t->CommitBlocks(tokens, 0, 2).ok());
  auto m = t->store->Match(t->writer, t->Request(tokens, Seconds(30))).value();
  EXPECT_NE(m.lease, 0u);
  CommitBlock cb{t->Keys(Tokens(4, 99), t->writer)[0], StateKind::kGlobalKv,
                 testing::kTinyGlobalLayout, TinyGlobalLayout().PayloadBytes(), std::nullopt};
  EXPECT_TRUE(t->store->Reserve(t->writer, TestModel(), std::span(&cb, 1)).ok());
  t.reset();
}

TEST(CacheStoreBackgroundTest, MaintenanceThreadExpiresLeases) {
  CacheStoreOptions o;
  o.dram.capacity_bytes = 1 << 20;
  o.dram.prefault = false;
  o.maintenance_interval = 5 * kNanosPerMilli;
  o.extra_layouts = {TinyGlobalLayout()};
  auto store = CacheStore::Open(o).value();
  const Principal p{"ns", Role::kWrite};
  const auto tokens = Tokens(4, 17);
  CommitBlock cb{ChainKeys::ForPrompt({"ns", TestModel(), ""}, tokens, 4).value()[0],
                 StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  ASSERT_TRUE(store->Reserve(p, TestModel(), std::span(&cb, 1), 20 * kNanosPerMilli).ok());
  // Bounded wait for the background thread (it runs every 5 ms). The lease
  // leaves the table a moment before its reservation's bytes are freed.
  const auto released = [&] {
    const StoreStats st = store->Stats();
    return st.write_leases == 0 && st.used_bytes == 0;
  };
  for (int i = 0; i < 400 && !released(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(store->Stats().write_leases, 0u);
  EXPECT_EQ(store->Stats().used_bytes, 0u);
}

}  // namespace
}  // namespace strata

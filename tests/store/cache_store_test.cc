// The store contract end to end in one process: match, fetch, two-phase
// commit, abort, leases, deletes, tenants and roles (what a tenant may take
// of a shared store: tenant_limits_test.cc).
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

// The store's admin surface: listing with filters and pages, eviction by
// entry or filter (dry run, pins, leases), and the lease checks the data
// plane relies on.
#include <gtest/gtest.h>

#include <set>

#include "strata/cache_store.h"
#include "test_util.h"
#include "util/extent_allocator.h"

namespace strata {
namespace {

using testing::TestStore;
using testing::TinyGlobalLayout;
using testing::Tokens;

std::set<ChainKey> KeysOf(const std::vector<EntryInfo>& entries) {
  std::set<ChainKey> out;
  for (const EntryInfo& e : entries) out.insert(e.key);
  return out;
}

TEST(AdminTest, ListPagesInKeyOrderWithFilters) {
  TestStore t;
  const auto tokens = Tokens(40, 1);  // 10 tiny blocks
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 10).ok());
  t.clock.Advance(Seconds(100));
  const auto keys = t.Keys(tokens, t.writer);
  ASSERT_TRUE(t.CommitSwa(keys[9], 7, t.writer).ok());

  std::vector<EntryInfo> all;
  std::optional<EntryCursor> after;
  int pages = 0;
  do {
    auto page = t.store->ListEntries(t.writer, {}, after, 3);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->entries.size(), 3u);
    all.insert(all.end(), page->entries.begin(), page->entries.end());
    after = page->next;
    ++pages;
  } while (after.has_value());
  EXPECT_EQ(pages, 4);
  ASSERT_EQ(all.size(), 11u);
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_TRUE(all[i - 1].key < all[i].key ||
                (all[i - 1].key == all[i].key && all[i - 1].kind < all[i].kind));
  }

  EntryFilter swa_only;
  swa_only.kind = StateKind::kSwaState;
  auto swa = t.store->ListEntries(t.writer, swa_only, std::nullopt, 100);
  ASSERT_TRUE(swa.ok());
  ASSERT_EQ(swa->entries.size(), 1u);
  EXPECT_EQ(swa->entries[0].key, keys[9]);

  EntryFilter old;
  old.older_than = Seconds(50);
  auto olds = t.store->ListEntries(t.writer, old, std::nullopt, 100);
  ASSERT_TRUE(olds.ok());
  EXPECT_EQ(olds->entries.size(), 10u);  // the SWA state is younger

  ASSERT_TRUE(t.store->Pin(t.writer, keys[3], StateKind::kGlobalKv, Seconds(60)).ok());
  EntryFilter pinned;
  pinned.pinned = true;
  auto pins = t.store->ListEntries(t.writer, pinned, std::nullopt, 100);
  ASSERT_TRUE(pins.ok());
  ASSERT_EQ(pins->entries.size(), 1u);
  EXPECT_EQ(pins->entries[0].key, keys[3]);

  // Another namespace sees nothing; a writer may not list; limits hold.
  auto other = t.store->ListEntries({"tenant-b", Role::kAdmin}, {}, std::nullopt, 100);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->entries.empty());
  EXPECT_EQ(t.store->ListEntries({"tenant-a", Role::kWrite}, {}, std::nullopt, 10).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(t.store->ListEntries(t.writer, {}, std::nullopt, 0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(AdminTest, EvictByRootTakesTheSubtreeAndDryRunChangesNothing) {
  TestStore t;
  const auto a = Tokens(24, 2);  // 6 blocks
  ASSERT_TRUE(t.CommitBlocks(a, 0, 6).ok());
  const auto keys = t.Keys(a, t.writer);
  EvictRequest req;
  req.root = EntryCursor{keys[2], StateKind::kGlobalKv};
  req.dry_run = true;
  auto dry = t.store->Evict(t.writer, req);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(dry->evicted, 4u);
  EXPECT_EQ(KeysOf(dry->entries), (std::set<ChainKey>{keys[2], keys[3], keys[4], keys[5]}));
  EXPECT_EQ(t.store->Match(t.writer, t.Request(a))->blocks.size(), 6u);

  req.dry_run = false;
  auto done = t.store->Evict(t.writer, req);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->evicted, 4u);
  EXPECT_EQ(t.store->Match(t.writer, t.Request(a))->blocks.size(), 2u);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());
  EXPECT_EQ(t.store->Evict(t.writer, req).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(t.store->Evict({"tenant-b", Role::kAdmin}, req).status().code(), StatusCode::kNotFound);
}

TEST(AdminTest, EvictByFilterSparesPinsAndTheirAncestorsAndDefersLeases) {
  TestStore t;
  const auto a = Tokens(24, 3);  // 6 blocks
  const auto b = Tokens(16, 4);  // 4 blocks
  ASSERT_TRUE(t.CommitBlocks(a, 0, 6).ok());
  ASSERT_TRUE(t.CommitBlocks(b, 0, 4).ok());
  const auto ka = t.Keys(a, t.writer);
  const auto kb = t.Keys(b, t.writer);
  // Pin block 3 of a: blocks 0..3 must stay (ancestors), 4 and 5 may go.
  ASSERT_TRUE(t.store->Pin(t.writer, ka[3], StateKind::kGlobalKv, Seconds(60)).ok());
  // Lease all of b: its blocks are deferred, not forced.
  auto leased = t.store->Match(t.writer, t.Request(b, Seconds(5)));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->blocks.size(), 4u);

  EvictRequest req;  // the whole namespace
  auto r = t.store->Evict(t.writer, req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->skipped_pinned, 4u);
  EXPECT_EQ(r->evicted, 2u);
  EXPECT_EQ(r->deferred, 4u);
  EXPECT_EQ(t.store->Match(t.writer, t.Request(a))->blocks.size(), 4u);
  EXPECT_TRUE(t.store->Match(t.writer, t.Request(b))->blocks.empty());
  // The leased bytes stay readable until the lease ends, then go.
  std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(1024));
  FetchRequest fetch;
  fetch.match = &*leased;
  for (auto& buf : bufs) fetch.block_buffers.emplace_back(buf);
  EXPECT_EQ(t.store->Fetch(t.writer, fetch).Wait().blocks_ready, 4u);
  ASSERT_TRUE(t.store->Abort(t.writer, leased->lease).ok());
  EXPECT_EQ(t.store->Stats().deleting_entries, 0u);
  EXPECT_TRUE(t.store->CheckInvariantsForTesting().ok());

  // By age: nothing is old yet; later everything unpinned is.
  EvictRequest by_age;
  by_age.filter.older_than = Seconds(10);
  EXPECT_EQ(t.store->Evict(t.writer, by_age)->evicted, 0u);
  ASSERT_TRUE(t.store->Unpin(t.writer, ka[3], StateKind::kGlobalKv).ok());
  t.clock.Advance(Seconds(11));
  EXPECT_EQ(t.store->Evict(t.writer, by_age)->evicted, 4u);
  EXPECT_EQ(t.store->Stats().global_kv_entries, 0u);
  EXPECT_EQ(t.store->Evict({"tenant-a", Role::kWrite}, by_age).status().code(),
            StatusCode::kPermissionDenied);
}

// What the data plane asks: PinLeasedRange, released at once.
Status Covers(CacheStore& store, const Principal& who, LeaseId lease, uint64_t offset,
              uint64_t length, bool write) {
  Result<RangePin> pin = store.PinLeasedRange(who, lease, offset, length, write);
  if (!pin.ok()) return pin.status();
  store.ReleaseRangePin(*pin);
  return Status::Ok();
}

const Principal kReaderA{"tenant-a", Role::kRead};

// Commits all the tiny blocks of `tokens` and matches them with a 5 s read
// lease, as a reader of the same tenant.
Result<MatchResult> CommitAndLease(TestStore& t, const std::vector<uint32_t>& tokens) {
  const size_t blocks = tokens.size() / testing::kTinyBlockTokens;
  if (Result<PublishResult> r = t.CommitBlocks(tokens, 0, blocks); !r.ok()) return r.status();
  Result<MatchResult> m = t.store->Match(kReaderA, t.Request(tokens, Seconds(5)));
  if (m.ok() && m->blocks.size() != blocks) return Internal("not every block matched");
  return m;
}

TEST(AdminTest, LeaseCoverageIsWhatTheDataPlaneChecks) {
  TestStore t;
  CacheStore& store = *t.store;
  const Principal& reader = kReaderA;
  auto m = CommitAndLease(t, Tokens(8, 5));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const BlockMatch& b1 = m->blocks[1];
  EXPECT_NE(b1.checksum, 0u);
  EXPECT_TRUE(Covers(store, reader, m->lease, b1.location, b1.payload_bytes, false).ok());
  EXPECT_TRUE(Covers(store, reader, m->lease, b1.location + 10, 20, false).ok());
  EXPECT_EQ(Covers(store, reader, m->lease, b1.location, b1.payload_bytes + 1, false).code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(Covers(store, reader, m->lease, b1.location, 8, true).code(),
            StatusCode::kPermissionDenied);  // a read lease, and a reader
  EXPECT_EQ(Covers(store, {"tenant-b", Role::kRead}, m->lease, b1.location, 8, false).code(),
            StatusCode::kNotFound);
  // The arena bytes at `location` are the payload.
  const auto region = store.ArenaRegion();
  EXPECT_EQ(Checksum64(region.subspan(b1.location, TinyGlobalLayout().HeaderBytes())), b1.checksum);

  // A reservation's buffer is covered for writing under its write lease.
  const auto fresh = Tokens(4, 6);
  const auto key = t.Keys(fresh, t.writer)[0];
  CommitBlock cb{key, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = store.Reserve(t.writer, testing::TestModel(), std::span(&cb, 1));
  ASSERT_TRUE(r.ok());
  const uint64_t at = static_cast<uint64_t>(r->blocks[0].buffer.data() - region.data());
  EXPECT_TRUE(Covers(store, t.writer, r->write_lease, at, cb.payload_bytes, true).ok());
  EXPECT_FALSE(Covers(store, t.writer, r->write_lease, at, 8, false).ok());

  t.clock.Advance(Seconds(6));
  EXPECT_EQ(Covers(store, reader, m->lease, b1.location, 8, false).code(),
            StatusCode::kLeaseExpired);
  EXPECT_TRUE(store.CheckInvariantsForTesting().ok());
}

// Reserves fresh tiny blocks one at a time until the arena is full (at
// most `n`) and returns their extents: where the store puts new bytes now.
std::vector<Extent> FreshExtents(TestStore& t, uint32_t seed, size_t n) {
  const auto keys = t.Keys(Tokens(n * testing::kTinyBlockTokens, seed), t.writer);
  const auto region = t.store->ArenaRegion();
  std::vector<Extent> out;
  std::vector<LeaseId> leases;
  for (const ChainKey& k : keys) {
    const CommitBlock cb{k, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                         TinyGlobalLayout().PayloadBytes(), std::nullopt};
    auto r = t.store->Reserve(t.writer, testing::TestModel(), std::span(&cb, 1));
    if (!r.ok()) break;
    leases.push_back(r->write_lease);
    const auto buffer = r->blocks[0].buffer;
    out.push_back({static_cast<uint64_t>(buffer.data() - region.data()), buffer.size()});
  }
  for (const LeaseId lease : leases) EXPECT_TRUE(t.store->Abort(t.writer, lease).ok());
  return out;
}

bool Overlaps(const std::vector<Extent>& extents, uint64_t offset, uint64_t length) {
  for (const Extent& e : extents) {
    if (e.offset < offset + length && offset < e.offset + e.length) return true;
  }
  return false;
}

// A transfer authorized under a lease keeps its entry's bytes even when the
// lease ends and the entry is evicted meanwhile: nobody else's bytes may
// move into them (or, for a write, be overwritten by them) until it is over.
TEST(AdminTest, ATransferPinOutlivesItsLease) {
  TestStore t(16 * TinyGlobalLayout().PayloadBytes() + 4096, 1.0, 1.0);
  CacheStore& store = *t.store;
  const Principal& reader = kReaderA;
  const auto a = Tokens(4, 7);
  auto m = CommitAndLease(t, a);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const BlockMatch b = m->blocks[0];
  Result<RangePin> read_pin =
      store.PinLeasedRange(reader, m->lease, b.location, b.payload_bytes, false);
  ASSERT_TRUE(read_pin.ok());
  const auto region = store.ArenaRegion();
  const std::vector<std::byte> before(region.begin() + b.location,
                                      region.begin() + b.location + b.payload_bytes);
  ASSERT_TRUE(store.Abort(reader, m->lease).ok());
  EvictRequest evict;
  auto report = store.Evict(t.writer, evict);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->deferred, 1u);  // invisible now, its bytes still pinned
  auto gone = store.Match(reader, t.Request(a, Seconds(5)));
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->blocks.empty());
  // Fill the whole arena: nothing lands on the pinned bytes.
  const std::vector<Extent> fresh = FreshExtents(t, 70, 32);
  EXPECT_GE(fresh.size(), 8u);
  EXPECT_FALSE(Overlaps(fresh, b.location, b.payload_bytes));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), region.begin() + b.location));
  EXPECT_TRUE(store.CheckInvariantsForTesting().ok());
  store.ReleaseRangePin(*read_pin);
  EXPECT_EQ(store.Stats().deleting_entries, 0u);  // freed with the last pin
  EXPECT_TRUE(store.CheckInvariantsForTesting().ok());

  // A write lease that ends while a receive is landing: the reserved entry
  // turns invisible but keeps its bytes until the receive lets go.
  const auto key = t.Keys(Tokens(4, 8), t.writer)[0];
  CommitBlock cb{key, StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                 TinyGlobalLayout().PayloadBytes(), std::nullopt};
  auto r = store.Reserve(t.writer, testing::TestModel(), std::span(&cb, 1));
  ASSERT_TRUE(r.ok());
  const uint64_t at = static_cast<uint64_t>(r->blocks[0].buffer.data() - region.data());
  Result<RangePin> write_pin =
      store.PinLeasedRange(t.writer, r->write_lease, at, cb.payload_bytes, true);
  ASSERT_TRUE(write_pin.ok());
  t.clock.Advance(Seconds(600));  // the write lease expires
  (void)store.RunMaintenance();
  EXPECT_EQ(store.Stats().reserved_entries, 0u);
  EXPECT_EQ(store.Stats().deleting_entries, 1u);
  EXPECT_FALSE(Overlaps(FreshExtents(t, 71, 32), at, cb.payload_bytes));
  EXPECT_TRUE(store.CheckInvariantsForTesting().ok());
  // Its key is free meanwhile: a new writer gets a reservation of its own,
  // not "in flight" for a write nobody will publish.
  auto again = store.Reserve(t.writer, testing::TestModel(), std::span(&cb, 1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->blocks[0].state, ReserveState::kReserved);
  EXPECT_TRUE(store.Abort(t.writer, again->write_lease).ok());
  store.ReleaseRangePin(*write_pin);
  EXPECT_EQ(store.Stats().deleting_entries, 0u);
  EXPECT_TRUE(store.CheckInvariantsForTesting().ok());
  EXPECT_TRUE(Overlaps(FreshExtents(t, 72, 32), at, cb.payload_bytes));  // reusable again
}

}  // namespace
}  // namespace strata

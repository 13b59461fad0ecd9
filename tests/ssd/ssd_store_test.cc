// The store with an SSD tier: write-back, SSD hits in match, promotion on
// fetch (one read per entry under concurrency), restart, corrupt SSD data.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "ssd/ssd_index.h"
#include "strata/cache_store.h"
#include "temp_dir.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::kTinyBlockTokens;
using testing::ScopedTempDir;
using testing::ScopedTmpfs;
using testing::TestModel;
using testing::TinyGlobalLayout;
using testing::TinySwaLayout;
using testing::Tokens;

// Holds the store's write-back before its next batch until Release, or
// the end of the scope: the write-back thread must never wait forever, even
// after a failed ASSERT.
class WriteBackGate {
 public:
  explicit WriteBackGate(CacheStore& store) {
    store.SetBeforeWriteBackHookForTesting([go = go_] { go.wait(); });
  }
  ~WriteBackGate() { Release(); }
  WriteBackGate(const WriteBackGate&) = delete;
  WriteBackGate& operator=(const WriteBackGate&) = delete;
  void Release() {
    if (!std::exchange(released_, true)) open_.set_value();
  }

 private:
  std::promise<void> open_;
  std::shared_future<void> go_ = open_.get_future().share();
  bool released_ = false;
};

class SsdStoreTest : public ::testing::Test {
 protected:
  void TearDown() override { store_.reset(); }

  CacheStoreOptions Options() {
    CacheStoreOptions o;
    o.dram.capacity_bytes = 1 << 20;
    o.dram.granule_bytes = 4096;  // O_DIRECT straight into the arena
    o.dram.prefault = false;
    o.dram.try_huge_pages = false;
    o.maintenance_interval = 0;
    o.clock = &clock_;
    o.index_shards = 8;
    o.extra_layouts = {TinyGlobalLayout(), TinySwaLayout()};
    SsdTierOptions ssd;
    ssd.dir = dir_ + "/ssd";
    ssd.capacity_bytes = 16 << 20;
    ssd.queue_depth = 8;
    ssd.rings = 2;
    ssd.io_buffer_bytes = 64 << 10;
    ssd.clock = &clock_;
    o.ssd = ssd;
    return o;
  }
  void Open(const CacheStoreOptions& o) {
    store_.reset();
    store_ = CacheStore::Open(o).value();
  }
  void Open() { Open(Options()); }

  std::vector<ChainKey> Keys(std::span<const uint32_t> tokens) const {
    return ChainKeys::ForPrompt({who_.ns, TestModel(), ""}, tokens, kTinyBlockTokens).value();
  }
  std::vector<testing::Payload> Commit(std::span<const uint32_t> tokens) {
    const std::vector<ChainKey> keys = Keys(tokens);
    std::vector<testing::Payload> payloads;
    std::vector<CommitPayload> commit;
    payloads.reserve(keys.size());
    commit.reserve(keys.size());
    for (const ChainKey& k : keys) {
      payloads.push_back(testing::MakePayload(TinyGlobalLayout(), k.Prefix64()));
    }
    for (size_t b = 0; b < keys.size(); ++b) {
      CommitBlock cb{keys[b], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                     TinyGlobalLayout().PayloadBytes(), std::nullopt};
      if (b > 0) cb.parent = keys[b - 1];
      commit.push_back({cb, payloads[b].bytes, payloads[b].checksum});
    }
    auto r = store_->Commit(who_, TestModel(), commit);
    EXPECT_TRUE(r.ok() && r->published == keys.size());
    return payloads;
  }
  MatchResult Match(std::span<const uint32_t> tokens, bool lease = false) {
    MatchRequest req;
    req.model_id = TestModel();
    req.tokens = tokens;
    req.block_tokens = kTinyBlockTokens;
    req.take_lease = lease;
    return store_->Match(who_, req).value();
  }
  FetchOutcome Fetch(const MatchResult& m, std::vector<std::vector<std::byte>>* out) {
    out->assign(m.blocks.size(), {});
    FetchRequest req;
    req.match = &m;
    for (size_t b = 0; b < m.blocks.size(); ++b) {
      (*out)[b].resize(m.blocks[b].payload_bytes);
      req.block_buffers.emplace_back((*out)[b]);
    }
    return store_->Fetch(who_, req).Wait();
  }
  // Flips one byte of an entry's body in the SSD data file (store closed).
  void CorruptOnSsd(const ChainKey& key) {
    auto tier = SsdTier::Open(*Options().ssd).value();
    const SsdEntryMeta meta = *tier->Lookup({who_.ns, TestModel(), key, StateKind::kGlobalKv});
    const std::string path = tier->DataFilePathForTesting(meta.file);
    tier.reset();
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(meta.offset + meta.payload_bytes - 3), SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(meta.offset + meta.payload_bytes - 3), SEEK_SET);
    std::fputc(c ^ 0x01, f);
    std::fclose(f);
  }
  // `tokens` match `matched` blocks, of which block `bad` fails its SSD
  // checksum: a fetch serves the blocks before it, and the bad one is
  // dropped (a miss from then on). Returns the blocks served.
  std::vector<std::vector<std::byte>> ExpectServedUpToTheBadBlock(
      const std::vector<uint32_t>& tokens, size_t matched, uint32_t bad) {
    MatchResult m = Match(tokens);
    EXPECT_EQ(m.blocks.size(), matched);
    std::vector<std::vector<std::byte>> out;
    FetchOutcome f = Fetch(m, &out);
    EXPECT_EQ(f.blocks_ready, bad);  // the usable prefix ends before the bad block
    EXPECT_FALSE(f.status.ok());
    EXPECT_EQ(store_->Stats().ssd.checksum_failures, 1u);
    EXPECT_EQ(Match(tokens).blocks.size(), bad);
    ExpectInvariants();
    out.resize(std::min<size_t>(out.size(), f.blocks_ready));
    return out;
  }
  // A leased match by keys that promotes SSD-only blocks (what a node runs
  // for a remote caller).
  MatchResult MatchKeysPromoting(std::span<const ChainKey> keys, bool independent = false) {
    MatchKeysRequest req;
    req.model_id = TestModel();
    req.root = ChainKeys::Root({who_.ns, TestModel(), ""});
    req.keys = keys;
    req.block_tokens = kTinyBlockTokens;
    req.want_swa = false;
    req.take_lease = true;
    req.promote_ssd = true;
    req.independent_keys = independent;
    return store_->MatchKeys(who_, req).value();
  }
  void ExpectInvariants() {
    Status st = store_->CheckInvariantsForTesting();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  ScopedTempDir tmp_{"strata-ssd-store"};
  std::string dir_ = tmp_.path();
  ManualClock clock_;
  Principal who_{"tenant-a", Role::kAdmin};
  std::unique_ptr<CacheStore> store_;
};

TEST_F(SsdStoreTest, LeavingDramRenewsTheSsdCopysRecency) {
  // Hits served from DRAM never reach the SSD copy. Unless leaving DRAM
  // counts as a use, a block that was hot in DRAM is the oldest on SSD and
  // goes first there, just when DRAM has let go of it.
  CacheStoreOptions o = Options();
  o.dram.capacity_bytes = 4 * 4096;  // four tiny blocks
  o.high_watermark = o.low_watermark = 1.0;
  o.ssd->capacity_bytes = 8 * SsdIoBytes(TinyGlobalLayout().PayloadBytes());
  o.ssd->high_watermark = o.ssd->low_watermark = 1.0;
  Open(o);
  auto block = [](uint32_t seed) { return Tokens(kTinyBlockTokens, seed); };
  auto commit = [&](uint32_t seed) {
    clock_.Advance(Seconds(1));
    Commit(block(seed));
    store_->FlushWriteBack();
  };
  for (uint32_t seed = 1; seed <= 4; ++seed) commit(seed);  // block 1 is the oldest write
  clock_.Advance(Seconds(1));
  ASSERT_EQ(Match(block(1)).blocks.size(), 1u);             // a DRAM hit
  for (uint32_t seed = 5; seed <= 8; ++seed) commit(seed);  // DRAM lets go of 2, 3, 4, then 1
  EXPECT_EQ(store_->Stats().ssd.entries, 8u);
  commit(9);  // the SSD tier is full: one entry must go, and not block 1
  EXPECT_EQ(store_->Stats().ssd.evictions, 1u);
  const MatchResult m = Match(block(1));
  ASSERT_EQ(m.blocks.size(), 1u);
  EXPECT_EQ(m.blocks[0].tier, Tier::kSsd);
}

TEST_F(SsdStoreTest, WrittenBackBlocksAreServedAfterRestart) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(8 * kTinyBlockTokens, 1);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  StoreStats st = store_->Stats();
  ASSERT_TRUE(st.ssd_enabled);
  EXPECT_EQ(st.ssd.entries, 8u);
  EXPECT_EQ(st.ssd_writeback_pending, 0u);

  Open();  // a new process on the same data directory: DRAM is empty
  MatchResult m = Match(tokens);
  ASSERT_EQ(m.blocks.size(), 8u);
  for (const BlockMatch& b : m.blocks) EXPECT_EQ(b.tier, Tier::kSsd);
  std::vector<std::vector<std::byte>> out;
  FetchOutcome f = Fetch(m, &out);
  ASSERT_TRUE(f.status.ok()) << f.status.ToString();
  EXPECT_EQ(f.blocks_ready, 8u);
  for (size_t b = 0; b < 8; ++b) EXPECT_EQ(out[b], payloads[b].bytes) << b;
  EXPECT_EQ(store_->Stats().ssd_promotions, 8u);
  // Promoted: now DRAM hits, with the prefix tree rebuilt.
  m = Match(tokens);
  ASSERT_EQ(m.blocks.size(), 8u);
  for (const BlockMatch& b : m.blocks) EXPECT_EQ(b.tier, Tier::kDram);
  auto info = store_->Inspect(who_, m.blocks[3].key, StateKind::kGlobalKv);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->has_parent);
  EXPECT_EQ(info->children, 1u);
  ExpectInvariants();
  // Nothing was written twice.
  store_->FlushWriteBack();
  EXPECT_EQ(store_->Stats().ssd.entries, 8u);
}

TEST_F(SsdStoreTest, MixedTiersWithALeaseFetchWhole) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(6 * kTinyBlockTokens, 2);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  Open();
  // Promote the first two blocks, so the next match spans both tiers.
  {
    const std::vector<uint32_t> head(tokens.begin(), tokens.begin() + 2 * kTinyBlockTokens);
    std::vector<std::vector<std::byte>> out;
    ASSERT_TRUE(Fetch(Match(head), &out).status.ok());
  }
  MatchResult m = Match(tokens, /*lease=*/true);
  ASSERT_EQ(m.blocks.size(), 6u);
  EXPECT_EQ(m.blocks[1].tier, Tier::kDram);
  EXPECT_EQ(m.blocks[2].tier, Tier::kSsd);
  std::vector<std::vector<std::byte>> out;
  FetchOutcome f = Fetch(m, &out);
  ASSERT_TRUE(f.status.ok()) << f.status.ToString();
  EXPECT_EQ(f.blocks_ready, 6u);
  for (size_t b = 0; b < 6; ++b) EXPECT_EQ(out[b], payloads[b].bytes) << b;
  ASSERT_TRUE(store_->Abort(who_, m.lease).ok());
  ExpectInvariants();
}

TEST_F(SsdStoreTest, ConcurrentFetchesOfOneSsdEntryShareOneRead) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(3 * kTinyBlockTokens, 3);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  Open();
  const MatchResult m = Match(tokens);
  ASSERT_EQ(m.blocks.size(), 3u);
  std::atomic<int> whole{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      std::vector<std::vector<std::byte>> out;
      FetchOutcome f = Fetch(m, &out);
      bool same = f.status.ok() && f.blocks_ready == 3;
      for (size_t b = 0; same && b < 3; ++b) same = out[b] == payloads[b].bytes;
      if (same) whole.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(whole.load(), 8);
  EXPECT_EQ(store_->Stats().ssd_promotions, 3u);  // one read per entry, not per fetch
  ExpectInvariants();
}

TEST_F(SsdStoreTest, CorruptSsdDataIsAMissNeverServed) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(4 * kTinyBlockTokens, 4);
  Commit(tokens);
  store_->FlushWriteBack();
  store_.reset();
  CorruptOnSsd(Keys(tokens)[2]);
  Open();
  ExpectServedUpToTheBadBlock(tokens, 4, 2);
}

// Issue #39: an index record that points key A at key B's extent served
// B's bytes as A, and no checksum noticed (each record's checksum was of
// the payload alone). The checksum covers the key now: A is refused like a
// corrupt block.
TEST_F(SsdStoreTest, AnIndexRecordPointingAtAnotherKeysBytesIsAMissNeverServed) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(4 * kTinyBlockTokens, 5);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  store_.reset();
  const std::vector<ChainKey> keys = Keys(tokens);
  {
    // Block 2's record takes block 3's (extent, checksum and all), and
    // block 3's goes: its extent is claimed once, by the wrong key.
    auto tier = SsdTier::Open(*Options().ssd).value();
    const SsdKey a{who_.ns, TestModel(), keys[2], StateKind::kGlobalKv};
    const SsdKey b{who_.ns, TestModel(), keys[3], StateKind::kGlobalKv};
    const SsdEntryMeta theirs = *tier->Lookup(b);
    tier.reset();
    auto index = SsdIndex::Open(dir_ + "/ssd/index").value();
    const std::pair<std::string, SsdEntryMeta> put{EncodeSsdKey(a), theirs};
    const std::string gone = EncodeSsdKey(b);
    ASSERT_TRUE(index->Apply(std::span(&put, 1), std::span(&gone, 1), /*sync=*/true).ok());
  }
  Open();
  const std::vector<std::vector<std::byte>> served = ExpectServedUpToTheBadBlock(tokens, 3, 2);
  for (size_t i = 0; i < served.size(); ++i) EXPECT_EQ(served[i], payloads[i].bytes) << i;
}

// Bytes that go bad in DRAM after their publish are caught by write-back's
// own verification: the entry (and what hangs from it) is dropped, and no
// SSD copy of the bad bytes is made (the SSD tier would checksum them as
// given and serve them as good after DRAM let go).
TEST_F(SsdStoreTest, WriteBackVerifiesAndDropsBytesThatWentBadInDram) {
  Open();
  WriteBackGate gate(*store_);
  const std::vector<uint32_t> tokens = Tokens(4 * kTinyBlockTokens, 8);
  Commit(tokens);
  const std::vector<ChainKey> keys = Keys(tokens);
  std::span<std::byte> bytes =
      store_->MutablePayloadForTesting(who_, keys[2], StateKind::kGlobalKv);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() - 5] ^= std::byte{0x40};
  gate.Release();
  store_->FlushWriteBack();
  const StoreStats st = store_->Stats();
  EXPECT_EQ(st.evictions[static_cast<size_t>(EvictReason::kChecksum)], 2u);  // block 2 and 3
  EXPECT_EQ(Match(tokens).blocks.size(), 2u);
  ExpectInvariants();
  store_.reset();
  auto tier = SsdTier::Open(*Options().ssd).value();
  EXPECT_TRUE(tier->Lookup({who_.ns, TestModel(), keys[1], StateKind::kGlobalKv}).has_value());
  EXPECT_FALSE(tier->Lookup({who_.ns, TestModel(), keys[2], StateKind::kGlobalKv}).has_value());
}

// Bytes that go bad after the write-back verified them (here, before the
// SSD write) make an SSD copy that fails its first read: the copy vouches
// for what was verified, never for what was written.
TEST_F(SsdStoreTest, BytesThatGoBadAfterTheWriteBackVerifiedThemFailTheCopysRead) {
  std::span<std::byte> victim;  // set before the write-back runs
  std::atomic<bool> flipped{false};
  CacheStoreOptions o = Options();
  o.ssd->before_data_write_hook = [&] {
    if (!victim.empty() && !flipped.exchange(true)) victim[victim.size() - 5] ^= std::byte{0x40};
  };
  Open(o);
  WriteBackGate gate(*store_);
  const std::vector<uint32_t> tokens = Tokens(4 * kTinyBlockTokens, 9);
  Commit(tokens);
  const std::vector<ChainKey> keys = Keys(tokens);
  victim = store_->MutablePayloadForTesting(who_, keys[2], StateKind::kGlobalKv);
  ASSERT_FALSE(victim.empty());
  gate.Release();
  store_->FlushWriteBack();
  ASSERT_TRUE(flipped.load());
  store_.reset();
  auto tier = SsdTier::Open(*Options().ssd).value();
  const SsdKey bad{who_.ns, TestModel(), keys[2], StateKind::kGlobalKv};
  ASSERT_TRUE(tier->Lookup(bad).has_value());
  std::vector<std::byte> out(TinyGlobalLayout().PayloadBytes());
  EXPECT_EQ(tier->Read({bad, out}).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Stats().checksum_failures, 1u);
  EXPECT_TRUE(tier->Read({{who_.ns, TestModel(), keys[1], StateKind::kGlobalKv}, out}).ok());
}

// An entry deleted while the write-back writes its copy: the copy exists
// for a moment (the delete's SSD erase found none yet; the write-back
// erases it after) and must not be promoted back meanwhile.
TEST_F(SsdStoreTest, AnEntryDeletedWhileWrittenBackIsNotPromotedFromItsCopy) {
  const std::vector<uint32_t> tokens = Tokens(kTinyBlockTokens, 10);
  const std::vector<ChainKey> keys = Keys(tokens);
  std::atomic<bool> armed{false};
  Status deleted = Internal("not run");
  size_t promoted = 99;
  CacheStoreOptions o = Options();
  o.ssd->before_data_write_hook = [&] {  // the entry is pinned for its write now
    if (armed.exchange(false)) deleted = store_->Delete(who_, keys[0], StateKind::kGlobalKv);
  };
  Open(o);
  store_->SetAfterWriteBackWriteHookForTesting([&] {
    if (promoted != 99) return;
    const MatchResult m = MatchKeysPromoting(keys);
    promoted = m.blocks.size();
    if (m.lease != 0) (void)store_->Abort(who_, m.lease);
  });
  armed = true;
  Commit(tokens);
  store_->FlushWriteBack();
  EXPECT_TRUE(deleted.ok()) << deleted.ToString();
  EXPECT_EQ(promoted, 0u);
  EXPECT_EQ(Match(tokens).blocks.size(), 0u);
  EXPECT_EQ(store_->Stats().ssd.entries, 0u);
  ExpectInvariants();
}

// An eviction by filter in a namespace this process has not seen yet: a
// match that interns the namespace and promotes a block while the eviction
// reads the SSD tier loses that block from DRAM too, not just its copy.
TEST_F(SsdStoreTest, AnEvictionCoversANamespaceInternedWhileItReadsTheSsdTier) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(2 * kTinyBlockTokens, 11);
  Commit(tokens);
  store_->FlushWriteBack();
  Open();  // DRAM empty, the namespace not interned
  const std::vector<ChainKey> keys = Keys(tokens);
  size_t promoted = 99;
  store_->SetAfterSsdScanHookForTesting([&] {
    if (promoted != 99) return;
    const MatchResult m = MatchKeysPromoting(keys);
    promoted = m.blocks.size();
    if (m.lease != 0) (void)store_->Abort(who_, m.lease);
  });
  auto r = store_->Evict(who_, EvictRequest{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(promoted, 2u);
  EXPECT_EQ(Match(tokens).blocks.size(), 0u);
  EXPECT_EQ(store_->Stats().global_kv_entries, 0u);
  ExpectInvariants();
}

// A cold leased match reads a run of SSD-only blocks as one batch and
// publishes them in order; the first block that fails ends the prefix, and
// the blocks after it are not leased.
TEST_F(SsdStoreTest, ColdLeasedMatchPromotesRunsAndEndsAtABadBlock) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(12 * kTinyBlockTokens, 6);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  const std::vector<ChainKey> keys = Keys(tokens);
  store_.reset();
  CorruptOnSsd(keys[9]);
  Open();
  // Blocks 4 and 5 promoted on their own first: the full match then sees
  // SSD 0-3, DRAM 4-5, SSD 6-11.
  {
    const MatchResult m = MatchKeysPromoting(std::span(keys).subspan(4, 2), true);
    ASSERT_EQ(m.blocks.size(), 2u);
    ASSERT_TRUE(store_->Abort(who_, m.lease).ok());
  }
  const MatchResult m = MatchKeysPromoting(keys);
  ASSERT_EQ(m.blocks.size(), 9u);  // ends before the corrupt block 9
  for (size_t b = 0; b < 9; ++b) {
    EXPECT_EQ(m.blocks[b].key, keys[b]) << b;
    EXPECT_EQ(m.blocks[b].tier, Tier::kDram) << b;
  }
  EXPECT_NE(m.lease, 0u);
  EXPECT_EQ(store_->Stats().ssd.checksum_failures, 1u);
  std::vector<std::vector<std::byte>> out;
  FetchOutcome f = Fetch(m, &out);
  ASSERT_TRUE(f.status.ok()) << f.status.ToString();
  ASSERT_EQ(f.blocks_ready, 9u);
  for (size_t b = 0; b < 9; ++b) EXPECT_EQ(out[b], payloads[b].bytes) << b;
  // Promoted with their parents: the chain is linked again.
  auto info = store_->Inspect(who_, keys[2], StateKind::kGlobalKv);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->has_parent);
  EXPECT_EQ(info->children, 1u);
  EXPECT_EQ(info->live_leases, 1u);
  // Blocks past the bad one were read with the run, but with no parent to
  // link to they stay on SSD only: never in DRAM outside the prefix tree.
  for (size_t b : {10, 11}) {
    info = store_->Inspect(who_, keys[b], StateKind::kGlobalKv);
    ASSERT_TRUE(info.ok()) << b;
    EXPECT_EQ(info->tier, Tier::kSsd) << b;
    EXPECT_EQ(info->live_leases, 0u) << b;
  }
  ASSERT_TRUE(store_->Abort(who_, m.lease).ok());
  EXPECT_EQ(store_->Stats().read_leases, 0u);
  ExpectInvariants();
}

TEST_F(SsdStoreTest, HitOnceAdmissionWritesBackOnlyHitEntries) {
  CacheStoreOptions o = Options();
  o.ssd_admission = CacheStoreOptions::SsdAdmission::kHitOnce;
  Open(o);
  const std::vector<uint32_t> tokens = Tokens(4 * kTinyBlockTokens, 5);
  Commit(tokens);
  store_->FlushWriteBack();
  EXPECT_EQ(store_->Stats().ssd.entries, 0u);
  const std::vector<uint32_t> head(tokens.begin(), tokens.begin() + 2 * kTinyBlockTokens);
  EXPECT_EQ(Match(head).blocks.size(), 2u);
  store_->FlushWriteBack();
  EXPECT_EQ(store_->Stats().ssd.entries, 2u);
}

// A write-back and a promotion copy an entry, they do not commit it again:
// its commit time (what `evict --older-than` goes by) stays on every copy.
TEST_F(SsdStoreTest, CopiesKeepTheCommitTime) {
  CacheStoreOptions o = Options();
  o.ssd_admission = CacheStoreOptions::SsdAdmission::kHitOnce;  // written back when hit
  Open(o);
  const std::vector<uint32_t> tokens = Tokens(2 * kTinyBlockTokens, 41);
  const std::vector<ChainKey> keys = Keys(tokens);
  const Nanos committed = clock_.Now();
  Commit(tokens);
  clock_.Advance(Seconds(10));
  ASSERT_EQ(Match(tokens).blocks.size(), 2u);
  store_->FlushWriteBack();
  ASSERT_EQ(store_->Stats().ssd.entries, 2u);
  Open(o);  // the SSD copies only
  auto on_ssd = store_->Inspect(who_, keys[1], StateKind::kGlobalKv);
  ASSERT_TRUE(on_ssd.ok()) << on_ssd.status().ToString();
  EXPECT_EQ(on_ssd->tier, Tier::kSsd);
  EXPECT_EQ(on_ssd->commit_time, committed);

  clock_.Advance(Seconds(10));
  std::vector<std::vector<std::byte>> out;
  ASSERT_EQ(Fetch(Match(tokens), &out).blocks_ready, 2u);  // promoted
  auto in_dram = store_->Inspect(who_, keys[1], StateKind::kGlobalKv);
  ASSERT_TRUE(in_dram.ok()) << in_dram.status().ToString();
  EXPECT_EQ(in_dram->tier, Tier::kDram);
  EXPECT_EQ(in_dram->commit_time, committed);
  EntryFilter older;
  older.older_than = Seconds(15);
  EXPECT_EQ(store_->ListEntries(who_, older, std::nullopt, 10)->entries.size(), 2u);
}

TEST_F(SsdStoreTest, SwaStateStaysInDramUnlessConfigured) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(2 * kTinyBlockTokens, 6);
  Commit(tokens);
  const ChainKey boundary = Keys(tokens).back();
  testing::Payload p = testing::MakePayload(TinySwaLayout(), 9, 5);
  CommitPayload cp{{boundary, StateKind::kSwaState, testing::kTinySwaLayout,
                    TinySwaLayout().PayloadBytes(), std::nullopt},
                   p.bytes,
                   p.checksum};
  ASSERT_TRUE(store_->Commit(who_, TestModel(), std::span(&cp, 1)).ok());
  store_->FlushWriteBack();
  EXPECT_EQ(store_->Stats().ssd.entries, 2u);  // the two GLOBAL_KV blocks only
  Open();
  MatchResult m = Match(tokens);
  EXPECT_EQ(m.blocks.size(), 2u);
  EXPECT_FALSE(m.swa.has_value());
}

TEST_F(SsdStoreTest, TtlExpiresSsdEntries) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(2 * kTinyBlockTokens, 7);
  Commit(tokens);
  store_->FlushWriteBack();
  Open();
  EXPECT_EQ(Match(tokens).blocks.size(), 2u);
  clock_.Advance(Hours(73));
  EXPECT_EQ(Match(tokens).blocks.size(), 0u);
  store_->RunMaintenance();
  EXPECT_EQ(store_->Stats().ssd.entries, 0u);
  EXPECT_EQ(store_->Stats().ssd.used_bytes, 0u);
}

TEST_F(SsdStoreTest, DeleteRemovesTheSsdCopy) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(3 * kTinyBlockTokens, 8);
  Commit(tokens);
  store_->FlushWriteBack();
  ASSERT_TRUE(store_->Delete(who_, Keys(tokens)[1], StateKind::kGlobalKv).ok());
  Open();
  EXPECT_EQ(Match(tokens).blocks.size(), 1u);
}

// A delete that lands while the block is being written back must not
// leave an SSD copy behind: the delete's own SSD erase runs before the copy
// is indexed, so it finds nothing to erase.
TEST_F(SsdStoreTest, DeleteDuringWriteBackLeavesNoSsdCopy) {
  const std::vector<uint32_t> tokens = Tokens(kTinyBlockTokens, 1000);
  std::atomic<bool> armed{true};
  Status deleted = Internal("the hook did not run");
  CacheStoreOptions o = Options();
  o.ssd->before_index_write_hook = [&] {
    if (armed.exchange(false))
      deleted = store_->Delete(who_, Keys(tokens)[0], StateKind::kGlobalKv);
  };
  Open(o);
  Commit(tokens);
  store_->FlushWriteBack();
  ASSERT_TRUE(deleted.ok()) << deleted.ToString();
  auto info = store_->Inspect(who_, Keys(tokens)[0], StateKind::kGlobalKv);
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound)
      << (info.ok() ? std::string(TierName(info->tier)) : info.status().ToString());
  Open(o);  // and after a restart, which reads the SSD index
  EXPECT_TRUE(Match(tokens).blocks.empty());
  ExpectInvariants();
}

// A delete (or an eviction by name) that lands while the block is being
// promoted from SSD, after the read and before the promoted entry is
// published, must not see it come back in DRAM: the promotion finds its SSD
// copy gone and gives up.
TEST_F(SsdStoreTest, DeleteDuringPromotionLeavesNoCopyInEitherTier) {
  for (const bool by_evict : {false, true}) {
    SCOPED_TRACE(by_evict ? "Evict" : "Delete");
    const std::vector<uint32_t> tokens = Tokens(2 * kTinyBlockTokens, by_evict ? 1101 : 1100);
    Open();
    Commit(tokens);
    store_->FlushWriteBack();
    Open();  // SSD only now
    const ChainKey key = Keys(tokens)[0];
    std::atomic<bool> armed{true};
    Status deleted = Internal("the hook did not run");
    store_->SetBeforePromotionPublishHookForTesting([&] {
      if (!armed.exchange(false)) return;
      if (by_evict) {
        EvictRequest one;
        one.root = EntryCursor{key, StateKind::kGlobalKv};
        auto r = store_->Evict(who_, one);
        deleted = r.ok() ? Status::Ok() : r.status();
      } else {
        deleted = store_->Delete(who_, key, StateKind::kGlobalKv);
      }
    });
    std::vector<std::vector<std::byte>> out;
    const FetchOutcome f = Fetch(Match(tokens), &out);
    ASSERT_TRUE(deleted.ok()) << deleted.ToString();
    EXPECT_EQ(f.blocks_ready, 0u) << f.status.ToString();
    auto info = store_->Inspect(who_, key, StateKind::kGlobalKv);
    EXPECT_EQ(info.status().code(), StatusCode::kNotFound)
        << (info.ok() ? std::string(TierName(info->tier)) : info.status().ToString());
    EXPECT_TRUE(Match(tokens).blocks.empty());
    ExpectInvariants();
    Open();  // and after a restart, which reads the SSD index
    EXPECT_TRUE(Match(tokens).blocks.empty());
  }
}

// A fetch that promotes blocks 0..2 while another caller is promoting
// block 1 waits for that promotion before publishing block 2, so block 2 is
// linked under block 1 (deleting block 1 then takes block 2 out of DRAM).
TEST_F(SsdStoreTest, APromotionWaitsForAParentAnotherCallerIsPromoting) {
  Open();
  const std::vector<uint32_t> tokens = Tokens(3 * kTinyBlockTokens, 1200);
  const std::vector<testing::Payload> payloads = Commit(tokens);
  store_->FlushWriteBack();
  Open();  // SSD only now
  const std::vector<ChainKey> keys = Keys(tokens);
  std::mutex mu;
  std::condition_variable cv;
  int publishes = 0;  // promotion batches that reached publication
  store_->SetBeforePromotionPublishHookForTesting([&] {
    std::unique_lock lock(mu);
    ++publishes;
    cv.notify_all();
    // The first (the other caller's block 1) waits for the second (ours).
    if (publishes == 1) cv.wait(lock, [&] { return publishes >= 2; });
  });
  std::thread other([&] { (void)MatchKeysPromoting(std::span(keys).subspan(1, 1), true); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return publishes >= 1; });
  }
  std::vector<std::vector<std::byte>> out;
  const FetchOutcome f = Fetch(Match(tokens), &out);
  other.join();
  ASSERT_TRUE(f.status.ok()) << f.status.ToString();
  ASSERT_EQ(f.blocks_ready, 3u);
  for (size_t b = 0; b < 3; ++b) EXPECT_TRUE(out[b] == payloads[b].bytes) << b;
  ASSERT_TRUE(store_->Delete(who_, keys[1], StateKind::kGlobalKv).ok());
  auto child = store_->Inspect(who_, keys[2], StateKind::kGlobalKv);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->tier, Tier::kSsd);  // its DRAM copy went with block 1's subtree
  ExpectInvariants();
}

TEST_F(SsdStoreTest, AdminCallsReachSsdOnlyEntries) {
  Open();
  const std::vector<uint32_t> a = Tokens(3 * kTinyBlockTokens, 21);
  const std::vector<uint32_t> b = Tokens(2 * kTinyBlockTokens, 22);
  const std::vector<uint32_t> c = Tokens(2 * kTinyBlockTokens, 23);
  Commit(a);
  Commit(b);
  Commit(c);
  store_->FlushWriteBack();
  Open();  // DRAM is empty; all 7 entries are on the SSD tier only
  const std::vector<ChainKey> ka = Keys(a), kb = Keys(b), kc = Keys(c);

  auto info = store_->Inspect(who_, ka[1], StateKind::kGlobalKv);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->tier, Tier::kSsd);
  EXPECT_EQ(info->model_id, TestModel());
  EXPECT_EQ(info->payload_bytes, TinyGlobalLayout().PayloadBytes());

  // Listed, in pages, with the tier filter.
  std::vector<EntryInfo> listed;
  std::optional<EntryCursor> cursor;
  do {
    auto page = store_->ListEntries(who_, {}, cursor, 3);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->entries.size(), 3u);
    listed.insert(listed.end(), page->entries.begin(), page->entries.end());
    cursor = page->next;
  } while (cursor.has_value());
  ASSERT_EQ(listed.size(), 7u);
  for (const EntryInfo& e : listed) EXPECT_EQ(e.tier, Tier::kSsd);
  EntryFilter dram_only;
  dram_only.tier = Tier::kDram;
  EXPECT_TRUE(store_->ListEntries(who_, dram_only, std::nullopt, 100)->entries.empty());
  EXPECT_TRUE(
      store_->ListEntries({"tenant-b", Role::kAdmin}, {}, std::nullopt, 100)->entries.empty());

  // A dry run lists SSD-only entries and removes nothing.
  EvictRequest filter;
  filter.dry_run = true;
  auto dry = store_->Evict(who_, filter);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(dry->evicted, 7u);
  ASSERT_EQ(dry->entries.size(), 7u);
  for (const EntryInfo& e : dry->entries) EXPECT_EQ(e.tier, Tier::kSsd);
  EXPECT_EQ(Match(a).blocks.size(), 3u);
  // Another namespace sees none of them.
  EXPECT_EQ(store_->Evict({"tenant-b", Role::kAdmin}, filter)->evicted, 0u);
  // Looking at a namespace with nothing stored leaves no trace of it.
  const std::vector<std::string> names = store_->Namespaces();
  EXPECT_EQ(std::count(names.begin(), names.end(), "tenant-b"), 0);

  // By key: the block goes, so the prompt now hits up to it.
  EvictRequest one;
  one.root = EntryCursor{ka[1], StateKind::kGlobalKv};
  auto r = store_->Evict(who_, one);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->evicted, 1u);
  EXPECT_EQ(Match(a).blocks.size(), 1u);
  EXPECT_EQ(store_->Evict(who_, one).status().code(), StatusCode::kNotFound);

  // Delete of an SSD-only entry.
  ASSERT_TRUE(store_->Delete(who_, kb[0], StateKind::kGlobalKv).ok());
  EXPECT_EQ(Match(b).blocks.size(), 0u);
  EXPECT_EQ(store_->Delete(who_, kb[0], StateKind::kGlobalKv).code(), StatusCode::kNotFound);

  // A promoted entry and its SSD copy both go with a filter eviction.
  std::vector<std::vector<std::byte>> out;
  MatchResult mc = Match(c);
  ASSERT_TRUE(Fetch(mc, &out).status.ok());  // promoted into DRAM
  EvictRequest all;
  auto gone = store_->Evict(who_, all);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->evicted, 5u);  // a[0], a[2], b[1] from SSD; c[0..1] from both tiers
  EXPECT_EQ(gone->deferred, 0u);
  Open();
  EXPECT_EQ(Match(a).blocks.size(), 0u);
  EXPECT_EQ(Match(c).blocks.size(), 0u);
  EXPECT_EQ(store_->Stats().ssd.entries, 0u);
}

// Pages of a listing over both tiers: SSD-only entries, promoted ones (in
// DRAM with an SSD copy) and DRAM-only ones, with and without filters.
// Whatever the page size, the pages together are the one-page listing:
// each entry once, in (key, kind) order, no page longer than asked. (The
// SSD tier is read a page at a time, so a page stops where its read did.)
TEST_F(SsdStoreTest, ListPagesOverBothTiersEqualOneBigPage) {
  Open();
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 12; ++i) prompts.push_back(Tokens(2 * kTinyBlockTokens, 40 + i));
  for (size_t i = 0; i < 9; ++i) Commit(prompts[i]);
  store_->FlushWriteBack();
  Open();  // 18 entries, all SSD-only
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(Fetch(Match(prompts[i]), &out).status.ok());  // promoted: both tiers
  }
  for (size_t i = 9; i < 12; ++i) Commit(prompts[i]);  // DRAM, written back or not
  // Pinned in DRAM: its SSD copy (never pinned) is not listed on its own,
  // so an "unpinned" listing skips both: pages of the SSD tier hold fewer
  // entries than they read.
  for (size_t i = 0; i < 2; ++i) {
    for (const ChainKey& k : Keys(prompts[i])) {
      ASSERT_TRUE(store_->Pin(who_, k, StateKind::kGlobalKv, Seconds(600)).ok());
    }
  }
  EntryFilter ssd_only, dram_only, older, unpinned, pinned;
  ssd_only.tier = Tier::kSsd;
  dram_only.tier = Tier::kDram;
  older.older_than = 1;
  unpinned.pinned = false;
  pinned.pinned = true;
  clock_.Advance(1);
  for (const EntryFilter& filter : {EntryFilter{}, ssd_only, dram_only, older, unpinned, pinned}) {
    auto whole = store_->ListEntries(who_, filter, std::nullopt, kMaxBlocksPerCall);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_FALSE(whole->next.has_value());
    for (uint32_t limit : {1u, 2u, 5u}) {
      std::vector<EntryInfo> paged;
      std::optional<EntryCursor> cursor;
      size_t pages_read = 0;
      for (;; ++pages_read) {
        ASSERT_LT(pages_read, 100u);
        auto page = store_->ListEntries(who_, filter, cursor, limit);
        ASSERT_TRUE(page.ok()) << page.status().ToString();
        EXPECT_LE(page->entries.size(), limit);
        paged.insert(paged.end(), page->entries.begin(), page->entries.end());
        if (!page->next.has_value()) break;
        cursor = page->next;
      }
      ASSERT_EQ(paged.size(), whole->entries.size()) << "limit " << limit;
      if (filter.pinned == std::optional<bool>(true) && limit == 1) {
        // No SSD copy is ever pinned: the tier is not paged through.
        EXPECT_EQ(pages_read + 1, paged.size());  // one entry per page, the last page too
      }
      for (size_t i = 0; i < paged.size(); ++i) {
        EXPECT_EQ(paged[i].key, whole->entries[i].key) << "limit " << limit << " at " << i;
        EXPECT_EQ(paged[i].tier, whole->entries[i].tier) << "limit " << limit << " at " << i;
      }
    }
  }
  auto all = store_->ListEntries(who_, {}, std::nullopt, kMaxBlocksPerCall);
  ASSERT_EQ(all->entries.size(), 24u);
  EXPECT_EQ(store_->ListEntries(who_, ssd_only, std::nullopt, kMaxBlocksPerCall)->entries.size(),
            12u);
  EXPECT_EQ(store_->ListEntries(who_, dram_only, std::nullopt, kMaxBlocksPerCall)->entries.size(),
            12u);
  EXPECT_EQ(store_->ListEntries(who_, unpinned, std::nullopt, kMaxBlocksPerCall)->entries.size(),
            20u);
  EXPECT_EQ(store_->ListEntries(who_, pinned, std::nullopt, kMaxBlocksPerCall)->entries.size(), 4u);
}

// A DRAM entry past its TTL but not swept yet: its SSD copy, which lives
// longer, is what a listing shows and what an eviction by filter removes.
TEST_F(SsdStoreTest, AnExpiredDramEntrysSsdCopyIsListedBeforeTheSweep) {
  CacheStoreOptions o = Options();
  o.global_kv_ttl = Seconds(60);
  Open(o);
  const std::vector<uint32_t> a = Tokens(2 * kTinyBlockTokens, 60);
  Commit(a);
  store_->FlushWriteBack();
  clock_.Advance(Seconds(61));  // no maintenance runs (interval 0)
  auto page = store_->ListEntries(who_, {}, std::nullopt, 100);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->entries.size(), 2u);
  for (const EntryInfo& e : page->entries) EXPECT_EQ(e.tier, Tier::kSsd);
  auto gone = store_->Evict(who_, EvictRequest{});
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_EQ(gone->evicted, 2u);
  EXPECT_EQ(store_->Stats().ssd.entries, 0u);
  ExpectInvariants();
}

// Listing and evicting by filter read the SSD tier before they take the
// store's structure lock. `a` (3 blocks; a[0] already on SSD) is committed
// with hit-once admission; during the next call's SSD read it is hit (so
// written back) and dropped from DRAM: pushed out by 8 blocks of another
// namespace, or expired (the SSD copies live on). The read missed a[1..2]
// and the DRAM pass no longer finds them; the call must see all three,
// each once.
class SsdScanRaceTest : public SsdStoreTest {
 protected:
  enum class Drop { kPushedOut, kExpired };

  void SetUp() override {
    SsdStoreTest::SetUp();
    CacheStoreOptions o = Options();
    o.ssd_admission = CacheStoreOptions::SsdAdmission::kHitOnce;
    o.dram.capacity_bytes = 8 * 4096;  // 8 tiny blocks
    o.high_watermark = o.low_watermark = 1;
    o.global_kv_ttl = Seconds(60);  // the SSD tier keeps copies for 72 h
    Open(o);
    Commit(a_);
    EXPECT_EQ(Match(std::span(a_).first(kTinyBlockTokens)).blocks.size(), 1u);
    store_->FlushWriteBack();
    EXPECT_EQ(store_->Stats().ssd.entries, 1u);
  }
  // During the next scan only, `a` leaves DRAM by `drop`.
  void DropDuringNextScan(Drop drop) {
    store_->SetAfterSsdScanHookForTesting([this, drop] {
      if (hooked_++ > 0) return;
      EXPECT_EQ(Match(a_).blocks.size(), 3u);
      store_->FlushWriteBack();
      if (drop == Drop::kPushedOut) {
        AsOtherTenant([&] { Commit(b_); });
      } else {
        clock_.Advance(Seconds(61));
        EXPECT_EQ(store_->RunMaintenance().ttl_expired, 3u);
      }
      for (const ChainKey& k : Keys(a_)) {
        auto info = store_->Inspect(who_, k, StateKind::kGlobalKv);
        ASSERT_TRUE(info.ok()) << info.status().ToString();
        EXPECT_EQ(info->tier, Tier::kSsd);
      }
    });
  }
  template <typename Fn>
  void AsOtherTenant(Fn fn) {
    const Principal a = who_;
    who_ = {"tenant-b", Role::kAdmin};
    fn();
    who_ = a;
  }
  void ExpectAEvicted(const Result<EvictReport>& r) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(hooked_, 1);
    EXPECT_EQ(r->evicted, 3u);  // a[0] was read and logged: counted once
    EXPECT_EQ(store_->Stats().ssd.entries, 0u);
    EXPECT_EQ(Match(a_).blocks.size(), 0u);
    ExpectInvariants();
  }

  const std::vector<uint32_t> a_ = Tokens(3 * kTinyBlockTokens, 31);
  const std::vector<uint32_t> b_ = Tokens(8 * kTinyBlockTokens, 32);
  int hooked_ = 0;
};

TEST_F(SsdScanRaceTest, ListSeesEntriesThatLeftDramDuringItsScan) {
  DropDuringNextScan(Drop::kPushedOut);
  auto page = store_->ListEntries(who_, {}, std::nullopt, 100);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(hooked_, 1);
  std::vector<ChainKey> listed;
  for (const EntryInfo& e : page->entries) {
    EXPECT_EQ(e.tier, Tier::kSsd);
    listed.push_back(e.key);
  }
  std::vector<ChainKey> want = Keys(a_);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);  // in key order, each once
}

TEST_F(SsdScanRaceTest, FilterEvictionRemovesEntriesEvictedFromDramDuringItsScan) {
  DropDuringNextScan(Drop::kPushedOut);
  ExpectAEvicted(store_->Evict(who_, EvictRequest{}));
  AsOtherTenant([&] { EXPECT_EQ(Match(b_).blocks.size(), 8u); });  // not covered: kept
}

TEST_F(SsdScanRaceTest, FilterEvictionRemovesEntriesExpiredFromDramDuringItsScan) {
  DropDuringNextScan(Drop::kExpired);
  ExpectAEvicted(store_->Evict(who_, EvictRequest{}));
}

// Promotion, DRAM eviction, commits, write-back and admin scans all at
// once: every byte a fetch reports ready is the byte committed.
TEST_F(SsdStoreTest, ConcurrentPromotionsCommitsAndEvictions) {
  CacheStoreOptions o = Options();
  o.dram.capacity_bytes = 24 * 4096;  // 24 tiny blocks: constant eviction
  o.ssd_writeback_batch = 4;
  Open(o);
  auto chain = [](int i) { return Tokens(6 * kTinyBlockTokens, static_cast<uint32_t>(100 + i)); };
  auto commit = [&](const std::vector<uint32_t>& tokens) {
    const std::vector<ChainKey> keys = Keys(tokens);
    std::vector<testing::Payload> payloads;
    std::vector<CommitPayload> blocks;
    payloads.reserve(keys.size());
    blocks.reserve(keys.size());
    for (const ChainKey& k : keys) {
      payloads.push_back(testing::MakePayload(TinyGlobalLayout(), k.Prefix64()));
    }
    for (size_t b = 0; b < keys.size(); ++b) {
      CommitBlock cb{keys[b], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                     TinyGlobalLayout().PayloadBytes(), std::nullopt};
      if (b > 0) cb.parent = keys[b - 1];
      blocks.push_back({cb, payloads[b].bytes, payloads[b].checksum});
    }
    (void)store_->Commit(who_, TestModel(), blocks);  // may not fit: fine
  };
  constexpr int kChains = 12;  // 72 blocks through a 24-block DRAM tier
  for (int i = 0; i < kChains; ++i) {
    commit(chain(i));
    store_->FlushWriteBack();
  }
  ASSERT_EQ(store_->Stats().ssd.entries, kChains * 6u);

  std::atomic<uint64_t> verified{0}, wrong{0};
  std::vector<std::thread> threads;
  threads.reserve(7);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 2 * kChains; ++round) {
        const std::vector<uint32_t> tokens = chain((round + 3 * t) % kChains);
        const std::vector<ChainKey> keys = Keys(tokens);
        MatchRequest req;
        req.model_id = TestModel();
        req.tokens = tokens;
        req.block_tokens = kTinyBlockTokens;
        req.take_lease = round % 2 == 0;
        auto m = store_->Match(who_, req);
        if (!m.ok()) continue;
        std::vector<std::vector<std::byte>> out;
        FetchOutcome f = Fetch(*m, &out);
        for (uint32_t b = 0; b < f.blocks_ready; ++b) {
          const auto expect = testing::MakePayload(TinyGlobalLayout(), keys[b].Prefix64());
          (out[b] == expect.bytes ? verified : wrong).fetch_add(1);
        }
        (void)store_->Abort(who_, m->lease);
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = kChains; i < kChains + 8; ++i) commit(chain(i));  // new chains meanwhile
  });
  // Admin scans of both tiers meanwhile, two at once (their logs of
  // entries leaving DRAM overlap); a dry run removes nothing.
  std::atomic<uint64_t> admin_failures{0};
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 10; ++round) {
        EvictRequest dry;
        dry.dry_run = true;
        if (!store_->ListEntries(who_, {}, std::nullopt, 16).ok()) admin_failures.fetch_add(1);
        if (!store_->Evict(who_, dry).ok()) admin_failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  store_->FlushWriteBack();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(verified.load(), 0u);
  EXPECT_EQ(admin_failures.load(), 0u);
  EXPECT_GT(store_->Stats().ssd_promotions, 0u);
  ExpectInvariants();
}

// The SSD data directory on a 1 MiB tmpfs: write-back fails for lack of
// space, SSD writes stop, and the DRAM tier serves everything regardless.
TEST_F(SsdStoreTest, FullDiskStopsWriteBackAndDramKeepsServing) {
  ScopedTmpfs tmpfs(1 << 20);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  CacheStoreOptions o = Options();
  o.dram.capacity_bytes = 8 << 20;
  o.ssd->dir = tmpfs.path() + "/ssd";
  o.ssd->min_free_bytes = 256 << 10;  // headroom for the index
  Open(o);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 40; ++i) {
    prompts.push_back(Tokens(8 * kTinyBlockTokens, 1000 + i));  // 320 blocks of 4 KiB
    Commit(prompts.back());
  }
  store_->FlushWriteBack();
  const StoreStats st = store_->Stats();
  EXPECT_GE(st.ssd.write_failures, 1u);
  EXPECT_FALSE(st.ssd.writes_enabled);
  EXPECT_LT(st.ssd.entries, 320u);
  EXPECT_EQ(st.global_kv_entries, 320u);
  for (const auto& p : prompts) {
    const MatchResult m = Match(p);
    ASSERT_EQ(m.blocks.size(), 8u);
    std::vector<std::vector<std::byte>> out;
    EXPECT_TRUE(Fetch(m, &out).status.ok());
  }
  ExpectInvariants();
  store_.reset();  // close before unmounting
}

}  // namespace
}  // namespace strata

// The HBM tier: PrefixCache on its own (prefix-safe eviction by the store's
// policies, never a page someone holds), then in the engine (a warm turn
// finds its prefix here first, asks the store only for the rest, and its
// output stays bit-identical to a cold run's).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "strata/metrics.h"
#include "strata/worker/block_pool.h"
#include "strata/worker/engine.h"
#include "strata/worker/prefix_cache.h"
#include "temp_dir.h"
#include "worker_test_util.h"

namespace strata::worker {
namespace {

using testing::Attach;
using testing::ExpectIdentical;
using testing::ForwardingStore;
using testing::NewCacheStore;
using testing::Options;
using testing::RunOn;
using testing::RunOne;
using testing::RunResult;
using testing::TinyModel;
using testing::Tokens;

ChainKey Key(uint64_t n) {
  ChainKey k;
  for (size_t i = 0; i < sizeof(n); ++i) k.bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  return k;
}

// Puts a page holding `n` in the cache as block `n` over block `n - 1`.
bool InsertBlock(PrefixCache& cache, BlockPool& pool, uint64_t n) {
  Result<uint32_t> page = pool.Allocate();
  if (!page.ok()) return false;
  pool.Page(*page)[0] = static_cast<std::byte>(n);
  const bool cached = cache.Insert(StateKind::kGlobalKv, Key(n),
                                   n > 0 ? std::optional<ChainKey>(Key(n - 1)) : std::nullopt,
                                   *page, /*checksum=*/100 + n);
  pool.Unref(*page);  // the cache's reference is its own
  return cached;
}

TEST(PrefixCacheTest, EvictsLeavesOnlyAndNeverAPageSomeoneHolds) {
  for (const char* policy : {"lru", "aslru", "deadline"}) {
    SCOPED_TRACE(policy);
    BlockPool pool(64, 8);
    auto cache = PrefixCache::Create(pool, policy);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    PrefixCache& c = **cache;
    for (uint64_t n = 0; n < 4; ++n) ASSERT_TRUE(InsertBlock(c, pool, n));
    EXPECT_FALSE(InsertBlock(c, pool, 9));  // its parent (8) is not cached: it could never hit
    EXPECT_FALSE(InsertBlock(c, pool, 2));  // already there
    Result<uint32_t> swa = pool.Allocate();
    ASSERT_TRUE(swa.ok());
    EXPECT_TRUE(c.Insert(StateKind::kSwaState, Key(3), std::nullopt, *swa, 7));
    EXPECT_FALSE(c.Insert(StateKind::kSwaState, Key(8), std::nullopt, *swa, 7));  // no block 8
    pool.Unref(*swa);
    EXPECT_EQ(c.pages(), 5u);
    EXPECT_EQ(pool.used_pages(), 5u);

    // A reader holds block 3: the SWA state over it can go, block 3 cannot
    // (held), and so neither can the blocks above it (not leaves).
    std::optional<PrefixCache::Hit> held = c.Acquire(StateKind::kGlobalKv, Key(3));
    ASSERT_TRUE(held.has_value());
    EXPECT_EQ(held->checksum, 103u);
    EXPECT_EQ(pool.Page(held->page)[0], std::byte{3});
    EXPECT_EQ(c.EvictablePages(), 4u);
    EXPECT_TRUE(c.EvictOne());
    EXPECT_FALSE(c.Acquire(StateKind::kSwaState, Key(3)).has_value());
    EXPECT_FALSE(c.EvictOne());
    EXPECT_EQ(c.pages(), 4u);

    pool.Unref(held->page);  // the reader is done: the chain goes leaf first
    for (uint64_t n = 4; n > 0; --n) {
      EXPECT_TRUE(c.EvictOne());
      EXPECT_FALSE(c.Acquire(StateKind::kGlobalKv, Key(n - 1)).has_value()) << n - 1;
      for (uint64_t below = 0; below + 1 < n; ++below) {
        std::optional<PrefixCache::Hit> h = c.Acquire(StateKind::kGlobalKv, Key(below));
        ASSERT_TRUE(h.has_value()) << below;
        pool.Unref(h->page);
      }
    }
    EXPECT_FALSE(c.EvictOne());
    EXPECT_EQ(pool.used_pages(), 0u);
    EXPECT_EQ(c.evictions(), 5u);
  }
  BlockPool pool(64, 2);
  EXPECT_FALSE(PrefixCache::Create(pool, "fifo").ok());
}

TEST(PrefixCacheTest, LetsGoOfEveryPageWhenDestroyed) {
  BlockPool pool(64, 4);
  {
    auto cache = PrefixCache::Create(pool, "lru");
    ASSERT_TRUE(cache.ok());
    for (uint64_t n = 0; n < 4; ++n) ASSERT_TRUE(InsertBlock(**cache, pool, n));
    EXPECT_EQ(pool.used_pages(), 4u);
  }
  EXPECT_EQ(pool.used_pages(), 0u);
}

// Counts the store calls a warm turn makes.
class CountingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<MatchResult> MatchKeys(const MatchKeysRequest& r) override {
    ++matches;
    first_key = r.keys.empty() ? ChainKey{} : r.keys.front();
    return inner_.MatchKeys(r);
  }
  FetchFuture Fetch(const FetchRequest& r) override {
    ++fetches;
    return inner_.Fetch(r);
  }
  std::atomic<int> matches{0};
  std::atomic<int> fetches{0};
  ChainKey first_key;
};

EngineOptions WithHbm(Store* store, uint32_t pool_pages = 64) {
  EngineOptions o = Options(store);
  o.hbm_cache_policy = "lru";
  o.pool_pages = pool_pages;
  return o;
}

// The chain key of each block of `prompt` (the in-process store's
// namespace is "default").
std::vector<ChainKey> BlockKeys(const std::vector<uint32_t>& prompt, const ModelId& model) {
  Result<std::vector<ChainKey>> keys =
      ChainKeys::ForPrompt(ChainRoot{"default", model, ""}, prompt, 256);
  EXPECT_TRUE(keys.ok());
  return keys.ok() ? std::move(keys).value() : std::vector<ChainKey>{};
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(HbmTierTest, AWarmTurnOnTheSameWorkerMakesNoStoreCallButItsCommitsAndMatchesColdOutput) {
  auto cache = NewCacheStore();
  auto inner = Attach(cache);
  CountingStore store(*inner);
  auto engine = Engine::Create(TinyModel(), WithHbm(&store));
  ASSERT_TRUE(engine.ok());
  const std::vector<uint32_t> turn1 = Tokens(600, 1);
  (void)RunOn(**engine, 1, turn1);
  const std::vector<uint32_t> turn2 = Concat(turn1, Tokens(306, 2));
  const int matches_before = store.matches.load();
  const RunResult warm = RunOn(**engine, 2, turn2);
  EXPECT_EQ(store.matches.load(), matches_before);  // the whole prefix was here
  EXPECT_EQ(store.fetches.load(), 0);
  EXPECT_EQ(warm.stats.hit_tokens, 512u);
  EXPECT_EQ(warm.stats.hbm_hit_tokens, 512u);
  EXPECT_TRUE(warm.stats.swa_hit);  // turn 1's state at its last boundary, kept here
  EXPECT_EQ(warm.stats.replayed_tokens, 0u);
  ExpectIdentical(RunOne(Options(nullptr), turn2), warm);
  const EngineCounters c = (*engine)->Counters();
  EXPECT_EQ(c.pool_pages_held, 0u);
  EXPECT_GT(c.hbm_cached_pages, 0u);
  EXPECT_EQ(c.held_leases, 0u);
  EXPECT_EQ(cache->Stats().read_leases, 0u);
}

TEST(HbmTierTest, APrefixPartlyHereIsCompletedFromTheStoreAndBothAreKeptHere) {
  auto cache = NewCacheStore();
  auto inner = Attach(cache);
  const std::vector<uint32_t> turn1 = Tokens(600, 1);
  const std::vector<uint32_t> turn2 = Concat(turn1, Tokens(306, 2));
  const std::vector<uint32_t> turn3 = Concat(turn2, Tokens(300, 3));
  // This worker ran turn 1: its HBM tier has two blocks. Then another
  // worker ran turn 2 (exactly, from turn 1's SWA state): the store has
  // three blocks, and the SWA state at 768 over them.
  CountingStore store(*inner);
  auto engine = Engine::Create(TinyModel(), WithHbm(&store));
  ASSERT_TRUE(engine.ok());
  (void)RunOn(**engine, 1, turn1);
  EXPECT_TRUE(RunOne(Options(inner.get()), turn2).stats.swa_hit);
  const int matches_before = store.matches.load();
  const RunResult warm = RunOn(**engine, 2, turn3);
  EXPECT_EQ(store.matches.load(), matches_before + 1);
  EXPECT_EQ(store.first_key, BlockKeys(turn3, (*engine)->model_id())[2]);  // from block 2 on
  EXPECT_EQ(warm.stats.hbm_hit_tokens, 512u);
  EXPECT_EQ(warm.stats.hit_tokens, 768u);  // the store's third block too
  EXPECT_TRUE(warm.stats.swa_hit);         // the store's state at 768, over both tiers' blocks
  ExpectIdentical(RunOne(Options(nullptr), turn3), warm);
  // The fetched block stayed, and the one computed after it: the same
  // prompt again needs no store call.
  const int matches_after = store.matches.load();
  const RunResult again = RunOn(**engine, 3, turn3);
  EXPECT_EQ(store.matches.load(), matches_after);
  EXPECT_EQ(again.stats.hbm_hit_tokens, 1024u);
  EXPECT_TRUE(again.stats.swa_hit);
  ExpectIdentical(warm, again);
  EXPECT_EQ((*engine)->Counters().pool_pages_held, 0u);
  EXPECT_EQ(cache->Stats().read_leases, 0u);
}

TEST(HbmTierTest, WithoutAStoreTheHbmTierAloneServesTheNextTurn) {
  auto engine = Engine::Create(TinyModel(), WithHbm(nullptr));
  ASSERT_TRUE(engine.ok());
  const std::vector<uint32_t> turn1 = Tokens(600, 1);
  const std::vector<uint32_t> turn2 = Concat(turn1, Tokens(306, 2));
  (void)RunOn(**engine, 1, turn1);
  const RunResult warm = RunOn(**engine, 2, turn2);
  EXPECT_EQ(warm.stats.hbm_hit_tokens, 512u);
  EXPECT_TRUE(warm.stats.swa_hit);
  ExpectIdentical(RunOne(Options(nullptr), turn2), warm);
}

// A pool too small for everything: the HBM tier gives pages back as
// requests need them, every output stays exact, nothing leaks.
TEST(HbmTierTest, UnderPoolPressureTheTierShrinksAndOutputsStayExact) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  auto engine = Engine::Create(TinyModel(), WithHbm(store.get(), /*pool_pages=*/8));
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 4; ++i) prompts.push_back(Tokens(1100, 40 + i));
  uint64_t id = 1;
  for (int round = 0; round < 2; ++round) {
    for (const std::vector<uint32_t>& p : prompts) {
      const RunResult r = RunOn(**engine, id++, p, 3);
      ExpectIdentical(RunOne(Options(nullptr), p, 3), r);
      const EngineCounters c = (*engine)->Counters();
      EXPECT_EQ(c.pool_pages_held, 0u);
      EXPECT_LE(c.hbm_cached_pages, 8u);
    }
  }
  // Several requests at once, each needing pages while the tier is full.
  for (const std::vector<uint32_t>& p : prompts) {
    Request r;
    r.id = id++;
    r.prompt = Concat(p, Tokens(50, 7));
    r.max_new_tokens = 3;
    ASSERT_TRUE((*engine)->AddRequest(r).ok());
  }
  for (const StepOutput& out : (*engine)->Drain()) EXPECT_FALSE(out.aborted);
  EXPECT_EQ((*engine)->Counters().pool_pages_held, 0u);
  EXPECT_GT((*engine)->Counters().hbm_evictions, 8u);
  EXPECT_EQ(cache->Stats().read_leases, 0u);
}

TEST(HbmTierTest, AnAbortedRequestLeavesTheTierConsistent) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  auto engine = Engine::Create(TinyModel(), WithHbm(store.get()));
  ASSERT_TRUE(engine.ok());
  const std::vector<uint32_t> turn1 = Tokens(600, 1);
  const std::vector<uint32_t> turn2 = Concat(turn1, Tokens(306, 2));
  (void)RunOn(**engine, 1, turn1);
  Request r;
  r.id = 2;
  r.prompt = turn2;
  r.max_new_tokens = 50;
  ASSERT_TRUE((*engine)->AddRequest(r).ok());
  (void)(*engine)->Step();  // admitted: its prefix loaded from the tier
  ASSERT_TRUE((*engine)->AbortRequest(2).ok());
  EXPECT_EQ((*engine)->Counters().pool_pages_held, 0u);
  const RunResult after = RunOn(**engine, 3, turn2);
  EXPECT_EQ(after.stats.hbm_hit_tokens, 512u);
  ExpectIdentical(RunOne(Options(nullptr), turn2), after);
}

// A store reopened over its SSD tier holds the blocks on SSD only: a warm
// run's hits count as the SSD tier's, in its stats and the metrics.
TEST(HbmTierTest, HitsAreCountedByTheTierTheyCameFrom) {
  strata::testing::ScopedTempDir dir("strata-hbm-ssd");
  CacheStoreOptions o;
  o.dram.capacity_bytes = 64ull << 20;
  o.dram.granule_bytes = 4096;  // O_DIRECT straight into the arena
  o.maintenance_interval = 0;
  SsdTierOptions ssd;
  ssd.dir = dir.path() + "/ssd";
  ssd.capacity_bytes = 64ull << 20;
  o.ssd = ssd;
  o.ssd_swa_state = true;  // the SWA state too: the warm run is exact
  const std::vector<uint32_t> turn1 = Tokens(600, 1);
  const std::vector<uint32_t> turn2 = Concat(turn1, Tokens(306, 2));
  {
    auto cache = std::shared_ptr<CacheStore>(CacheStore::Open(o).value());
    auto store = Attach(cache);
    (void)RunOne(Options(store.get()), turn1);
    cache->FlushWriteBack();
  }
  auto cache = std::shared_ptr<CacheStore>(CacheStore::Open(o).value());  // DRAM starts empty
  auto store = Attach(cache);
  MetricsRegistry metrics;
  EngineOptions eo = Options(store.get());
  eo.metrics = &metrics;
  const RunResult warm = RunOne(eo, turn2);
  EXPECT_EQ(warm.stats.hit_tokens, 512u);
  EXPECT_EQ(warm.stats.ssd_hit_tokens, 512u);
  EXPECT_EQ(warm.stats.hbm_hit_tokens, 0u);
  EXPECT_TRUE(warm.stats.swa_hit);
  ExpectIdentical(RunOne(Options(nullptr), turn2), warm);
  const std::string text = metrics.RenderPrometheus();
  EXPECT_NE(text.find("strata_worker_tier_hit_tokens_total{tier=\"ssd\"} 512\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_worker_tier_hit_tokens_total{tier=\"dram\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace strata::worker

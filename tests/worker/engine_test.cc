// The engine with the store in the request path (DESIGN §9): cold vs warm
// bit-identity, encoder bounded replay against the masked reference, aborts
// at every stage, and batch invariance. Store faults: store_fault_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>

#include "engine_test_util.h"
#include "strata/client.h"
#include "strata/metrics.h"

namespace strata::worker {
namespace {

using testing::Attach;
using testing::ExpectIdentical;
using testing::ExpectStoreQuiet;
using testing::ForwardingStore;
using testing::kAdmin;
using testing::KeysFor;
using testing::NewCacheStore;
using testing::Options;
using testing::RunOn;
using testing::RunOne;
using testing::RunResult;
using testing::TinyModel;
using testing::Tokens;
using testing::Turn1;
using testing::Turn2;
using testing::Turn3;

// Turn 1 and turn 2 of a conversation: turn 2 extends turn 1's prompt.
TEST(EngineTest, ColdAndWarmRunsAreBitIdentical) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  const RunResult fill = RunOne(Options(store.get()), Turn1());
  EXPECT_EQ(fill.stats.hit_tokens, 0u);
  EXPECT_EQ(fill.stats.committed_blocks, 2u);
  EXPECT_GE(fill.stats.committed_swa, 2u);  // decoder start (256) and last boundary (512)

  const RunResult warm = RunOne(Options(store.get()), Turn2());
  EXPECT_EQ(warm.stats.hit_tokens, 512u);
  EXPECT_TRUE(warm.stats.swa_hit);
  EXPECT_EQ(warm.stats.replayed_tokens, 0u);
  EXPECT_EQ(warm.stats.computed_tokens, 906u - 512u);
  const RunResult cold = RunOne(Options(nullptr), Turn2());
  EXPECT_EQ(cold.stats.computed_tokens, 906u);
  ExpectIdentical(cold, warm);

  // Turn 3 resumes from the state the warm turn 2 committed at 768, over
  // two fetched blocks and one it computed.
  const std::vector<uint32_t> turn3 = Turn3();
  const RunResult warm3 = RunOne(Options(store.get()), turn3);
  EXPECT_EQ(warm3.stats.hit_tokens, 768u);
  EXPECT_TRUE(warm3.stats.swa_hit);
  EXPECT_FALSE(warm3.stats.swa_rejected);
  ExpectIdentical(RunOne(Options(nullptr), turn3), warm3);

  // Rerunning turn 1 resumes exactly at its decoder start (SWA at 256).
  const RunResult rerun = RunOne(Options(store.get()), Turn1());
  EXPECT_EQ(rerun.stats.hit_tokens, 256u);
  EXPECT_TRUE(rerun.stats.swa_hit);
  ExpectIdentical(fill, rerun);
  ExpectStoreQuiet(cache);
}

// A request's SWA states are committed even while another request's fetch
// holds every pool page: they are sealed in the engine's own buffer, as
// its global KV blocks are, not dropped.
TEST(EngineTest, CommitsWhileAFetchHoldsEveryPage) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  (void)RunOne(Options(store.get()), Turn1());
  const std::vector<uint32_t> cold = Tokens(600, 50);
  const RunResult alone = RunOne(Options(nullptr), cold);
  EngineOptions o = Options(store.get());
  o.pool_pages = 2;  // turn 2's fetch takes both; none kept for staging
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;
  Request warm;
  warm.id = 1;
  warm.prompt = Turn2();
  warm.max_new_tokens = 4;
  Request fresh;
  fresh.id = 2;
  fresh.prompt = cold;
  fresh.max_new_tokens = 4;
  // The fresh request computes its first block; then turn 2 is admitted,
  // its fetch taking both pages for a step while the fresh request
  // computes its second block, up to its last prompt boundary.
  ASSERT_TRUE(engine.AddRequest(fresh).ok());
  std::map<uint64_t, RequestStats> stats;
  for (StepOutput& out : engine.Step()) {
    if (out.finished) stats[out.id] = out.stats;
  }
  ASSERT_TRUE(engine.AddRequest(warm).ok());
  for (StepOutput& out : engine.Drain()) {
    if (out.finished) stats[out.id] = out.stats;
  }
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[1].hit_tokens, 512u);
  EXPECT_EQ(stats[2].committed_blocks, 2u);
  EXPECT_GE(stats[2].committed_swa, 2u);  // decoder start (256) and last boundary (512)
  EXPECT_EQ(stats[2].store_errors, 0u);
  EXPECT_EQ(engine.Counters().pool_pages_held, 0u);
  ExpectStoreQuiet(cache);
  // The states it committed resume it exactly.
  const RunResult rerun = RunOne(Options(store.get()), cold);
  EXPECT_TRUE(rerun.stats.swa_hit);
  ExpectIdentical(alone, rerun);
}

// Three requests that each find turn 1's two blocks, on a pool that holds
// one request's fetch at a time (plus commit staging): they are admitted
// one after another as pages free up, each fetching its whole prefix,
// rather than all at once with the later ones left to recompute.
// Three requests that continue turn 1 (its 512 tokens, then their own),
// on an engine whose pool has room for one 2-block fetch at a time; each
// one's stats. `engine`, if given, receives the engine (for its counters).
std::map<uint64_t, RequestStats> RunThreeOnFourPages(Store* store,
                                                     std::unique_ptr<Engine>* engine = nullptr) {
  EngineOptions o = Options(store);
  o.pool_pages = 4;  // one page kept for staging
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return {};
  for (uint64_t id = 1; id <= 3; ++id) {
    Request r;
    r.id = id;
    r.prompt = Turn1();
    const std::vector<uint32_t> more = Tokens(306, 20 + static_cast<uint32_t>(id));
    r.prompt.insert(r.prompt.end(), more.begin(), more.end());
    r.max_new_tokens = 4;
    EXPECT_TRUE((*e)->AddRequest(r).ok());
  }
  std::map<uint64_t, RequestStats> stats;
  for (StepOutput& out : (*e)->Drain()) {
    if (out.finished) stats[out.id] = out.stats;
  }
  if (engine != nullptr) *engine = std::move(e).value();
  return stats;
}

TEST(EngineTest, FetchesWaitForPoolPagesInsteadOfShrinking) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  (void)RunOne(Options(store.get()), Turn1());
  std::unique_ptr<Engine> engine;
  const std::map<uint64_t, RequestStats> stats = RunThreeOnFourPages(store.get(), &engine);
  ASSERT_EQ(stats.size(), 3u);
  for (const auto& [id, st] : stats) {
    EXPECT_EQ(st.hit_tokens, 512u) << "request " << id;
    EXPECT_GE(st.committed_blocks, 1u) << "request " << id;  // its own third block
    EXPECT_EQ(st.store_errors, 0u) << "request " << id;
  }
  const EngineCounters c = engine->Counters();
  EXPECT_EQ(c.pool_pages_held, 0u);
  EXPECT_EQ(c.held_leases, 0u);
  ExpectStoreQuiet(cache);
}

// Fills a fresh store with turn 1 and removes every SWA state, so turn 2
// finds its global KV but must rebuild the rings by encoder bounded replay.
std::shared_ptr<CacheStore> StoreWithoutSwa() {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  (void)RunOne(Options(store.get()), Turn1());
  const std::vector<ChainKey> keys = KeysFor(Turn1());
  for (const ChainKey& k : keys) (void)cache->Delete(kAdmin, k, StateKind::kSwaState);
  EXPECT_EQ(cache->Stats().swa_entries, 0u);
  return cache;
}

TEST(EngineTest, SwaMissReplaysTheEncoderAndMatchesTheMaskedReference) {
  auto cache_a = StoreWithoutSwa();
  auto store_a = Attach(cache_a);
  const RunResult replay = RunOne(Options(store_a.get()), Turn2());
  EXPECT_EQ(replay.stats.hit_tokens, 512u);
  EXPECT_FALSE(replay.stats.swa_hit);
  EXPECT_EQ(replay.stats.replayed_tokens, 128u);

  auto cache_b = StoreWithoutSwa();
  auto store_b = Attach(cache_b);
  EngineOptions masked = Options(store_b.get());
  masked.masked_attention = true;
  const RunResult reference = RunOne(masked, Turn2());
  EXPECT_EQ(reference.stats.replayed_tokens, 128u);
  ExpectIdentical(reference, replay);

  // Bounded replay is an approximation of the exact path: report how far.
  const RunResult exact = RunOne(Options(nullptr), Turn2());
  double max_dev = 0;
  for (size_t i = 0; i < exact.logits.size(); ++i) {
    for (size_t v = 0; v < exact.logits[i].size(); ++v) {
      const double d = std::fabs(double(exact.logits[i][v]) - replay.logits[i][v]);
      ASSERT_TRUE(std::isfinite(d));
      max_dev = std::max(max_dev, d);
    }
  }
  size_t same = 0;
  for (size_t i = 0; i < exact.tokens.size(); ++i) same += exact.tokens[i] == replay.tokens[i];
  std::printf("bounded replay vs exact path: max |logit diff| %.6f, %zu/%zu tokens equal\n",
              max_dev, same, exact.tokens.size());
  ::testing::Test::RecordProperty("replay_max_logit_deviation", std::to_string(max_dev));
  ExpectStoreQuiet(cache_a);
  ExpectStoreQuiet(cache_b);
}

// max_batch_tokens bounds the replay as it bounds any prefill: a budget
// below the window replays in chunks, to the same bits.
// Issue #39: replays commit no SWA state, so a prefix that fell to bounded
// replay (a fault, an eviction) stayed there for as long as its global KV
// lived. After exact_after_replays replays, one request computes it from
// token 0 and commits its SWA state, and the next is on the exact path
// again, bit-identical to a cold run.
TEST(EngineTest, APrefixReplayedTooOftenIsComputedExactlyOnceAndThenHitsAgain) {
  for (const uint32_t after : {0u, 2u}) {
    SCOPED_TRACE(after);
    auto cache = StoreWithoutSwa();
    auto store = Attach(cache);
    MetricsRegistry metrics;
    EngineOptions o = Options(store.get());
    o.exact_after_replays = after;
    o.metrics = &metrics;
    auto engine = Engine::Create(TinyModel(), o).value();
    for (uint64_t id = 1; id <= 2; ++id) {
      const RunResult r = RunOn(*engine, id, Turn2());
      EXPECT_EQ(r.stats.replayed_tokens, 128u);
      EXPECT_FALSE(r.stats.exact_recompute);
    }
    const RunResult third = RunOn(*engine, 3, Turn2());
    const RunResult fourth = RunOn(*engine, 4, Turn2());
    if (after == 0) {  // never: the prefix stays on the approximate path
      EXPECT_EQ(third.stats.replayed_tokens, 128u);
      EXPECT_EQ(fourth.stats.replayed_tokens, 128u);
      EXPECT_EQ(cache->Stats().swa_entries, 0u);
      continue;
    }
    EXPECT_TRUE(third.stats.exact_recompute);
    EXPECT_EQ(third.stats.replayed_tokens, 0u);
    EXPECT_EQ(third.stats.hit_tokens, 0u);
    EXPECT_GE(third.stats.committed_swa, 1u);
    EXPECT_EQ(third.stats.store_errors, 0u);
    ExpectIdentical(third, RunOne(Options(nullptr), Turn2()));
    EXPECT_TRUE(fourth.stats.swa_hit);
    EXPECT_EQ(fourth.stats.replayed_tokens, 0u);
    EXPECT_EQ(fourth.stats.hit_tokens, 512u);
    ExpectIdentical(fourth, third);
    EXPECT_NE(metrics.RenderPrometheus().find("strata_worker_exact_recomputes_total 1\n"),
              std::string::npos);
    const EngineCounters c = engine->Counters();
    EXPECT_EQ(c.pool_pages_held, 0u);
    EXPECT_EQ(c.held_leases, 0u);
  }
}

TEST(EngineTest, ReplayRunsInChunksWithinTheBatchBudget) {
  auto whole_cache = StoreWithoutSwa();
  auto whole_store = Attach(whole_cache);
  const RunResult whole = RunOne(Options(whole_store.get()), Turn2());
  ASSERT_EQ(whole.stats.replayed_tokens, 128u);

  auto cache = StoreWithoutSwa();
  auto store = Attach(cache);
  EngineOptions o = Options(store.get());
  o.max_batch_tokens = 48;  // under the 128-token window
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;
  Request r;
  r.id = 1;
  r.prompt = Turn2();
  r.max_new_tokens = 6;
  ASSERT_TRUE(engine.AddRequest(r).ok());
  RunResult chunked;
  uint64_t prefilled = 0;
  for (int step = 0; step < 1000 && engine.Counters().running + engine.Counters().queued > 0;
       ++step) {
    for (StepOutput& out : engine.Step()) {
      chunked.tokens.insert(chunked.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      for (auto& l : out.logits) chunked.logits.push_back(std::move(l));
      if (out.finished) chunked.stats = out.stats;
    }
    const uint32_t ran = engine.Counters().last_step_prefill_tokens;
    EXPECT_LE(ran, o.max_batch_tokens) << "step " << step;
    prefilled += ran;
  }
  EXPECT_EQ(chunked.stats.replayed_tokens, 128u);
  EXPECT_FALSE(chunked.stats.swa_hit);
  // The replayed window and the uncached suffix, each token once.
  EXPECT_EQ(prefilled, 128u + Turn2().size() - 512u);
  ExpectIdentical(whole, chunked);
}

// Answers the first `matches` matches, then refuses every one.
class MatchesThenRefusesStore final : public ForwardingStore {
 public:
  MatchesThenRefusesStore(Store& inner, int matches) : ForwardingStore(inner), left_(matches) {}
  Result<MatchResult> MatchKeys(const MatchKeysRequest& r) override {
    if (left_-- > 0) return inner_.MatchKeys(r);
    return Internal("injected: match refused");
  }

 private:
  int left_;
};

// A request whose match was let go while it waited for pool pages counts
// only what its next admission matched: nothing, when that match failed.
TEST(EngineTest, AMatchLetGoWhileWaitingForPagesIsNotCounted) {
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  (void)RunOne(Options(store.get()), Turn1());
  MatchesThenRefusesStore refusing(*store, 2);  // request 1, and request 2 before it waits
  std::map<uint64_t, RequestStats> stats = RunThreeOnFourPages(&refusing);  // 2 and 3 wait
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[1].hit_tokens, 512u);  // the one fetch that had room
  size_t refused = 0;
  for (const auto& [id, st] : stats) {
    if (st.hit_tokens > 0) continue;
    ++refused;  // matched, let go, then refused at its next admission
    EXPECT_EQ(st.matched_tokens, 0u) << "request " << id;
    EXPECT_GE(st.store_errors, 1u) << "request " << id;
  }
  EXPECT_GE(refused, 1u);
  ExpectStoreQuiet(cache);
}

// Counts the fetches that ask for an SWA state.
class SwaFetchCountingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  FetchFuture Fetch(const FetchRequest& r) override {
    if (!r.swa_buffer.empty()) ++swa_fetches;
    return inner_.Fetch(r);
  }
  int swa_fetches = 0;
};

// Global KV computed after an encoder bounded replay is approximate, yet
// published under the same chain keys as exact global KV. A store can then
// hold one run's blocks and another run's SWA state for them; the request
// must not pair them, but replay as if the state were missing.
TEST(EngineTest, SwaStateOverOtherGlobalKvIsRejectedAndReplayed) {
  // Exact: a cold turn 2 commits blocks 0..2 and the SWA state at 768.
  auto exact = NewCacheStore();
  auto exact_store = Attach(exact);
  (void)RunOne(Options(exact_store.get()), Turn2());
  // Mixed, and a twin of it: turn 2 on turn 1's blocks without SWA state
  // replays, then commits block 2 as computed after the replay (no SWA).
  auto mixed = StoreWithoutSwa();
  auto mixed_store = Attach(mixed);
  ASSERT_EQ(RunOne(Options(mixed_store.get()), Turn2()).stats.replayed_tokens, 128u);
  auto twin = StoreWithoutSwa();
  auto twin_store = Attach(twin);
  (void)RunOne(Options(twin_store.get()), Turn2());

  const std::vector<ChainKey> keys = KeysFor(Turn2());  // keys[b]: block b
  ASSERT_EQ(keys.size(), 3u);
  std::span<std::byte> exact_block =
      exact->MutablePayloadForTesting(kAdmin, keys[2], StateKind::kGlobalKv);
  std::span<std::byte> mixed_block =
      mixed->MutablePayloadForTesting(kAdmin, keys[2], StateKind::kGlobalKv);
  ASSERT_EQ(exact_block.size(), mixed_block.size());
  ASSERT_NE(0, std::memcmp(exact_block.data(), mixed_block.data(), exact_block.size()))
      << "block 2 computed after the replay should differ from the exact one";
  // Copy the exact run's SWA state at 768 (after block 2) into `mixed`.
  std::span<std::byte> swa = exact->MutablePayloadForTesting(kAdmin, keys[2], StateKind::kSwaState);
  ASSERT_FALSE(swa.empty());
  std::vector<std::byte> bytes(swa.begin(), swa.end());
  CommitPayload cp;
  cp.block = {keys[2], StateKind::kSwaState, kV41SwaLayoutId, bytes.size(), std::nullopt};
  cp.bytes = bytes;
  cp.checksum = Checksum64(std::span(bytes).first(MakeSwaLayout(kV41SwaLayoutId).HeaderBytes()));
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), Options(nullptr));
  ASSERT_TRUE(engine.ok());
  Result<PublishResult> pub = mixed->Commit(kAdmin, (*engine)->model_id(), std::span(&cp, 1));
  ASSERT_TRUE(pub.ok() && pub->blocks[0].ok());

  // Turn 3 finds blocks 0..2 and that SWA state, rejects the state and
  // replays: the same output as on the twin, where the state is missing.
  const std::vector<uint32_t> turn3 = Turn3();
  SwaFetchCountingStore counting(*mixed_store);
  Result<std::unique_ptr<Engine>> on_mixed = Engine::Create(TinyModel(), Options(&counting));
  ASSERT_TRUE(on_mixed.ok());
  const RunResult rejected = RunOn(**on_mixed, 1, turn3);
  EXPECT_EQ(rejected.stats.hit_tokens, 768u);
  EXPECT_FALSE(rejected.stats.swa_hit);
  EXPECT_TRUE(rejected.stats.swa_rejected);
  EXPECT_EQ(rejected.stats.replayed_tokens, 128u);
  EXPECT_EQ(rejected.stats.recomputed_tokens, 0u);
  EXPECT_EQ(counting.swa_fetches, 1);
  const RunResult missing = RunOne(Options(twin_store.get()), turn3);
  EXPECT_FALSE(missing.stats.swa_hit);
  EXPECT_FALSE(missing.stats.swa_rejected);
  EXPECT_EQ(missing.stats.replayed_tokens, 128u);
  ExpectIdentical(missing, rejected);

  // Another prompt over the same three blocks meets the same pair: the
  // engine replays without fetching the state again.
  std::vector<uint32_t> turn2b = Turn2();
  const std::vector<uint32_t> other = Tokens(100, 4);
  turn2b.insert(turn2b.end(), other.begin(), other.end());  // decodes from 768
  const RunResult again = RunOn(**on_mixed, 2, turn2b);
  EXPECT_EQ(again.stats.hit_tokens, 768u);
  EXPECT_TRUE(again.stats.swa_rejected);
  EXPECT_EQ(again.stats.replayed_tokens, 128u);
  EXPECT_EQ(counting.swa_fetches, 1);
  ExpectIdentical(RunOne(Options(twin_store.get()), turn2b), again);

  // On the store whose blocks it was computed over, the state is used, and
  // the output is the cold run's.
  const RunResult warm = RunOne(Options(exact_store.get()), turn3);
  EXPECT_TRUE(warm.stats.swa_hit);
  EXPECT_FALSE(warm.stats.swa_rejected);
  ExpectIdentical(RunOne(Options(nullptr), turn3), warm);
  ExpectStoreQuiet(mixed);
  ExpectStoreQuiet(exact);
}

// strata_worker_* metrics add up what each request got from the store.
TEST(EngineMetricsTest, CountWhatEachRequestGotFromTheStore) {
  MetricsRegistry registry;
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  EngineOptions o = Options(store.get());
  o.metrics = &registry;
  (void)RunOne(o, Turn1());                   // nothing to hit
  const RunResult warm = RunOne(o, Turn2());  // 512 tokens and the SWA state
  ASSERT_TRUE(warm.stats.swa_hit);
  auto cache_b = StoreWithoutSwa();
  auto store_b = Attach(cache_b);
  EngineOptions ob = Options(store_b.get());
  ob.metrics = &registry;
  const RunResult replay = RunOne(ob, Turn2());  // 512 tokens, no SWA state: replay
  ASSERT_EQ(replay.stats.replayed_tokens, 128u);

  auto counter = [&](const std::string& name, const MetricLabels& labels = {}) {
    return registry.GetCounter(name, "", labels)->Value();
  };
  EXPECT_EQ(counter("strata_worker_requests_total", {{"outcome", "finished"}}), 3u);
  EXPECT_EQ(counter("strata_worker_requests_total", {{"outcome", "aborted"}}), 0u);
  EXPECT_EQ(counter("strata_worker_prompt_tokens_total"), 600u + 906 + 906);
  EXPECT_EQ(counter("strata_worker_hit_tokens_total"), 512u + 512);
  EXPECT_EQ(counter("strata_worker_computed_tokens_total"), 600u + 394 + 394);
  EXPECT_EQ(counter("strata_worker_replayed_tokens_total"), 128u);
  EXPECT_EQ(counter("strata_worker_recomputed_tokens_total"), 0u);
  EXPECT_EQ(counter("strata_worker_swa_states_total", {{"result", "hit"}}), 1u);
  EXPECT_EQ(counter("strata_worker_swa_states_total", {{"result", "missing"}}), 1u);
  EXPECT_EQ(counter("strata_worker_swa_states_total", {{"result", "rejected"}}), 0u);
  EXPECT_EQ(counter("strata_worker_committed_blocks_total"),
            warm.stats.committed_blocks + replay.stats.committed_blocks + 2);
  const std::string text = registry.RenderPrometheus();
  EXPECT_NE(text.find("strata_worker_fetch_seconds_count 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_worker_fetch_first_layer_ready_seconds_count 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("strata_worker_match_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(text.find("strata_worker_ttft_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(text.find("strata_worker_running_requests 0\n"), std::string::npos);
  EXPECT_NE(text.find("strata_worker_pool_pages_held 0\n"), std::string::npos);
}

// Holds every fetch until let go (or for 120 s, so that an engine that
// waits for one cannot hang the test).
class StallingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  FetchFuture Fetch(const FetchRequest& r) override {
    {
      std::unique_lock lock(mu_);
      ++stalled_;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(120), [&] { return let_go_; });
    }
    return inner_.Fetch(r);
  }
  bool WaitStalled() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return stalled_ > 0; });
  }
  void LetGo() {
    std::lock_guard lock(mu_);
    let_go_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t stalled_ = 0;
  bool let_go_ = false;
};

class AbortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = NewCacheStore();
    store_ = Attach(cache_);
    (void)RunOne(Options(store_.get()), Turn1());
    EngineOptions o = Options(store_.get());
    o.metrics = &metrics_;
    Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
    ASSERT_TRUE(e.ok());
    engine_ = std::move(e).value();
  }
  void Add(uint64_t id, std::vector<uint32_t> prompt, uint32_t max_new = 4) {
    Request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new;
    ASSERT_TRUE(engine_->AddRequest(std::move(r)).ok());
  }
  void ExpectEverythingReturned() {
    engine_->WaitForAbandonedFetches();
    const EngineCounters c = engine_->Counters();
    EXPECT_EQ(c.pool_pages_held, 0u);
    EXPECT_EQ(c.pool_refs, 0u);
    EXPECT_EQ(c.live_fetches, 0u);
    EXPECT_EQ(c.held_leases, 0u);
    EXPECT_EQ(c.running + c.queued, 0u);
    EXPECT_TRUE(engine_->Idle());
    ExpectStoreQuiet(cache_);
    // The load gauges follow aborts without another step.
    const std::string text = metrics_.RenderPrometheus();
    for (const char* idle :
         {"strata_worker_running_requests 0\n", "strata_worker_queued_requests 0\n",
          "strata_worker_pool_pages_held 0\n"}) {
      EXPECT_NE(text.find(idle), std::string::npos) << idle;
    }
  }
  uint64_t Counted(const std::string& name, const MetricLabels& labels = {}) {
    return metrics_.GetCounter(name, "", labels)->Value();
  }
  MetricsRegistry metrics_;
  std::shared_ptr<CacheStore> cache_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StallingStore> stalling_;  // for the engine, if a test makes one on it
  std::unique_ptr<Engine> engine_;
};

TEST_F(AbortTest, WhileQueued) {
  Add(1, Turn2());
  EXPECT_EQ(engine_->Counters().queued, 1u);
  ASSERT_TRUE(engine_->AbortRequest(1).ok());
  EXPECT_EQ(engine_->AbortRequest(1).code(), StatusCode::kNotFound);
  ExpectEverythingReturned();
}

TEST_F(AbortTest, WhileFetching) {
  Add(1, Tokens(700, 9));
  (void)engine_->Step();  // request 1 is prefilling: other work for the next step
  Add(2, Turn2());
  (void)engine_->Step();  // request 2 admitted: match leased, fetch started, not yet computed
  EngineCounters c = engine_->Counters();
  EXPECT_EQ(c.live_fetches, 1u);
  EXPECT_EQ(c.held_leases, 1u);
  EXPECT_GT(c.pool_pages_held, 0u);
  ASSERT_TRUE(engine_->AbortRequest(2).ok());
  ASSERT_TRUE(engine_->AbortRequest(1).ok());
  ExpectEverythingReturned();
  // Aborted mid-fetch: counted as aborted, not as hits it never used.
  EXPECT_EQ(Counted("strata_worker_requests_total", {{"outcome", "aborted"}}), 2u);
  EXPECT_EQ(Counted("strata_worker_hit_tokens_total"), 0u);
  EXPECT_EQ(Counted("strata_worker_swa_states_total", {{"result", "missing"}}), 0u);
}

// Aborting a request whose fetch stalls returns at once and the others run
// on; the transfer keeps its pages and lease until it ends.
TEST_F(AbortTest, AStalledFetchHoldsUpNeitherItsAbortNorOtherRequests) {
  stalling_ = std::make_unique<StallingStore>(*store_);
  EngineOptions o = Options(stalling_.get());
  o.metrics = &metrics_;
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  engine_ = std::move(e).value();
  Add(1, Tokens(700, 17));  // a cold prompt: nothing to fetch
  (void)engine_->Step();    // request 1 is prefilling: other work for the next step
  Add(2, Turn2());
  (void)engine_->Step();  // request 2 admitted: match leased, fetch started
  ASSERT_TRUE(stalling_->WaitStalled());
  ASSERT_TRUE(engine_->AbortRequest(2).ok());
  EngineCounters c = engine_->Counters();
  EXPECT_EQ(c.running + c.queued, 1u);
  EXPECT_EQ(c.live_fetches, 1u);  // still running...
  EXPECT_EQ(c.held_leases, 1u);   // ...under its lease, into its pages
  const std::vector<StepOutput> out = engine_->Drain();
  ASSERT_FALSE(out.empty());
  EXPECT_TRUE(out.back().finished);
  EXPECT_EQ(out.back().id, 1u);
  EXPECT_EQ(engine_->Counters().live_fetches, 1u);
  stalling_->LetGo();
  ExpectEverythingReturned();
}

TEST_F(AbortTest, WhilePrefilling) {
  Add(1, Tokens(900, 5));
  (void)engine_->Step();
  EXPECT_EQ(engine_->Counters().running, 1u);
  ASSERT_TRUE(engine_->AbortRequest(1).ok());
  ExpectEverythingReturned();
}

TEST_F(AbortTest, WhileDecoding) {
  Add(1, Turn2(), 50);
  bool decoding = false;
  while (!decoding) {
    for (const StepOutput& o : engine_->Step()) decoding |= !o.new_tokens.empty();
  }
  (void)engine_->Step();
  ASSERT_TRUE(engine_->AbortRequest(1).ok());
  ExpectEverythingReturned();
}

TEST(EngineBatchTest, RequestInAMixedBatchEqualsItAlone) {
  EngineOptions o = Options(nullptr);
  o.max_batch_tokens = 300;  // other requests change where this one's chunks fall
  const RunResult alone = RunOne(o, Turn2(), 8);

  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;
  const std::vector<std::pair<uint64_t, std::vector<uint32_t>>> reqs = {
      {7, Tokens(60, 3)}, {1, Turn2()}, {8, Tokens(700, 4)}};
  for (const auto& [id, prompt] : reqs) {
    Request r;
    r.id = id;
    r.prompt = prompt;
    r.max_new_tokens = id == 7 ? 40 : 8;  // 7 keeps decoding while 1 prefills
    ASSERT_TRUE(engine.AddRequest(r).ok());
  }
  RunResult mixed;
  for (StepOutput& out : engine.Drain()) {
    if (out.id != 1) continue;
    mixed.tokens.insert(mixed.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    for (auto& l : out.logits) mixed.logits.push_back(std::move(l));
  }
  ExpectIdentical(alone, mixed);
}

// The indexer's full scans split their rows across kernel threads: any
// thread count gives the same bits as one thread.
TEST(EngineBatchTest, KernelThreadsChangeNoBit) {
  EngineOptions one = Options(nullptr);
  one.kernel_threads = 1;
  const RunResult alone = RunOne(one, Turn2(), 8);
  for (uint32_t threads : {2u, 3u, 5u}) {
    EngineOptions many = Options(nullptr);
    many.kernel_threads = threads;
    ExpectIdentical(alone, RunOne(many, Turn2(), 8));
  }
}

TEST(EngineBatchTest, SeededSamplingIsReproducible) {
  EngineOptions o = Options(nullptr);
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  std::vector<std::vector<uint32_t>> outs;
  for (uint64_t id : {1, 2, 3}) {
    Request r;
    r.id = id;
    r.prompt = Tokens(100, 1);
    r.max_new_tokens = 12;
    r.sampling = {1.0f, id == 3 ? 99u : 42u};
    ASSERT_TRUE((*e)->AddRequest(r).ok());
  }
  std::map<uint64_t, std::vector<uint32_t>> got;
  for (StepOutput& out : (*e)->Drain()) {
    if (out.finished) got[out.id] = out.output_tokens;
  }
  EXPECT_EQ(got[1], got[2]);  // same seed, same tokens, batched together
  EXPECT_NE(got[1], got[3]);
}

// Past max_running, requests wait in the queue, and are admitted in order
// as running ones finish.
TEST(EngineBatchTest, AtMostMaxRunningRequestsRunAtOnce) {
  EngineOptions o = Options(nullptr);
  o.max_running = 2;
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e.ok());
  for (uint64_t id = 1; id <= 3; ++id) {
    Request r;
    r.id = id;
    r.prompt = Tokens(40, 70 + static_cast<uint32_t>(id));
    r.max_new_tokens = 2;
    ASSERT_TRUE((*e)->AddRequest(r).ok());
  }
  std::vector<uint64_t> finished;
  uint32_t most_running = 0;
  for (int step = 0; step < 1000 && finished.size() < 3; ++step) {
    for (const StepOutput& out : (*e)->Step()) {
      if (out.finished) finished.push_back(out.id);
    }
    const EngineCounters c = (*e)->Counters();
    most_running = std::max(most_running, c.running);
    EXPECT_EQ(c.running + c.queued + finished.size(), 3u);
  }
  EXPECT_EQ(most_running, 2u);
  EXPECT_EQ(finished, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(EngineBatchTest, BadRequestsAreRejected) {
  Result<std::unique_ptr<Engine>> e = Engine::Create(TinyModel(), Options(nullptr));
  ASSERT_TRUE(e.ok());
  Request r;
  r.id = 1;
  EXPECT_EQ((*e)->AddRequest(r).code(), StatusCode::kInvalidArgument);  // empty prompt
  r.prompt = {1, 2, 300};
  EXPECT_EQ((*e)->AddRequest(r).code(), StatusCode::kInvalidArgument);  // outside the vocab
  r.prompt = {1, 2, 3};
  ASSERT_TRUE((*e)->AddRequest(r).ok());
  EXPECT_EQ((*e)->AddRequest(r).code(), StatusCode::kAlreadyExists);
  // With a store, the weights must be named: the name keeps models apart.
  auto cache = NewCacheStore();
  auto store = Attach(cache);
  EngineOptions unnamed = Options(store.get());
  unnamed.weights_revision.clear();
  EXPECT_EQ(Engine::Create(TinyModel(), unnamed).status().code(), StatusCode::kInvalidArgument);
  unnamed.store = nullptr;
  EXPECT_TRUE(Engine::Create(TinyModel(), unnamed).ok());
  EngineOptions bad = Options(nullptr);
  bad.keep_tokens = 0;
  EXPECT_FALSE(Engine::Create(TinyModel(), bad).ok());
  bad = Options(nullptr);
  bad.max_running = 0;
  EXPECT_EQ(Engine::Create(TinyModel(), bad).status().code(), StatusCode::kInvalidArgument);
  // A lease ttl every match would be refused for.
  bad = Options(nullptr);
  bad.lease_ttl = kMaxLeaseTtl + 1;
  EXPECT_EQ(Engine::Create(TinyModel(), bad).status().code(), StatusCode::kInvalidArgument);
  bad.lease_ttl = -1;
  EXPECT_EQ(Engine::Create(TinyModel(), bad).status().code(), StatusCode::kInvalidArgument);
  bad = Options(nullptr);
  bad.chain_extra.assign(kMaxExtraBytes + 1, 'x');
  EXPECT_EQ(Engine::Create(TinyModel(), bad).status().code(), StatusCode::kInvalidArgument);
  // Back-offs that would overflow the clock, or not back off at all.
  for (const auto& [first, most] :
       std::vector<std::pair<Nanos, Nanos>>{{0, Seconds(30)},
                                            {-1, Seconds(30)},
                                            {Seconds(60), Seconds(30)},
                                            {Seconds(1), std::numeric_limits<Nanos>::max()}}) {
    bad = Options(nullptr);
    bad.store_backoff = first;
    bad.store_max_backoff = most;
    EXPECT_EQ(Engine::Create(TinyModel(), bad).status().code(), StatusCode::kInvalidArgument)
        << first << " " << most;
  }
  EngineOptions fine = Options(nullptr);
  fine.chain_extra.assign(kMaxExtraBytes, 'x');
  fine.store_backoff = fine.store_max_backoff = kMaxStoreBackoff;
  EXPECT_TRUE(Engine::Create(TinyModel(), fine).ok());
}

}  // namespace
}  // namespace strata::worker

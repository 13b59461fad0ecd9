// Store faults degrade to recomputation (DESIGN §9): fetch errors and
// timeouts, flipped bits, a full store, an unreachable store backed off, a
// node killed mid-fetch; and the worker's keys live in its token's
// namespace.

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>

#include "engine_test_util.h"
#include "node_process.h"
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
// A Store that forwards to a real in-process store and injects faults.
class FaultyStore final : public ForwardingStore {
 public:
  enum class Fault {
    kNone,
    kFetchCutAfterBlock1,
    kFetchDeadline,
    kCommitExhausted,
    kGlobalKvCommitExhausted,  // SWA states would still be taken
  };
  FaultyStore(Store& inner, Fault fault) : ForwardingStore(inner), fault_(fault) {}

  FetchFuture Fetch(const FetchRequest& r) override {
    ++fetches;
    if (fault_ == Fault::kFetchDeadline) {
      FetchOutcome out;
      out.status = DeadlineExceeded("injected: fetch timed out");
      return FetchFuture::Ready(out);
    }
    if (fault_ == Fault::kFetchCutAfterBlock1 && r.block_buffers.size() > 1) {
      // The real transfer of block 0 only, then the node "goes away".
      FetchRequest first = r;
      first.block_buffers.resize(1);
      first.swa_buffer = {};
      FetchOutcome out = inner_.Fetch(first).Wait();
      out.swa_ready = false;
      out.status = Unavailable("injected: node gone after block 0");
      return FetchFuture::Ready(out);
    }
    return inner_.Fetch(r);
  }
  Result<Reservation> Reserve(const ModelId& m, std::span<const CommitBlock> b,
                              Nanos ttl) override {
    if (fault_ == Fault::kCommitExhausted) return ResourceExhausted("injected: store full");
    return inner_.Reserve(m, b, ttl);
  }
  Result<PublishResult> Commit(const ModelId& m, std::span<const CommitPayload> p) override {
    const bool global_kv = !p.empty() && p[0].block.kind == StateKind::kGlobalKv;
    if (fault_ == Fault::kCommitExhausted ||
        (fault_ == Fault::kGlobalKvCommitExhausted && global_kv)) {
      ++failed_commits;
      return ResourceExhausted("injected: store full");
    }
    return inner_.Commit(m, p);
  }

  std::atomic<int> fetches{0};
  std::atomic<int> failed_commits{0};

 private:
  Fault fault_;
};

class StoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = NewCacheStore();
    store_ = Attach(cache_);
    (void)RunOne(Options(store_.get()), Turn1());
    cold_ = RunOne(Options(nullptr), Turn2());
  }
  // `unreachable`: the fault looked like a lost node, so the engine backs
  // off (on a clock that stands still here) and commits nothing; otherwise
  // it commits the recomputation's state, which is exact.
  void ExpectRecomputed(const RunResult& r, bool unreachable) {
    ExpectIdentical(cold_, r);
    EXPECT_EQ(r.stats.hit_tokens, 0u);
    EXPECT_EQ(r.stats.recomputed_tokens, 512u);
    EXPECT_GE(r.stats.store_errors, 1u);
    if (unreachable) {
      EXPECT_GT(r.stats.store_skipped, 0u);
      EXPECT_EQ(r.stats.committed_blocks + r.stats.committed_swa, 0u);
    } else {
      EXPECT_GE(r.stats.committed_swa, 1u);
    }
    ExpectStoreQuiet(cache_);
  }
  EngineOptions StoppedClockOptions(Store* store) {
    EngineOptions o = Options(store);
    o.store_clock = &stopped_;
    return o;
  }
  ManualClock stopped_;
  std::shared_ptr<CacheStore> cache_;
  std::unique_ptr<Store> store_;
  RunResult cold_;
};

TEST_F(StoreFaultTest, FetchErrorMidPrefixRecomputesWithTheSameOutput) {
  FaultyStore faulty(*store_, FaultyStore::Fault::kFetchCutAfterBlock1);
  ExpectRecomputed(RunOne(StoppedClockOptions(&faulty), Turn2()), /*unreachable=*/true);
  EXPECT_EQ(faulty.fetches, 1);
}

TEST_F(StoreFaultTest, FetchTimeoutRecomputesWithTheSameOutput) {
  FaultyStore faulty(*store_, FaultyStore::Fault::kFetchDeadline);
  ExpectRecomputed(RunOne(StoppedClockOptions(&faulty), Turn2()), /*unreachable=*/true);
}

// A node that answers matches but whose transfers time out (a stalled data
// plane) costs one fetch timeout per back-off, and the back-off doubles
// although every probe's match succeeds.
TEST_F(StoreFaultTest, StalledFetchesBackOffAndTheBackOffDoubles) {
  FaultyStore faulty(*store_, FaultyStore::Fault::kFetchDeadline);
  ManualClock clock;
  EngineOptions o = Options(&faulty);
  o.store_clock = &clock;
  o.store_backoff = Seconds(1);
  o.store_max_backoff = Seconds(8);
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  uint64_t next_id = 1;
  auto run = [&] {
    RunResult r = RunOn(**engine, next_id++, Turn2());
    ExpectIdentical(cold_, r);
    return r;
  };
  RunResult r = run();  // the fetch times out: back off 1 s, commit nothing
  EXPECT_EQ(faulty.fetches, 1);
  EXPECT_EQ(r.stats.committed_blocks + r.stats.committed_swa, 0u);
  EXPECT_GT(r.stats.store_skipped, 0u);
  (void)run();  // backing off: no match, no fetch
  EXPECT_EQ(faulty.fetches, 1);
  clock.Advance(Seconds(1));
  (void)run();  // the probe matches, its fetch times out: back off 2 s
  EXPECT_EQ(faulty.fetches, 2);
  clock.Advance(Seconds(1));
  (void)run();
  EXPECT_EQ(faulty.fetches, 2);
  clock.Advance(Seconds(1));
  (void)run();
  EXPECT_EQ(faulty.fetches, 3);
  ExpectStoreQuiet(cache_);
}

TEST_F(StoreFaultTest, FlippedPayloadBitIsCaughtAndRecomputed) {
  const std::vector<ChainKey> keys = KeysFor(Turn2());
  std::span<std::byte> bytes =
      cache_->MutablePayloadForTesting(kAdmin, keys[1], StateKind::kGlobalKv);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= std::byte{0x10};  // inside a layer group of block 1
  ExpectRecomputed(RunOne(Options(store_.get()), Turn2()), /*unreachable=*/false);
}

// Records the fetch events a real store reports, in order.
class EventRecordingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  FetchFuture Fetch(const FetchRequest& r) override {
    FetchRequest tapped = r;
    tapped.on_event = [this, forward = r.on_event](const FetchEvent& e) {
      {
        std::lock_guard lock(mu);
        events.push_back(e.type);
      }
      if (forward) forward(e);
    };
    return inner_.Fetch(tapped);
  }
  std::mutex mu;
  std::vector<FetchEvent::Type> events;  // guarded by mu
};

// The SWA state comes ahead of the bodies, so the worker loads it at layer
// 0 and only then meets a layer group that fails (block 1's last): the
// request is recomputed, with the same output, from nothing it loaded.
TEST_F(StoreFaultTest, SwaLoadedBeforeALaterLayerGroupFailsIsRecomputed) {
  const std::vector<ChainKey> keys = KeysFor(Turn2());
  std::span<std::byte> bytes =
      cache_->MutablePayloadForTesting(kAdmin, keys[1], StateKind::kGlobalKv);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() - 1] ^= std::byte{0x10};  // the last layer group of block 1
  EventRecordingStore recording(*store_);
  const RunResult r = RunOne(Options(&recording), Turn2());
  {
    std::lock_guard lock(recording.mu);
    ASSERT_FALSE(recording.events.empty());
    EXPECT_EQ(recording.events.front(), FetchEvent::Type::kSwaReady)
        << "the SWA state did not come first: the test no longer covers state loaded and voided";
  }
  ExpectRecomputed(r, /*unreachable=*/false);
  EXPECT_FALSE(r.stats.swa_hit);
}

TEST_F(StoreFaultTest, CommitResourceExhaustedLosesNothing) {
  auto fresh = NewCacheStore();
  auto inner = Attach(fresh);
  FaultyStore faulty(*inner, FaultyStore::Fault::kCommitExhausted);
  const RunResult r = RunOne(Options(&faulty), Turn2());
  ExpectIdentical(cold_, r);
  EXPECT_GT(faulty.failed_commits, 0);
  EXPECT_EQ(r.stats.committed_blocks, 0u);
  EXPECT_EQ(fresh->Stats().global_kv_entries, 0u);
  ExpectStoreQuiet(fresh);
}

// SWA state is committed only over blocks the store holds: over a block it
// refused, no match could reach it, and it would only take room.
TEST_F(StoreFaultTest, NoSwaStateIsCommittedOverBlocksTheStoreRefused) {
  auto fresh = NewCacheStore();
  auto inner = Attach(fresh);
  FaultyStore faulty(*inner, FaultyStore::Fault::kGlobalKvCommitExhausted);
  const RunResult r = RunOne(Options(&faulty), Turn1());
  EXPECT_GT(faulty.failed_commits, 0);
  EXPECT_EQ(r.stats.committed_blocks, 0u);
  EXPECT_EQ(r.stats.committed_swa, 0u);
  EXPECT_EQ(fresh->Stats().swa_entries, 0u);
  ExpectStoreQuiet(fresh);
}

// A store that is out of reach (every call UNAVAILABLE) until told
// otherwise; then it forwards to a real one. Counts the calls it gets.
class ReachableWhenToldStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<MatchResult> Match(const MatchRequest& r) override {
    ++calls;
    if (!reachable) return Unavailable("injected: no route to the node");
    return inner_.Match(r);
  }
  Result<MatchResult> MatchKeys(const MatchKeysRequest& r) override {
    ++calls;
    if (!reachable) return Unavailable("injected: no route to the node");
    return inner_.MatchKeys(r);
  }
  Result<PublishResult> Commit(const ModelId& m, std::span<const CommitPayload> p) override {
    ++calls;
    if (!reachable) return DeadlineExceeded("injected: the node did not answer");
    return inner_.Commit(m, p);
  }

  bool reachable = false;
  int calls = 0;
};

// An unreachable store costs one call, not one per block: the engine backs
// off (doubling while the probes fail), computes everything meanwhile, and
// uses the store again once a probe gets an answer.
TEST(StoreHealthTest, UnreachableStoreIsLeftAloneForABackOffThatDoubles) {
  auto cache = NewCacheStore();
  auto inner = Attach(cache);
  ReachableWhenToldStore store(*inner);
  ManualClock clock;
  EngineOptions o = Options(&store);
  o.store_clock = &clock;
  o.store_backoff = Seconds(1);
  o.store_max_backoff = Seconds(8);
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const RunResult cold = RunOne(Options(nullptr), Turn2());
  uint64_t next_id = 1;
  auto run = [&] { return RunOn(**engine, next_id++, Turn2()); };
  RunResult r = run();  // the match fails: back off 1 s, no commit tried
  ExpectIdentical(cold, r);
  EXPECT_EQ(store.calls, 1);
  EXPECT_GT(r.stats.store_skipped, 0u);
  EXPECT_EQ(r.stats.committed_blocks, 0u);
  (void)run();  // still backing off: not even a match
  EXPECT_EQ(store.calls, 1);
  clock.Advance(Seconds(1));
  (void)run();  // the probe fails: back off 2 s
  EXPECT_EQ(store.calls, 2);
  clock.Advance(Seconds(1));
  (void)run();
  EXPECT_EQ(store.calls, 2);
  clock.Advance(Seconds(1));
  store.reachable = true;
  r = run();  // the probe gets an answer: the store is used again
  ExpectIdentical(cold, r);
  EXPECT_GT(store.calls, 3);
  EXPECT_EQ(r.stats.store_skipped, 0u);
  EXPECT_GT(r.stats.committed_blocks, 0u);
  ExpectStoreQuiet(cache);
}

// The real thing: a strata-node process holding turn 1, killed (SIGKILL)
// the moment turn 2's fetch starts. Active messages only, so every byte
// needs the node (an RMA mapping would outlive it on this host).
class NodeKillingStore final : public ForwardingStore {
 public:
  NodeKillingStore(Store& inner, ::strata::testing::NodeProcess& node)
      : ForwardingStore(inner), node_(node) {}
  FetchFuture Fetch(const FetchRequest& r) override {
    node_.Kill();
    killed = true;
    return inner_.Fetch(r);
  }
  bool killed = false;

 private:
  ::strata::testing::NodeProcess& node_;
};

TEST(NodeFaultTest, NodeKilledMidFetchRecomputesWithTheSameOutput) {
  const std::string dir = ::strata::testing::TempDir("worker-node");
  std::string error;
  auto node = ::strata::testing::NodeProcess::Start(dir, {}, &error);
  ASSERT_NE(node, nullptr) << error;
  ClientOptions co;
  co.token = ::strata::testing::kTokenA.token;
  co.data_plane_mode = "am";
  co.timeout = Seconds(3);
  auto remote = OpenStore(node->uri(), co);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  const RunResult first = RunOne(Options(remote->get()), Turn1());
  EXPECT_GT(first.stats.committed_blocks, 0u);
  const RunResult cold = RunOne(Options(nullptr), Turn2());
  NodeKillingStore killer(**remote, *node);
  const RunResult r = RunOne(Options(&killer), Turn2());
  EXPECT_TRUE(killer.killed);
  ExpectIdentical(cold, r);
  EXPECT_EQ(r.stats.hit_tokens, 0u);
  EXPECT_EQ(r.stats.recomputed_tokens, 512u);
  EXPECT_GE(r.stats.store_errors, 1u);
  std::filesystem::remove_all(dir);
}

// Issue #38: the worker keyed every prompt under "default", whatever
// namespace its token named, so a tenant's own client (strata-admin
// prefix) derived other keys and found nothing of what the worker stored.
TEST(NodeNamespaceTest, TheWorkersKeysAreItsTokensNamespace) {
  const std::string dir = ::strata::testing::TempDir("worker-namespace");
  std::string error;
  auto node = ::strata::testing::NodeProcess::Start(dir, {}, &error);
  ASSERT_NE(node, nullptr) << error;
  ClientOptions co;
  co.token = ::strata::testing::kTokenA.token;
  auto remote = OpenStore(node->uri(), co);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ((*remote)->CallerNamespace().value(), ::strata::testing::kTokenA.ns);
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), Options(remote->get()));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const RunResult first = RunOn(**engine, 1, Turn1());
  ASSERT_GT(first.stats.committed_blocks, 0u);
  // What any client of tenant-a derives for the prompt: every full block
  // the worker committed is a hit.
  MatchRequest m;
  m.model_id = (*engine)->model_id();
  const std::vector<uint32_t> prompt = Turn1();
  m.tokens = prompt;
  Result<MatchResult> hit = (*remote)->Match(m);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->blocks.size(), prompt.size() / 256);
  EXPECT_GT(hit->blocks.size(), 0u);
  remote->reset();
  node.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::worker

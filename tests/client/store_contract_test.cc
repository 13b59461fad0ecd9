// The store contract (DESIGN §3), written once and run against every Store
// implementation: the in-process store, one strata-node, and a cluster of
// three. A rule of the contract belongs here, not in a store's own tests.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "node_process.h"
#include "node_test_util.h"
#include "strata/cache_store.h"
#include "strata/client.h"
#include "strata/store.h"
#include "test_util.h"

namespace strata::testing {
namespace {

// Asks for the match's SWA state (boundary above 1) with none of its
// blocks, then with only the first: each refused with INVALID_ARGUMENT,
// whatever the store (the state is only good with the prefix under it).
void ExpectSwaRefusedWithoutItsPrefix(Store& store, const MatchResult& m) {
  ASSERT_TRUE(m.swa.has_value());
  ASSERT_GT(m.swa->boundary_blocks, 1u);
  std::vector<std::byte> block(m.blocks.at(0).payload_bytes);
  std::vector<std::byte> swa(m.swa->entry.payload_bytes);
  FetchRequest req;
  req.match = &m;
  req.swa_buffer = swa;
  for (size_t blocks = 0; blocks < 2; ++blocks) {
    if (blocks == 1) req.block_buffers = {block};
    const FetchOutcome out = store.Fetch(req).Wait();
    EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument)
        << blocks << " blocks: " << out.status.ToString();
    EXPECT_FALSE(out.swa_ready);
  }
}

// A running store, opened once per test suite, that each test opens under
// one tenant's credentials.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::unique_ptr<Store> Open(const TestToken& who) = 0;
};

Role RoleOf(const TestToken& who) {
  const std::string role = who.role;
  if (role == "admin") return Role::kAdmin;
  return role == "read" ? Role::kRead : Role::kWrite;
}

// inproc://: a CacheStore in this process.
struct InProcess {
  class Stores : public Backend {
   public:
    explicit Stores(std::shared_ptr<CacheStore> store) : store_(std::move(store)) {}
    std::unique_ptr<Store> Open(const TestToken& who) override {
      return OpenInProcessStore(store_, Principal{who.ns, RoleOf(who)});
    }

   private:
    std::shared_ptr<CacheStore> store_;
  };
  static std::unique_ptr<Backend> Start(std::string* error) {
    CacheStoreOptions o;
    o.dram.capacity_bytes = 256ull << 20;
    o.dram.prefault = false;
    o.dram.try_huge_pages = false;
    auto store = CacheStore::Open(std::move(o));
    if (!store.ok()) {
      *error = store.status().ToString();
      return nullptr;
    }
    return std::make_unique<Stores>(std::shared_ptr<CacheStore>(std::move(store).value()));
  }
};

// strata://host:port: one real strata-node process.
struct OneNode {
  class Stores : public Backend {
   public:
    explicit Stores(std::unique_ptr<NodeProcess> node) : node_(std::move(node)) {}
    std::unique_ptr<Store> Open(const TestToken& who) override {
      return testing::Open(*node_, who.token);
    }

   private:
    std::unique_ptr<NodeProcess> node_;
  };
  static std::unique_ptr<Backend> Start(std::string* error) {
    auto node = NodeProcess::Start(TempDir("contract-node"), {}, error);
    if (node == nullptr) return nullptr;
    return std::make_unique<Stores>(std::move(node));
  }
};

// strata://a,b,c: three nodes, every block on two of them.
struct ThreeNodeCluster {
  class Stores : public Backend {
   public:
    explicit Stores(std::vector<std::unique_ptr<NodeProcess>> nodes) : nodes_(std::move(nodes)) {}
    std::unique_ptr<Store> Open(const TestToken& who) override {
      std::string uri = "strata://";
      for (size_t i = 0; i < nodes_.size(); ++i) {
        uri += (i == 0 ? "" : ",") + nodes_[i]->target();
      }
      ClientOptions options;
      options.token = who.token;
      options.replication_factor = 2;
      auto store = OpenStore(uri, options);
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      return store.ok() ? std::move(store).value() : nullptr;
    }

   private:
    std::vector<std::unique_ptr<NodeProcess>> nodes_;
  };
  static std::unique_ptr<Backend> Start(std::string* error) {
    const std::string dir = TempDir("contract-cluster");
    std::vector<std::unique_ptr<NodeProcess>> nodes;
    for (int i = 0; i < 3; ++i) {
      nodes.push_back(NodeProcess::Start(dir, {}, error));
      if (nodes.back() == nullptr) return nullptr;
    }
    return std::make_unique<Stores>(std::move(nodes));
  }
};

// What Reserve is asked for, given what a commit would send.
std::vector<CommitBlock> BlocksOf(const std::vector<CommitPayload>& payloads) {
  std::vector<CommitBlock> blocks;
  blocks.reserve(payloads.size());
  for (const CommitPayload& c : payloads) blocks.push_back(c.block);
  return blocks;
}

template <typename Kind>
class StoreContractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    backend_ = Kind::Start(&error);
    ASSERT_NE(backend_, nullptr) << error;
  }
  static void TearDownTestSuite() { backend_.reset(); }

  void SetUp() override {
    ASSERT_NE(backend_, nullptr);
    store_ = backend_->Open(kTokenA);
    ASSERT_NE(store_, nullptr);
  }

  // A prompt no test has stored yet (seeds are never reused in a suite).
  Prompt NewPrompt(size_t blocks) {
    static std::atomic<uint32_t> seed{1};
    return MakePrompt(*store_, blocks, seed++);
  }

  std::unique_ptr<Store> OpenAs(const TestToken& who) { return backend_->Open(who); }

  static inline std::unique_ptr<Backend> backend_;
  std::unique_ptr<Store> store_;
};

using StoreKinds = ::testing::Types<InProcess, OneNode, ThreeNodeCluster>;
class StoreKindNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, InProcess>) return "InProcess";
    if (std::is_same_v<T, OneNode>) return "OneNode";
    return "ThreeNodeCluster";
  }
};
TYPED_TEST_SUITE(StoreContractTest, StoreKinds, StoreKindNames);

TYPED_TEST(StoreContractTest, ACommittedPromptMatchesAndFetchesBitIdentical) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(4);
  CommitAll(store, p);
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 4u);
  EXPECT_EQ(m->hit_tokens(), 4u * 256);
  EXPECT_EQ(m->prefix_key, p.keys[4]);
  ASSERT_TRUE(m->swa.has_value());
  EXPECT_EQ(m->swa->boundary_blocks, 4u);
  EXPECT_NE(m->lease, 0u);
  const Fetched f = FetchAll(store, *m);
  ASSERT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  ASSERT_EQ(f.outcome.blocks_ready, 4u);
  for (size_t b = 0; b < 4; ++b) EXPECT_EQ(f.blocks[b], p.blocks[b].bytes) << "block " << b;
  EXPECT_TRUE(f.outcome.swa_ready);
  EXPECT_EQ(f.swa, p.swa.bytes);
  EXPECT_TRUE(store.Abort(m->lease).ok());
}

TYPED_TEST(StoreContractTest, AnUnknownPromptMissesAtItsRootKey) {
  const Prompt p = this->NewPrompt(3);
  auto m = MatchPrompt(*this->store_, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->blocks.empty());
  EXPECT_FALSE(m->swa.has_value());
  EXPECT_EQ(m->prefix_key, p.keys[0]);
  EXPECT_EQ(m->prompt_blocks, 3u);
}

TYPED_TEST(StoreContractTest, AMatchStopsAtTheFirstMissingBlock) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(4);
  auto committed = store.Commit(TestModel(), Payloads(p, 0, 2, /*with_swa=*/false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 2u);
  EXPECT_EQ(m->prefix_key, p.keys[2]);
  EXPECT_FALSE(m->swa.has_value());
  if (m->lease != 0) {
    EXPECT_TRUE(store.Abort(m->lease).ok());
  }
}

TYPED_TEST(StoreContractTest, TheSwaStateIsOfferedAtTheDeepestBoundaryOfTheHit) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(4);
  // Blocks 0..1 with their state at boundary 2, then blocks 2..3 without.
  ASSERT_TRUE(store.Commit(TestModel(), Payloads(p, 0, 2, /*with_swa=*/true)).ok());
  ASSERT_TRUE(store.Commit(TestModel(), Payloads(p, 2, 4, /*with_swa=*/false)).ok());
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 4u);
  ASSERT_TRUE(m->swa.has_value());
  EXPECT_EQ(m->swa->boundary_blocks, 2u);
  const Fetched f = FetchAll(store, *m);
  ASSERT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 4u);
  EXPECT_TRUE(f.outcome.swa_ready);
  EXPECT_EQ(f.swa, p.swa.bytes);
  EXPECT_TRUE(store.Abort(m->lease).ok());
}

TYPED_TEST(StoreContractTest, TheSwaStateIsRefusedWithoutItsPrefix) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(4);
  CommitAll(store, p);
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSwaRefusedWithoutItsPrefix(store, *m);
  EXPECT_TRUE(store.Abort(m->lease).ok());
}

TYPED_TEST(StoreContractTest, ACommitIsIdempotent) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(3);
  CommitAll(store, p);
  CommitAll(store, p);
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 3u);
  const Fetched f = FetchAll(store, *m);
  EXPECT_EQ(f.outcome.blocks_ready, 3u) << f.outcome.status.ToString();
  EXPECT_TRUE(store.Abort(m->lease).ok());
}

TYPED_TEST(StoreContractTest, AnAbortedReservationPublishesNothingAndAbortIsSafeToRepeat) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(2);
  const std::vector<CommitBlock> blocks = BlocksOf(Payloads(p, 0, 2, /*with_swa=*/false));
  auto r = store.Reserve(TestModel(), blocks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(r->write_lease, 0u);
  ASSERT_EQ(r->blocks.size(), 2u);
  EXPECT_TRUE(store.Abort(r->write_lease).ok());
  EXPECT_TRUE(store.Abort(r->write_lease).ok());
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->blocks.empty());
  // The keys are free again: a new commit of them goes through.
  CommitAll(store, p, /*with_swa=*/false);
}

TYPED_TEST(StoreContractTest, PublishRefusesABlockWhoseBytesMissTheirChecksum) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(2);
  const std::vector<CommitPayload> payloads = Payloads(p, 0, 2, /*with_swa=*/false);
  const std::vector<CommitBlock> blocks = BlocksOf(payloads);
  auto r = store.Reserve(TestModel(), blocks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->blocks.size(), 2u);
  std::vector<uint64_t> checksums;
  for (size_t b = 0; b < 2; ++b) {
    ASSERT_EQ(r->blocks[b].state, ReserveState::kReserved);
    ASSERT_GE(r->blocks[b].buffer.size(), payloads[b].bytes.size());
    std::copy(payloads[b].bytes.begin(), payloads[b].bytes.end(), r->blocks[b].buffer.begin());
    checksums.push_back(payloads[b].checksum);
  }
  checksums[1] ^= 1;  // block 1's bytes no longer match what the writer vouches for
  auto published = store.Publish(r->write_lease, checksums);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  ASSERT_EQ(published->blocks.size(), 2u);
  EXPECT_TRUE(published->blocks[0].ok()) << published->blocks[0].ToString();
  EXPECT_FALSE(published->blocks[1].ok());
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 1u);
  if (m->lease != 0) {
    EXPECT_TRUE(store.Abort(m->lease).ok());
  }
}

TYPED_TEST(StoreContractTest, AFetchUnderAnEndedLeaseGetsNoBytes) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(2);
  CommitAll(store, p, /*with_swa=*/false);
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 2u);
  ASSERT_TRUE(store.Abort(m->lease).ok());
  const Fetched f = FetchAll(store, *m);
  EXPECT_EQ(f.outcome.status.code(), StatusCode::kLeaseExpired) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 0u);
  EXPECT_FALSE(store.RenewLease(m->lease, Seconds(5)).ok());
}

TYPED_TEST(StoreContractTest, AMatchWithoutALeaseIsStillFetched) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(3);
  CommitAll(store, p);
  auto m = MatchPrompt(store, p, /*lease=*/false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->lease, 0u);
  ASSERT_EQ(m->blocks.size(), 3u);
  const Fetched f = FetchAll(store, *m);
  ASSERT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 3u);
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(f.blocks[b], p.blocks[b].bytes) << "block " << b;
  EXPECT_TRUE(f.outcome.swa_ready);
  EXPECT_EQ(f.swa, p.swa.bytes);
}

TYPED_TEST(StoreContractTest, ALiveLeaseRenews) {
  Store& store = *this->store_;
  const Prompt p = this->NewPrompt(1);
  CommitAll(store, p, /*with_swa=*/false);
  auto m = MatchPrompt(store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_NE(m->lease, 0u);
  EXPECT_TRUE(store.RenewLease(m->lease, Seconds(20)).ok());
  const Fetched f = FetchAll(store, *m);
  EXPECT_EQ(f.outcome.blocks_ready, 1u) << f.outcome.status.ToString();
  EXPECT_TRUE(store.Abort(m->lease).ok());
}

TYPED_TEST(StoreContractTest, ATenantSeesNothingOfAnother) {
  Store& a = *this->store_;
  const Prompt p = this->NewPrompt(2);
  CommitAll(a, p);
  std::unique_ptr<Store> b = this->OpenAs(kTokenB);
  ASSERT_NE(b, nullptr);
  auto ns = b->CallerNamespace();
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_EQ(*ns, kTokenB.ns);
  // The same tokens: another namespace's keys, a miss.
  auto by_tokens = MatchPrompt(*b, p);
  ASSERT_TRUE(by_tokens.ok()) << by_tokens.status().ToString();
  EXPECT_TRUE(by_tokens->blocks.empty());
  EXPECT_NE(by_tokens->prefix_key, p.keys[0]);
  // A's own keys, should B learn them: still a miss.
  MatchKeysRequest req;
  req.model_id = TestModel();
  req.root = p.keys[0];
  const std::vector<ChainKey> keys(p.keys.begin() + 1, p.keys.end());
  req.keys = keys;
  req.take_lease = true;
  auto by_keys = b->MatchKeys(req);
  ASSERT_TRUE(by_keys.ok()) << by_keys.status().ToString();
  EXPECT_TRUE(by_keys->blocks.empty());
  EXPECT_FALSE(by_keys->swa.has_value());
}

TYPED_TEST(StoreContractTest, TheCallerNamespaceIsTheCredentials) {
  auto ns = this->store_->CallerNamespace();
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_EQ(*ns, kTokenA.ns);
}

}  // namespace
}  // namespace strata::testing

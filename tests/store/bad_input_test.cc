// Bad input gets INVALID_ARGUMENT (or the precise code) and changes nothing.
#include <gtest/gtest.h>

#include <limits>

#include "strata/cache_store.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::kTinyGlobalLayout;
using testing::MakePayload;
using testing::TestModel;
using testing::TestStore;
using testing::TinyGlobalLayout;
using testing::Tokens;

class BadInputTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Status st = t_.store->CheckInvariantsForTesting();
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(t_.store->Stats().used_bytes, expected_used_);
    EXPECT_EQ(t_.store->Stats().reserved_entries, 0u);
  }
  CommitBlock Block(const ChainKey& k) const {
    return {k, StateKind::kGlobalKv, kTinyGlobalLayout, TinyGlobalLayout().PayloadBytes(),
            std::nullopt};
  }
  StatusCode ReserveCode(std::vector<CommitBlock> blocks) {
    return t_.store->Reserve(t_.writer, TestModel(), blocks).status().code();
  }
  TestStore t_;
  uint64_t expected_used_ = 0;
  const ChainKey key_ = ChainKeys::Root({"x", TestModel(), ""});
};

TEST_F(BadInputTest, ReserveRejectsBadBlocks) {
  EXPECT_EQ(ReserveCode({}), StatusCode::kInvalidArgument);  // no blocks
  std::vector<CommitBlock> too_many(kMaxBlocksPerCall + 1, Block(key_));
  EXPECT_EQ(ReserveCode(too_many), StatusCode::kInvalidArgument);
  CommitBlock b = Block(key_);
  b.layout_id = 4242;  // unknown layout
  EXPECT_EQ(ReserveCode({b}), StatusCode::kInvalidArgument);
  b = Block(key_);
  b.kind = StateKind::kSwaState;  // layout is for GLOBAL_KV
  EXPECT_EQ(ReserveCode({b}), StatusCode::kInvalidArgument);
  b = Block(key_);
  b.payload_bytes = 0;
  EXPECT_EQ(ReserveCode({b}), StatusCode::kInvalidArgument);
  b.payload_bytes = TinyGlobalLayout().PayloadBytes() + 1;  // mismatched length
  EXPECT_EQ(ReserveCode({b}), StatusCode::kInvalidArgument);
  b.payload_bytes = uint64_t{1} << 40;  // oversized
  EXPECT_EQ(ReserveCode({b}), StatusCode::kInvalidArgument);
  CommitBlock swa{key_, StateKind::kSwaState, testing::kTinySwaLayout,
                  testing::TinySwaLayout().PayloadBytes(), key_};  // SWA with a parent
  EXPECT_EQ(ReserveCode({swa}), StatusCode::kInvalidArgument);
  // One bad block spoils the batch: nothing is reserved.
  EXPECT_EQ(ReserveCode({Block(key_), b}), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      t_.store->Reserve(t_.writer, TestModel(), std::vector{Block(key_)}, Hours(1)).status().code(),
      StatusCode::kInvalidArgument);  // lease ttl above the limit
}

TEST_F(BadInputTest, CommitRejectsMismatchedAndMalformedPayloads) {
  testing::Payload p = MakePayload(TinyGlobalLayout(), 1);
  CommitPayload short_bytes{Block(key_), std::span(p.bytes).first(10), p.checksum};
  EXPECT_EQ(t_.store->Commit(t_.writer, TestModel(), std::span(&short_bytes, 1)).status().code(),
            StatusCode::kInvalidArgument);
  // Right length, garbage header: the block is refused at publish.
  std::vector<std::byte> garbage(p.bytes.size(), std::byte{0x5a});
  CommitPayload bad{Block(key_), garbage, Checksum64(garbage)};
  auto r = t_.store->Commit(t_.writer, TestModel(), std::span(&bad, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->blocks[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->published, 0u);
  // A valid payload of another layout under this layout's id.
  testing::Payload swa = MakePayload(testing::TinySwaLayout(), 2, 5);
  std::vector<std::byte> resized = swa.bytes;
  resized.resize(p.bytes.size());
  CommitPayload wrong_layout{Block(key_), resized, swa.checksum};
  r = t_.store->Commit(t_.writer, TestModel(), std::span(&wrong_layout, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->blocks[0].ok());
}

TEST_F(BadInputTest, PublishNeedsOneChecksumPerBlock) {
  auto res = t_.store->Reserve(t_.writer, TestModel(), std::vector{Block(key_)}).value();
  std::vector<uint64_t> two = {1, 2};
  EXPECT_EQ(t_.store->Publish(t_.writer, res.write_lease, two).status().code(),
            StatusCode::kInvalidArgument);
  // The lease survived the bad call; abort it.
  EXPECT_EQ(t_.store->Stats().write_leases, 1u);
  EXPECT_TRUE(t_.store->Abort(t_.writer, res.write_lease).ok());
  EXPECT_EQ(t_.store->Publish(t_.writer, 987654, two).status().code(), StatusCode::kLeaseExpired);
}

TEST_F(BadInputTest, MatchRejectsOversizedAndMalformedRequests) {
  std::vector<uint32_t> huge(kMaxPromptTokens + 1, 1);
  EXPECT_EQ(t_.store->Match(t_.writer, t_.Request(huge)).status().code(),
            StatusCode::kInvalidArgument);
  auto tokens = Tokens(16, 1);
  MatchRequest req = t_.Request(tokens);
  req.block_tokens = 0;
  EXPECT_EQ(t_.store->Match(t_.writer, req).status().code(), StatusCode::kInvalidArgument);
  req = t_.Request(tokens, Hours(2));
  EXPECT_EQ(t_.store->Match(t_.writer, req).status().code(), StatusCode::kInvalidArgument);
  req = t_.Request(tokens);
  req.extra = std::string(kMaxExtraBytes + 1, 'x');
  EXPECT_EQ(t_.store->Match(t_.writer, req).status().code(), StatusCode::kInvalidArgument);
  MultimodalRef unsorted[2] = {{9, {}}, {1, {}}};
  req = t_.Request(tokens);
  req.mm = unsorted;
  EXPECT_EQ(t_.store->Match(t_.writer, req).status().code(), StatusCode::kInvalidArgument);
  const Principal bad_ns{"has space", Role::kAdmin};
  EXPECT_EQ(t_.store->Match(bad_ns, t_.Request(tokens)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, FetchRejectsMalformedRequests) {
  const auto tokens = Tokens(8, 2);
  ASSERT_TRUE(t_.CommitBlocks(tokens, 0, 2).ok());
  expected_used_ = t_.store->Stats().used_bytes;
  auto m = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  FetchRequest req;
  EXPECT_EQ(t_.store->Fetch(t_.writer, req).Wait().status.code(), StatusCode::kInvalidArgument);
  req.match = &m;
  std::vector<std::byte> small(10), ok(m.blocks[0].payload_bytes);
  req.block_buffers = {small};
  EXPECT_EQ(t_.store->Fetch(t_.writer, req).Wait().status.code(), StatusCode::kInvalidArgument);
  req.block_buffers = {ok, ok, ok};  // more blocks than matched
  EXPECT_EQ(t_.store->Fetch(t_.writer, req).Wait().status.code(), StatusCode::kInvalidArgument);
  // An SWA state without the prefix under it is no use to anyone: the state
  // after block 2 needs blocks 0 and 1 fetched with it.
  const auto keys = t_.Keys(tokens, t_.writer);
  ASSERT_TRUE(t_.CommitSwa(keys[1], 7, t_.writer).ok());
  expected_used_ = t_.store->Stats().used_bytes;
  auto with_swa = t_.store->Match(t_.writer, t_.Request(tokens)).value();
  ASSERT_TRUE(with_swa.swa.has_value());
  std::vector<std::byte> swa(with_swa.swa->entry.payload_bytes);
  FetchRequest swa_req;
  swa_req.match = &with_swa;
  swa_req.swa_buffer = swa;
  for (std::span<std::byte> blocks : {std::span<std::byte>(), std::span<std::byte>(ok)}) {
    swa_req.block_buffers.clear();
    if (!blocks.empty()) swa_req.block_buffers.push_back(blocks);
    const FetchOutcome out = t_.store->Fetch(t_.writer, swa_req).Wait();
    EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument) << out.status.ToString();
    EXPECT_FALSE(out.swa_ready);
  }
  EXPECT_TRUE(t_.store->Abort(t_.writer, with_swa.lease).ok());
  // A lease id that was never granted is not a way in.
  MatchResult forged = m;
  forged.lease = 12345;
  req.match = &forged;
  req.block_buffers = {ok};
  EXPECT_EQ(t_.store->Fetch(t_.writer, req).Wait().status.code(), StatusCode::kLeaseExpired);
}

TEST_F(BadInputTest, FetchNeverTrustsAnAlteredMatchResult) {
  const auto a = Tokens(8, 3), b = Tokens(8, 4);
  ASSERT_TRUE(t_.CommitBlocks(a, 0, 2).ok());
  ASSERT_TRUE(t_.CommitBlocks(b, 0, 2).ok());
  expected_used_ = t_.store->Stats().used_bytes;
  auto ma = t_.store->Match(t_.writer, t_.Request(a, Seconds(10))).value();
  auto mb = t_.store->Match(t_.writer, t_.Request(b, Seconds(10))).value();
  std::vector<std::byte> buf(ma.blocks[0].payload_bytes);
  // b's blocks under a's lease: refused, nothing copied.
  MatchResult mixed = mb;
  mixed.lease = ma.lease;
  FetchRequest req;
  req.match = &mixed;
  req.block_buffers = {buf};
  FetchOutcome out = t_.store->Fetch(t_.writer, req).Wait();
  EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.blocks_ready, 0u);
  // A payload size shrunk to pass the buffer check is caught before any copy
  // (under ASan this would otherwise be an overflow).
  MatchResult shrunk = ma;
  shrunk.blocks[0].payload_bytes = 8;
  std::vector<std::byte> tiny(8);
  req.match = &shrunk;
  req.block_buffers = {tiny};
  out = t_.store->Fetch(t_.writer, req).Wait();
  EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument);
  shrunk.lease = 0;  // the same through a lookup instead of the lease
  out = t_.store->Fetch(t_.writer, req).Wait();
  EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t_.store->Abort(t_.writer, ma.lease).ok());
  EXPECT_TRUE(t_.store->Abort(t_.writer, mb.lease).ok());
}

TEST_F(BadInputTest, AWriteLeaseIsNoWayToReadReservedBytes) {
  const auto tokens = Tokens(4, 5);
  CommitBlock cb = Block(t_.Keys(tokens, t_.writer)[0]);
  auto res = t_.store->Reserve(t_.writer, TestModel(), std::span(&cb, 1)).value();
  MatchResult m;
  m.block_tokens = testing::kTinyBlockTokens;
  m.blocks.push_back({cb.key, Tier::kDram, kTinyGlobalLayout, cb.payload_bytes});
  m.lease = res.write_lease;
  std::vector<std::byte> buf(cb.payload_bytes);
  FetchRequest req;
  req.match = &m;
  req.block_buffers = {buf};
  EXPECT_EQ(t_.store->Fetch(t_.writer, req).Wait().status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t_.store->Abort(t_.writer, res.write_lease).ok());
}

TEST_F(BadInputTest, LayoutRegistrationIsChecked) {
  Layout empty{500, StateKind::kGlobalKv, 4, {}};
  EXPECT_EQ(t_.store->RegisterLayout(empty).code(), StatusCode::kInvalidArgument);
  Layout huge{501, StateKind::kGlobalKv, 4, {{"g", kMaxPayloadBytes}}};
  EXPECT_EQ(t_.store->RegisterLayout(huge).code(), StatusCode::kInvalidArgument);
  Layout wraps{502, StateKind::kGlobalKv, 4, {{"a", uint64_t{1} << 63}, {"b", uint64_t{1} << 63}}};
  EXPECT_EQ(wraps.Validate().code(), StatusCode::kInvalidArgument);
  Layout clash = TinyGlobalLayout();
  clash.groups[0].bytes += 64;
  EXPECT_EQ(t_.store->RegisterLayout(clash).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(t_.store->RegisterLayout(TinyGlobalLayout()).ok());  // same again is fine
}

TEST(BadOptionsTest, OpenRejectsBadOptions) {
  CacheStoreOptions o;
  o.dram.capacity_bytes = 1 << 20;
  o.dram.prefault = false;
  o.maintenance_interval = 0;
  auto bad = o;
  bad.low_watermark = 0.99;
  bad.high_watermark = 0.5;
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.index_shards = 3;
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.eviction_policy = "random";
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.swa_ttl = 0;
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  // "Never expire" would overflow now + TTL: entries would be born expired.
  bad = o;
  bad.global_kv_ttl = std::numeric_limits<Nanos>::max();
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.max_lease_life = std::numeric_limits<Nanos>::max();
  EXPECT_EQ(CacheStore::Open(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.global_kv_ttl = kMaxEntryTtl;  // the longest allowed still works
  EXPECT_TRUE(CacheStore::Open(bad).ok());
}

}  // namespace
}  // namespace strata

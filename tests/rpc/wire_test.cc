// Store types <-> wire schema: round trips, and malformed messages rejected
// with INVALID_ARGUMENT (including random bytes), never a crash.
#include "rpc/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace strata::wire {
namespace {

using testing::TestModel;

ChainKey Key(uint8_t seed) {
  ChainKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

TEST(WireTest, MatchRequestRoundTrip) {
  std::vector<ChainKey> keys = {Key(1), Key(2), Key(3)};
  MatchKeysRequest r;
  r.model_id = TestModel();
  r.root = Key(0);
  r.keys = keys;
  r.block_tokens = 256;
  r.take_lease = true;
  r.lease_ttl = Seconds(7);
  DecodedMatch d;
  ASSERT_TRUE(DecodeMatchRequest(EncodeMatchRequest(r), &d).ok());
  EXPECT_EQ(d.request.model_id, r.model_id);
  EXPECT_EQ(d.request.root, r.root);
  EXPECT_EQ(d.keys, keys);
  EXPECT_EQ(d.request.keys.size(), 3u);
  EXPECT_EQ(d.request.block_tokens, 256u);
  EXPECT_TRUE(d.request.take_lease);
  EXPECT_EQ(d.request.lease_ttl, Seconds(7));
}

TEST(WireTest, MatchResponseRoundTrip) {
  MatchResult m;
  m.blocks = {{Key(1), Tier::kDram, 1, 227'968}, {Key(2), Tier::kSsd, 1, 227'968}};
  m.prefix_key = Key(2);
  m.swa = SwaMatch{2, {Key(2), Tier::kDram, 2, 566'080}};
  m.lease = 42;
  m.prompt_blocks = 5;
  auto back = DecodeMatchResponse(EncodeMatchResult(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->blocks.size(), 2u);
  EXPECT_EQ(back->blocks[1].key, Key(2));
  EXPECT_EQ(back->blocks[1].tier, Tier::kSsd);
  EXPECT_EQ(back->prefix_key, Key(2));
  ASSERT_TRUE(back->swa.has_value());
  EXPECT_EQ(back->swa->boundary_blocks, 2u);
  EXPECT_EQ(back->swa->entry.payload_bytes, 566'080u);
  EXPECT_EQ(back->lease, 42u);
}

// A peer from before the packed match format puts its keys (or blocks) in
// the retired field: a clear error, not an empty match.
TEST(WireTest, RetiredUnpackedMatchFieldsAreRefused) {
  MatchKeysRequest r;
  r.model_id = TestModel();
  r.root = Key(0);
  std::string old_request = EncodeMatchRequest(r).SerializeAsString();
  old_request += '\x1a';  // field 3, length-delimited: one unpacked key
  old_request += '\x10';
  old_request += std::string(16, 'k');
  v1::MatchRequest req;
  ASSERT_TRUE(req.ParseFromString(old_request));
  DecodedMatch d;
  Status st = DecodeMatchRequest(req, &d);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("retired"), std::string::npos) << st.message();

  std::string old_response = EncodeMatchResult(MatchResult{}).SerializeAsString();
  old_response += '\x0a';  // field 1: one BlockMatch message
  old_response += '\x02';
  old_response += std::string("\x08\x01", 2);
  v1::MatchResponse resp;
  ASSERT_TRUE(resp.ParseFromString(old_response));
  auto decoded = DecodeMatchResponse(resp);
  EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  // Today's messages, with no retired field, still decode.
  EXPECT_TRUE(DecodeMatchRequest(EncodeMatchRequest(r), &d).ok());
}

TEST(WireTest, ReserveAndPublishRoundTrip) {
  std::vector<CommitBlock> blocks = {{Key(1), StateKind::kGlobalKv, 1, 227'968, std::nullopt},
                                     {Key(2), StateKind::kGlobalKv, 1, 227'968, Key(1)},
                                     {Key(2), StateKind::kSwaState, 2, 566'080, std::nullopt}};
  ModelId model;
  std::vector<CommitBlock> back;
  Nanos ttl = 0;
  ASSERT_TRUE(DecodeReserveRequest(EncodeReserveRequest(TestModel(), blocks, Seconds(30)), &model,
                                   &back, &ttl)
                  .ok());
  EXPECT_EQ(model, TestModel());
  ASSERT_EQ(back.size(), 3u);
  EXPECT_FALSE(back[0].parent.has_value());
  EXPECT_EQ(back[1].parent, Key(1));
  EXPECT_EQ(back[2].kind, StateKind::kSwaState);
  EXPECT_EQ(ttl, Seconds(30));

  PublishResult p;
  p.blocks = {Status::Ok(), ChecksumMismatch("group 1"), NotFound("parent")};
  p.published = 1;
  PublishResult pb = DecodePublishResponse(EncodePublishResult(p));
  ASSERT_EQ(pb.blocks.size(), 3u);
  EXPECT_TRUE(pb.blocks[0].ok());
  EXPECT_EQ(pb.blocks[1], ChecksumMismatch("group 1"));
  EXPECT_EQ(pb.blocks[2].code(), StatusCode::kNotFound);
  EXPECT_EQ(pb.published, 1u);
}

TEST(WireTest, MalformedMessagesAreInvalidArgument) {
  v1::MatchRequest m = EncodeMatchRequest({});
  DecodedMatch d;
  m.set_model_id("short");
  EXPECT_EQ(DecodeMatchRequest(m, &d).code(), StatusCode::kInvalidArgument);
  m = EncodeMatchRequest({});
  m.set_keys(std::string(17, 'x'));
  EXPECT_EQ(DecodeMatchRequest(m, &d).code(), StatusCode::kInvalidArgument);
  m = EncodeMatchRequest({});
  m.set_keys(std::string(16 * (kMaxBlocksPerCall + 1), 'k'));
  EXPECT_EQ(DecodeMatchRequest(m, &d).code(), StatusCode::kInvalidArgument);
  m.set_keys(std::string(16 * kMaxBlocksPerCall, 'k'));
  EXPECT_TRUE(DecodeMatchRequest(m, &d).ok());
  EXPECT_EQ(d.keys.size(), kMaxBlocksPerCall);
  m = EncodeMatchRequest({});
  m.set_lease_ttl_ms(3'600'000);
  EXPECT_EQ(DecodeMatchRequest(m, &d).code(), StatusCode::kInvalidArgument);
  for (uint32_t block_tokens : {0u, kMaxBlockTokens + 1}) {
    m = EncodeMatchRequest({});
    m.set_block_tokens(block_tokens);
    EXPECT_EQ(DecodeMatchRequest(m, &d).code(), StatusCode::kInvalidArgument) << block_tokens;
  }

  v1::ReserveRequest r;
  ModelId model;
  std::vector<CommitBlock> blocks;
  Nanos ttl;
  EXPECT_EQ(DecodeReserveRequest(r, &model, &blocks, &ttl).code(), StatusCode::kInvalidArgument);
  r = EncodeReserveRequest(
      TestModel(), std::vector<CommitBlock>{{Key(1), StateKind::kGlobalKv, 1, 1, std::nullopt}}, 0);
  r.mutable_blocks(0)->set_kind(static_cast<v1::StateKind>(9));
  EXPECT_EQ(DecodeReserveRequest(r, &model, &blocks, &ttl).code(), StatusCode::kInvalidArgument);
  r.mutable_blocks(0)->set_kind(v1::GLOBAL_KV);
  r.mutable_blocks(0)->set_parent_key("p");
  EXPECT_EQ(DecodeReserveRequest(r, &model, &blocks, &ttl).code(), StatusCode::kInvalidArgument);
  // A bad key names its block: a reserve carries up to kMaxBlocksPerCall.
  r.mutable_blocks(0)->clear_parent_key();
  *r.add_blocks() = r.blocks(0);
  r.mutable_blocks(1)->set_key("short");
  const Status short_key = DecodeReserveRequest(r, &model, &blocks, &ttl);
  EXPECT_EQ(short_key.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_key.message().find("block 1: key"), std::string::npos) << short_key.ToString();

  // The packed arrays of a match answer must agree in length.
  MatchResult two;
  two.blocks = {{Key(1), Tier::kDram, 1, 100}, {Key(2), Tier::kSsd, 1, 100}};
  v1::MatchResponse packed = EncodeMatchResult(two);
  ASSERT_TRUE(DecodeMatchResponse(packed).ok());
  packed.mutable_blocks()->mutable_locations()->RemoveLast();
  EXPECT_EQ(DecodeMatchResponse(packed).status().code(), StatusCode::kInvalidArgument);
  packed = EncodeMatchResult(two);
  packed.mutable_blocks()->mutable_keys()->pop_back();
  EXPECT_EQ(DecodeMatchResponse(packed).status().code(), StatusCode::kInvalidArgument);

  MatchResult mr;
  mr.blocks = {{Key(1), Tier::kDram, 1, 100}};
  mr.swa = SwaMatch{3, {Key(1), Tier::kDram, 2, 100}};  // boundary beyond the hit run
  EXPECT_EQ(DecodeMatchResponse(EncodeMatchResult(mr)).status().code(),
            StatusCode::kInvalidArgument);
  v1::MatchResponse bad_tier = EncodeMatchResult(two);
  bad_tier.mutable_blocks()->set_tiers(0, v1::TIER_UNSPECIFIED);
  EXPECT_EQ(DecodeMatchResponse(bad_tier).status().code(), StatusCode::kInvalidArgument);
}

TEST(WireTest, RandomBytesNeverCrashTheDecoders) {
  std::mt19937_64 rng(5);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 96, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    v1::MatchRequest m;
    if (m.ParseFromString(bytes)) {
      ++parsed;
      DecodedMatch d;
      (void)DecodeMatchRequest(m, &d);
    }
    v1::ReserveRequest r;
    if (r.ParseFromString(bytes)) {
      ModelId model;
      std::vector<CommitBlock> blocks;
      Nanos ttl;
      (void)DecodeReserveRequest(r, &model, &blocks, &ttl);
    }
    v1::MatchResponse resp;
    if (resp.ParseFromString(bytes)) (void)DecodeMatchResponse(resp);
  }
  EXPECT_GT(parsed, 0);
}

TEST(WireTest, EntryInfoTimesAreRelative) {
  EntryInfo e;
  e.key = Key(4);
  e.commit_time = Seconds(100);
  e.expiry = Seconds(100) + Hours(72);
  e.pinned_until = Seconds(160);
  const v1::EntryInfo w = EncodeEntryInfo(e, Seconds(130));
  EXPECT_EQ(w.age_ms(), 30'000);
  EXPECT_EQ(w.expires_in_ms(), Hours(72) / 1'000'000 - 30'000);
  EXPECT_EQ(w.pinned_for_ms(), 30'000);
  EXPECT_EQ(w.key().size(), 16u);
}

TEST(WireTest, StatusCodesMapBothWays) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    EXPECT_EQ(DecodeCode(EncodeCode(static_cast<StatusCode>(c))), static_cast<StatusCode>(c));
  }
  EXPECT_EQ(DecodeCode(static_cast<v1::Code>(99)), StatusCode::kInternal);
}

}  // namespace
}  // namespace strata::wire

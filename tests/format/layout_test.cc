// Layout sizes from DESIGN §8 and the payload header: sealing, parsing,
// verification, and rejection of malformed or corrupted payloads.
#include "strata/layout.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "sanitizers.h"
#include "test_util.h"

namespace strata {
namespace {

TEST(LayoutTest, V41GlobalKvSizes) {
  EXPECT_EQ(kMainKvEntry.Bytes(), 288u);
  EXPECT_EQ(kIndexerEntry.Bytes(), 68u);
  GlobalKvShape shape;
  EXPECT_DOUBLE_EQ(shape.BytesPerToken(), 890.0);
  Layout l = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  EXPECT_EQ(l.block_tokens, 256u);
  EXPECT_EQ(l.BodyBytes(), 227'840u);
  ASSERT_EQ(l.groups.size(), 3u);
  EXPECT_EQ(l.groups[0].bytes, 256u * 356);  // encoder, stride 1
  EXPECT_EQ(l.groups[1].bytes, 128u * 356);  // encoder, stride 2
  EXPECT_EQ(l.groups[2].bytes, 256u * 356);  // decoder
  EXPECT_EQ(l.HeaderBytes() % 64, 0u);
  EXPECT_EQ(l.PayloadBytes(), l.HeaderBytes() + 227'840u);
}

TEST(LayoutTest, V41SwaSizes) {
  EXPECT_EQ(kSwaPosition.Bytes(), 528u);
  SwaShape shape;
  EXPECT_EQ(shape.Slots(), 134u);
  Layout l = MakeSwaLayout(kV41SwaLayoutId, shape);
  ASSERT_EQ(l.groups.size(), 9u);  // eight rings, then the lineage
  for (uint32_t g = 0; g < 8; ++g) EXPECT_EQ(l.groups[g].bytes, 134u * 528);
  EXPECT_EQ(l.groups[8].name, "lineage");
  EXPECT_EQ(l.groups[8].bytes, kSwaLineageBytes);
  EXPECT_EQ(l.BodyBytes(), 8u * 134 * 528 + kSwaLineageBytes);
  shape.lineage = false;
  EXPECT_EQ(MakeSwaLayout(kV41SwaLayoutId, shape).BodyBytes(), 8u * 134 * 528);
}

TEST(LayoutTest, SealParseVerifyRoundTrip) {
  Layout l = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  testing::Payload p = testing::MakePayload(l, 42);
  auto header = ParsePayloadHeader(p.bytes);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->kind, StateKind::kGlobalKv);
  EXPECT_EQ(header->layout_id, l.id);
  EXPECT_EQ(header->token_count, 256u);
  ASSERT_EQ(header->groups.size(), 3u);
  EXPECT_EQ(header->groups[0].offset, l.HeaderBytes());
  EXPECT_EQ(header->groups[1].offset, l.HeaderBytes() + l.groups[0].bytes);
  EXPECT_TRUE(CheckHeaderMatchesLayout(*header, l).ok());
  EXPECT_TRUE(VerifyPayload(l, p.bytes, p.checksum).ok());
  // Entry checksum is the hash of the header, which holds each group's hash.
  EXPECT_EQ(p.checksum, Checksum64(std::span(p.bytes).first(l.HeaderBytes())));
  EXPECT_EQ(header->groups[2].checksum,
            Checksum64(std::span(p.bytes).subspan(header->groups[2].offset, l.groups[2].bytes)));
}

// A header keeps up to nine groups inline; more spill to the heap and must
// parse and verify the same.
TEST(LayoutTest, LayoutsWithMoreGroupsThanTheHeaderKeepsInlineRoundTrip) {
  for (uint32_t groups : {1u, 9u, 10u, 40u}) {
    Layout l{1234, StateKind::kGlobalKv, 256, {}};
    for (uint32_t g = 0; g < groups; ++g) l.groups.push_back({"g" + std::to_string(g), 64 + g});
    testing::Payload p = testing::MakePayload(l, groups);
    auto header = ParsePayloadHeader(p.bytes);
    ASSERT_TRUE(header.ok()) << groups << ": " << header.status().ToString();
    ASSERT_EQ(header->groups.size(), groups);
    EXPECT_EQ(header->groups.back().length, 64u + groups - 1);
    EXPECT_TRUE(VerifyPayload(l, p.bytes, p.checksum).ok()) << groups;
    // A flipped byte in the last group is caught whatever the group count.
    p.bytes.back() ^= std::byte{1};
    EXPECT_EQ(VerifyPayload(l, p.bytes, p.checksum).code(), StatusCode::kChecksumMismatch)
        << groups;
  }
}

TEST(LayoutTest, CopyAndChecksumEqualsChecksumOfCopy) {
  std::vector<std::byte> src(300'001), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 31 + 7);
  EXPECT_EQ(CopyAndChecksum(dst.data(), src.data(), src.size()), Checksum64(src));
  EXPECT_EQ(dst, src);
  // Unaligned destinations and sizes around the chunk size.
  for (size_t n : {0, 1, 63, 4096, 128 * 1024 - 1, 128 * 1024, 128 * 1024 + 1, 270'001}) {
    for (size_t shift : {0, 3, 8}) {
      std::vector<std::byte> out(n + shift, std::byte{0});
      EXPECT_EQ(CopyAndChecksum(out.data() + shift, src.data() + 5, n),
                Checksum64(std::span(src).subspan(5, n)));
      EXPECT_TRUE(std::equal(out.begin() + shift, out.end(), src.begin() + 5)) << n << "+" << shift;
    }
  }
}

// A mapped remote arena can change under a copy (its lease ran out and the
// node reused the space): the checksum returned must be the checksum of what
// was written, so a torn copy fails verification instead of passing it.
TEST(LayoutTest, CopyFromAChangingSourceReturnsTheChecksumOfTheCopy) {
  if (testing::kUnderTsan) GTEST_SKIP() << "races with the copy on purpose";
  constexpr size_t kWords = 64 * 1024;  // 512 KiB: several chunks
  std::vector<uint64_t> words(kWords, 0);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    uint64_t x = 1;
    while (!stop.load(std::memory_order_relaxed)) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      std::atomic_ref<uint64_t>(words[(x >> 20) % kWords]).store(x, std::memory_order_relaxed);
    }
  });
  std::vector<std::byte> dst(kWords * 8);
  const auto* src = reinterpret_cast<const std::byte*>(words.data());
  for (int i = 0; i < 300; ++i) {
    const uint64_t sum = CopyAndChecksum(dst.data(), src, dst.size());
    ASSERT_EQ(sum, Checksum64(dst)) << "round " << i;
  }
  stop = true;
  writer.join();
}

TEST(LayoutTest, AnyFlippedBitIsDetected) {
  Layout l = testing::TinyGlobalLayout();
  testing::Payload p = testing::MakePayload(l, 7);
  for (size_t byte = 0; byte < p.bytes.size(); byte += 13) {
    std::vector<std::byte> bad = p.bytes;
    bad[byte] ^= std::byte{0x10};
    Status st = VerifyPayload(l, bad, p.checksum);
    EXPECT_FALSE(st.ok()) << "flip at byte " << byte << " went unnoticed";
  }
}

TEST(LayoutTest, MalformedHeadersAreInvalidArgument) {
  Layout l = testing::TinyGlobalLayout();
  testing::Payload p = testing::MakePayload(l, 1);
  auto expect_invalid = [&](std::vector<std::byte> bytes, const char* what) {
    auto h = ParsePayloadHeader(bytes);
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << what;
  };
  expect_invalid({}, "empty");
  expect_invalid(std::vector<std::byte>(p.bytes.begin(), p.bytes.begin() + 20), "truncated");
  auto bad = p.bytes;
  bad[0] = std::byte{0};
  expect_invalid(bad, "magic");
  bad = p.bytes;
  bad[4] = std::byte{9};
  expect_invalid(bad, "version");
  bad = p.bytes;
  bad[6] = std::byte{7};
  expect_invalid(bad, "kind");
  bad = p.bytes;
  std::memset(&bad[16], 0xff, 4);
  expect_invalid(bad, "group count");
  bad = p.bytes;
  bad[32] = std::byte{1};  // group 0 offset
  expect_invalid(bad, "group offset");
  bad = p.bytes;
  bad.push_back(std::byte{0});  // one byte longer than the header says
  expect_invalid(bad, "length");
}

TEST(LayoutTest, HeaderMustMatchLayout) {
  Layout l = testing::TinyGlobalLayout();
  testing::Payload p = testing::MakePayload(l, 1);
  auto h = ParsePayloadHeader(p.bytes).value();
  Layout other = l;
  other.id = 999;
  EXPECT_EQ(CheckHeaderMatchesLayout(h, other).code(), StatusCode::kInvalidArgument);
  other = l;
  other.groups[0].bytes += 1;
  EXPECT_EQ(CheckHeaderMatchesLayout(h, other).code(), StatusCode::kInvalidArgument);
  testing::Payload wrong_tokens = testing::MakePayload(l, 1, 3);
  EXPECT_EQ(VerifyPayload(l, wrong_tokens.bytes, wrong_tokens.checksum).code(),
            StatusCode::kInvalidArgument);
}

TEST(LayoutTest, SealRejectsWrongSizeAndBadLayouts) {
  Layout l = testing::TinyGlobalLayout();
  std::vector<std::byte> small(l.PayloadBytes() - 1);
  EXPECT_EQ(SealPayload(l, 4, small).status().code(), StatusCode::kInvalidArgument);
  Layout empty{5, StateKind::kGlobalKv, 4, {}};
  EXPECT_EQ(empty.Validate().code(), StatusCode::kInvalidArgument);
  Layout zero_group{5, StateKind::kGlobalKv, 4, {{"g", 0}}};
  EXPECT_EQ(zero_group.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(LayoutTest, SpecsParseRoundTripAndNameTheirErrors) {
  auto meta = ParseLayoutSpec("900:global_kv:512:meta=1");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->id, 900u);
  EXPECT_EQ(meta->kind, StateKind::kGlobalKv);
  EXPECT_EQ(meta->block_tokens, 512u);
  ASSERT_EQ(meta->groups.size(), 1u);
  EXPECT_EQ(meta->groups[0].name, "meta");
  EXPECT_EQ(meta->groups[0].bytes, 1u);

  // `v41` spells out MakeGlobalKvLayout's groups; the explicit form reads back equal.
  auto v41 = ParseLayoutSpec("901:global_kv:512:v41");
  ASSERT_TRUE(v41.ok()) << v41.status().ToString();
  GlobalKvShape shape;
  shape.block_tokens = 512;
  const Layout expected = MakeGlobalKvLayout(901, shape);
  EXPECT_EQ(v41->BodyBytes(), expected.BodyBytes());
  auto again = ParseLayoutSpec(FormatLayoutSpec(*v41));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->groups.size(), expected.groups.size());
  for (size_t g = 0; g < expected.groups.size(); ++g) {
    EXPECT_EQ(again->groups[g].name, expected.groups[g].name);
    EXPECT_EQ(again->groups[g].bytes, expected.groups[g].bytes);
  }
  auto swa = ParseLayoutSpec(" 3:swa_state:134:layer.0=70752,layer.1=70752 ");
  ASSERT_TRUE(swa.ok()) << swa.status().ToString();
  EXPECT_EQ(swa->kind, StateKind::kSwaState);
  EXPECT_EQ(swa->BodyBytes(), 2u * 70752u);

  auto two = ParseLayoutSpecs("900:global_kv:512:meta=1;901:global_kv:512:v41");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
  auto none = ParseLayoutSpecs("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  for (const char* bad :
       {"900:global_kv:512", "x:global_kv:512:a=1", "900:kv:512:a=1", "900:global_kv:0:a=1",
        "900:global_kv:512:a=0", "900:global_kv:512:a", "900:global_kv:512:=5",
        "900:global_kv:512:a=1,", "900:swa_state:8:v41", "900:global_kv:512:a=-1",
        "0:global_kv:512:a=1", "4294967296:global_kv:512:a=1", "900:global_kv:65537:a=1",
        "900:global_kv:255:v41"}) {
    auto r = ParseLayoutSpec(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
  }
  EXPECT_NE(
      ParseLayoutSpecs("7:global_kv:1:a=1;7:global_kv:1:a=1").status().message().find("twice"),
      std::string::npos);
  EXPECT_FALSE(ParseLayoutSpecs("7:global_kv:1:a=1;;8:global_kv:1:a=1").ok());
}

}  // namespace
}  // namespace strata

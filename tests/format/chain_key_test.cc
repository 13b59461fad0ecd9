// Chain-key derivation: fixed test vectors (computed independently with
// Python's hashlib from the encoding documented in chain_key.h) and the
// properties DESIGN §2 requires.
#include "strata/chain_key.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace strata {
namespace {

const ModelFingerprint kFp{"weights-r1", "tok-1", "tmpl-1", 1, "fp4"};

TEST(ChainKeyTest, ModelIdVector) {
  EXPECT_EQ(kFp.Id().ToHex(), "4d76f172ce5e9cb8d1af5d4c760bcd67");
}

TEST(ChainKeyTest, RootAndBlockVectors) {
  const ChainKey root = ChainKeys::Root({"tenant-a", kFp.Id(), ""});
  EXPECT_EQ(root.ToHex(), "793dbb1341989e59aef20eaf035b86cd");
  const std::vector<uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // 9th: partial, not keyed
  auto keys = ChainKeys::ForPrompt({"tenant-a", kFp.Id(), ""}, tokens, 4).value();
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].ToHex(), "8fab59753dd9046528e76f767c782bc2");
  EXPECT_EQ(keys[1].ToHex(), "0f4f0b73b575f630c534fc53dcb1b717");
  EXPECT_EQ(ChainKeys::Next(root, std::span(tokens).first(4)), keys[0]);
  EXPECT_EQ(ChainKeys::Root({"tenant-a", kFp.Id(), "lora:7"}).ToHex(),
            "0271ceca816044b0ac9214c2903b18e1");
}

TEST(ChainKeyTest, MultimodalVector) {
  MultimodalRef mm;
  mm.position = 5;  // absolute; block 1 starts at 4, so offset 1 in the block
  for (int i = 0; i < 16; ++i) mm.content_hash[i] = static_cast<uint8_t>(i);
  const std::vector<uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  auto keys =
      ChainKeys::ForPrompt({"tenant-a", kFp.Id(), ""}, tokens, 4, std::span(&mm, 1)).value();
  EXPECT_EQ(keys[0].ToHex(), "8fab59753dd9046528e76f767c782bc2");  // block 0 has no item
  EXPECT_EQ(keys[1].ToHex(), "f28e40369a1923b6c4d0ad89c1f827a7");
}

TEST(ChainKeyTest, EqualInputsGiveEqualKeys) {
  std::vector<uint32_t> t(1024);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(i * 7919);
  auto a = ChainKeys::ForPrompt({"ns", kFp.Id(), "x"}, t, 256).value();
  auto b = ChainKeys::ForPrompt({"ns", kFp.Id(), "x"}, t, 256).value();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 4u);
}

TEST(ChainKeyTest, EveryInputChangesTheKeys) {
  std::vector<uint32_t> t = {10, 20, 30, 40, 50, 60, 70, 80};
  const ModelId other_model = ModelFingerprint{"weights-r2", "tok-1", "tmpl-1", 1, "fp4"}.Id();
  const ModelId other_layout = ModelFingerprint{"weights-r1", "tok-1", "tmpl-1", 2, "fp4"}.Id();
  const ChainKey base = ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 4).value()[1];
  std::set<std::string> seen = {base.ToHex()};
  auto add = [&](const ChainKey& k) { EXPECT_TRUE(seen.insert(k.ToHex()).second); };
  add(ChainKeys::ForPrompt({"ns2", kFp.Id(), ""}, t, 4).value()[1]);     // namespace
  add(ChainKeys::ForPrompt({"ns", other_model, ""}, t, 4).value()[1]);   // weights
  add(ChainKeys::ForPrompt({"ns", other_layout, ""}, t, 4).value()[1]);  // layout version
  add(ChainKeys::ForPrompt({"ns", kFp.Id(), "salt"}, t, 4).value()[1]);  // extra
  std::vector<uint32_t> swapped = t;
  std::swap(swapped[1], swapped[2]);  // token order inside block 0
  add(ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, swapped, 4).value()[1]);
  MultimodalRef mm{6, {}};
  mm.content_hash[0] = 1;
  add(ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 4, std::span(&mm, 1)).value()[1]);
  mm.content_hash[0] = 2;  // same position, other content
  add(ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 4, std::span(&mm, 1)).value()[1]);
}

TEST(ChainKeyTest, PrefixPropertyAndEarlyStop) {
  std::vector<uint32_t> t(64);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(i);
  auto full = ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 8).value();
  auto half = ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, std::span(t).first(32), 8).value();
  ASSERT_EQ(half.size(), 4u);
  EXPECT_TRUE(std::equal(half.begin(), half.end(), full.begin()));
  size_t calls = 0;
  auto stopped =
      ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 8, {}, [&](size_t b, const ChainKey&) {
        ++calls;
        return b < 2;
      }).value();
  EXPECT_EQ(stopped.size(), 3u);
  EXPECT_EQ(calls, 3u);
}

TEST(ChainKeyTest, EqualityAndOrderSeeEveryByte) {
  const ChainKey k = ChainKeys::Root({"ns", kFp.Id(), ""});
  for (size_t i = 0; i < k.bytes.size(); ++i) {
    ChainKey other = k;
    other.bytes[i] ^= 0x80;
    EXPECT_NE(other, k) << "byte " << i;
    EXPECT_EQ(other < k, k.bytes[i] >= 0x80) << "byte " << i;
  }
  ChainKey same = k;
  EXPECT_EQ(same, k);
  EXPECT_FALSE(same < k);
}

TEST(ChainKeyTest, HexRoundTripAndRejects) {
  const ChainKey k = ChainKeys::Root({"ns", kFp.Id(), ""});
  EXPECT_EQ(ChainKey::FromHex(k.ToHex()), k);
  EXPECT_FALSE(ChainKey::FromHex("zz").has_value());
  EXPECT_FALSE(ChainKey::FromHex(std::string(32, 'g')).has_value());
}

TEST(ChainKeyTest, BadInputs) {
  std::vector<uint32_t> t(8, 1);
  EXPECT_EQ(ChainKeys::ForPrompt({"", kFp.Id(), ""}, t, 4).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ChainKeys::ForPrompt({"bad ns!", kFp.Id(), ""}, t, 4).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 0).status().code(),
            StatusCode::kInvalidArgument);
  MultimodalRef mm[2] = {{6, {}}, {2, {}}};  // unsorted
  EXPECT_EQ(ChainKeys::ForPrompt({"ns", kFp.Id(), ""}, t, 4, mm).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata

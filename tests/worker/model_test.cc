// The model's config and topology validation, the safetensors loader, the
// tokenizer, the workload format and the block pool.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "strata/layout.h"
#include "strata/worker/block_pool.h"
#include "strata/worker/model.h"
#include "strata/worker/tokenizer.h"
#include "strata/worker/workload.h"

namespace strata::worker {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "." + std::to_string(::getpid());
}

TEST(ModelConfigTest, DefaultIsTheIssuesModel) {
  const ModelConfig c = DefaultModelConfig();
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  EXPECT_EQ(c.d_model, 256u);
  EXPECT_EQ(c.encoder_layers, 4u);
  EXPECT_EQ(c.decoder_layers, 4u);
  EXPECT_EQ(c.window, 128u);
  EXPECT_EQ(c.ring_slots, 134u);
  EXPECT_EQ(c.experts, 16u);
  EXPECT_EQ(c.experts_per_token, 2u);
  EXPECT_EQ(c.shared_experts, 1u);
  EXPECT_DOUBLE_EQ(c.GlobalKvBytesPerToken(), 890.0);
  EXPECT_DOUBLE_EQ(c.GlobalKvBytesPerToken(), GlobalKvShape{}.BytesPerToken());
  EXPECT_TRUE(TinyModelConfig().Validate().ok());
}

TEST(ModelConfigTest, TopologyThatReadsUnwrittenStateIsRejected) {
  ModelConfig c = DefaultModelConfig();
  c.layers[1] = {LayerKind::kFull, 1, -1};  // stride-2 source is produced at layer 2
  EXPECT_NE(c.Validate().message().find("layer 1: reads source 'encoder.stride2' before"),
            std::string::npos)
      << c.Validate().ToString();

  c = DefaultModelConfig();
  c.layers[3] = {LayerKind::kReuse, 1, 5};  // a later layer's indices
  EXPECT_NE(c.Validate().message().find("layer 3"), std::string::npos);

  c = DefaultModelConfig();
  c.layers[5] = {LayerKind::kReindex, 2, 6};  // forward reference
  EXPECT_FALSE(c.Validate().ok());

  c = DefaultModelConfig();
  c.layers[6] = {LayerKind::kReindex, 2, 5};  // reindex of a non-full layer
  EXPECT_NE(c.Validate().message().find("must reference a full layer"), std::string::npos);

  c = DefaultModelConfig();
  c.layers[4] = {LayerKind::kReuse, 2, 3};  // across stacks (and sources)
  EXPECT_FALSE(c.Validate().ok());

  c = DefaultModelConfig();
  c.layers[0] = {LayerKind::kFull, 2, -1};  // encoder reading the decoder source
  EXPECT_FALSE(c.Validate().ok());
}

TEST(ModelConfigTest, MetadataRoundTrip) {
  const ModelConfig c = DefaultModelConfig();
  Result<ModelConfig> back = ModelConfig::FromMetadata(c.ToMetadata());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToMetadata(), c.ToMetadata());
  auto meta = c.ToMetadata();
  meta["d_model"] = "abc";
  EXPECT_FALSE(ModelConfig::FromMetadata(meta).ok());
}

// Sizes from a model file are checked one by one: sums and products of
// them must not wrap into a config that passes and then reads out of bounds
// or allocates gigabytes per row.
TEST(ModelConfigTest, SizesThatWouldWrapOrExplodeAreRejected) {
  const auto with = [](const char* field, const char* value) {
    auto meta = DefaultModelConfig().ToMetadata();
    meta[field] = value;
    return ModelConfig::FromMetadata(meta);
  };
  {
    auto meta = DefaultModelConfig().ToMetadata();
    meta["encoder_layers"] = "4294967295";  // + 9 decoder layers wraps to 8
    meta["decoder_layers"] = "9";
    Result<ModelConfig> c = ModelConfig::FromMetadata(meta);
    EXPECT_FALSE(c.ok());
  }
  EXPECT_FALSE(with("attention_topk", "1073741824").ok());
  EXPECT_FALSE(with("candidate_blocks", "1073741824").ok());
  EXPECT_FALSE(with("indexer_block", "4294967295").ok());
  EXPECT_FALSE(with("window", "4294967295").ok());  // window + 1 wraps to 0
  EXPECT_FALSE(with("ring_slots", "4294967295").ok());
  EXPECT_FALSE(with("block_tokens", "4294967294").ok());
  ModelConfig c = DefaultModelConfig();
  c.encoder_layers = 4294967295u;
  c.decoder_layers = 9;
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_TRUE(with("attention_topk", "128").ok());  // indexer_block x candidate_blocks = 128
}

TEST(SafetensorsTest, RandomWeightsAreDeterministicAndLoad) {
  const std::string path = TempPath("tiny.safetensors");
  const SafetensorsFile file = RandomModelFile(TinyModelConfig(), 5);
  ASSERT_TRUE(WriteSafetensors(path, file).ok());
  Result<ModelWeights> w = LoadModel(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->config.d_model, 64u);
  EXPECT_EQ(w->layers.size(), 8u);
  EXPECT_EQ(w->embed, file.tensors.at("embed").data);
  const SafetensorsFile again = RandomModelFile(TinyModelConfig(), 5);
  EXPECT_EQ(again.tensors.at("layers.3.wq").data, file.tensors.at("layers.3.wq").data);
  EXPECT_NE(RandomModelFile(TinyModelConfig(), 6).tensors.at("layers.3.wq").data,
            file.tensors.at("layers.3.wq").data);
  std::remove(path.c_str());
}

// Writes a raw safetensors file with the given header JSON and data size.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, BadFilesNameTheTensor) {
  const std::string path = TempPath("bad.safetensors");
  SafetensorsFile file = RandomModelFile(TinyModelConfig(), 5);

  SafetensorsFile missing = file;
  missing.tensors.erase("layers.2.router");
  ASSERT_TRUE(WriteSafetensors(path, missing).ok());
  Result<ModelWeights> w = LoadModel(path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("'layers.2.router' is missing"), std::string::npos)
      << w.status().ToString();

  SafetensorsFile extra = file;
  extra.tensors["layers.2.bias"] = Tensor{"F32", {2}, {0, 0}};
  ASSERT_TRUE(WriteSafetensors(path, extra).ok());
  w = LoadModel(path);
  EXPECT_NE(w.status().message().find("unexpected tensor 'layers.2.bias'"), std::string::npos);

  SafetensorsFile shape = file;
  shape.tensors["lm_head"].shape = {64, 256};
  ASSERT_TRUE(WriteSafetensors(path, shape).ok());
  w = LoadModel(path);
  EXPECT_NE(w.status().message().find("'lm_head' has shape [64, 256], expected [256, 64]"),
            std::string::npos)
      << w.status().ToString();

  // A BF16 tensor (written by hand: the writer only writes F32).
  WriteRaw(path,
           R"({"__metadata__":{"format":"strata-mini-v41/1"},)"
           R"("embed":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
           4);
  Result<SafetensorsFile> raw = ReadSafetensors(path);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  raw->metadata = file.metadata;
  for (const auto& [name, t] : file.tensors) {
    if (name != "embed") raw->tensors[name] = t;
  }
  raw->tensors["embed"].shape = file.tensors.at("embed").shape;
  w = ModelFromFile(*raw);
  EXPECT_NE(w.status().message().find("'embed' has dtype BF16, expected F32"), std::string::npos)
      << w.status().ToString();

  WriteRaw(path, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(ReadSafetensors(path).status().message().find("'x'"), std::string::npos);
  WriteRaw(path, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16])", 16);
  EXPECT_FALSE(ReadSafetensors(path).ok());
  // A shape whose element count passes 2^64 is larger than any file (its
  // product must not wrap to 0 and pass as an empty tensor).
  WriteRaw(path, R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
           0);
  EXPECT_NE(ReadSafetensors(path).status().message().find("shape larger than the file"),
            std::string::npos)
      << ReadSafetensors(path).status().ToString();
  // A header of a million tiny values is refused while it is parsed.
  std::string many = R"({"x":[0)";
  for (int i = 0; i < (1 << 20); ++i) many += ",0";
  WriteRaw(path, many + "]}", 0);
  EXPECT_NE(ReadSafetensors(path).status().message().find("values"), std::string::npos)
      << ReadSafetensors(path).status().ToString();
  EXPECT_EQ(ReadSafetensors(TempPath("absent")).status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(TokenizerTest, BytesRoundTrip) {
  const std::string text = "héllo\n\x01\xff";
  const std::vector<uint32_t> ids = ByteTokenizer::Encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ByteTokenizer::Decode(ids), text);
}

TEST(WorkloadTest, FormatAndParseRoundTrip) {
  const std::vector<WorkloadItem> items = MakeSampleWorkload({});
  ASSERT_EQ(items.size(), 9u);
  Result<std::vector<WorkloadItem>> back = ParseWorkload(FormatWorkload(items));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ((*back)[i].text, items[i].text);
    EXPECT_EQ((*back)[i].conversation, items[i].conversation);
  }
  EXPECT_FALSE(ParseWorkload("prompt\t4\thi\n").ok());  // no version line
  EXPECT_FALSE(ParseWorkload("strata-workload 1\nprompt\t0\thi\n").ok());
  EXPECT_FALSE(ParseWorkload("strata-workload 1\nturn\tc\t4\n").ok());
  EXPECT_FALSE(ParseWorkload("strata-workload 1\nprompt\t4\tbad \\q\n").ok());
}

TEST(WorkloadTest, APromptThatWouldGrowPastTheLimitIsRefusedBeforeAnythingRuns) {
  EXPECT_TRUE(CheckWorkload(MakeSampleWorkload({})).ok());
  // Turn 2's prompt is turn 1's text, its 4096-token reply and turn 2's text.
  const std::string half(kMaxPromptTokens / 2, 'x');
  std::vector<WorkloadItem> items = {{"c", 4096, half}, {"c", 4, "more"}, {"", 4, "alone"}};
  EXPECT_TRUE(CheckWorkload({items[0], items[2]}).ok());
  items[1].text = half;
  const Status st = CheckWorkload(items);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("item 2 (conversation 'c'): its prompt would be 1052672 tokens"),
            std::string::npos)
      << st.ToString();
  EXPECT_FALSE(CheckWorkload({{"", 4, ""}}).ok());  // an empty prompt
}

TEST(BlockPoolTest, RefCountsReturnPages) {
  BlockPool pool(1024, 2);
  Result<uint32_t> a = pool.Allocate();
  Result<uint32_t> b = pool.Allocate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(pool.Allocate().status().code(), StatusCode::kResourceExhausted);
  pool.Ref(*a);
  pool.Unref(*a);
  EXPECT_EQ(pool.used_pages(), 2u);
  pool.Unref(*a);
  pool.Unref(*b);
  EXPECT_EQ(pool.used_pages(), 0u);
  EXPECT_EQ(pool.total_refs(), 0u);
  Result<uint32_t> c = pool.Allocate();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(pool.Page(*c)[10], std::byte{0});
  pool.Unref(*c);
}

}  // namespace
}  // namespace strata::worker

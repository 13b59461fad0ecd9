// strata-admin's --model forms name the model id strata-worker uses, and
// its tokens-file reader takes what it documents and nothing else.
#include <gtest/gtest.h>

#include <fstream>

#include "model_ref.h"
#include "strata/worker/engine.h"
#include "worker_test_util.h"

namespace strata::admin {
namespace {

ModelId WorkerModelId(const std::string& weights_revision) {
  worker::EngineOptions options = worker::testing::Options(nullptr);
  options.weights_revision = weights_revision;
  auto engine = worker::Engine::Create(worker::testing::TinyModel(), options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? (*engine)->model_id() : ModelId{};
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/admin-model-ref-" + name;
}

TEST(AdminModelRefTest, SeedFormMatchesTheWorkersRandomWeights) {
  Result<ModelId> id = ResolveModel("seed:1");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, WorkerModelId("random-seed-1"));
  EXPECT_NE(*id, WorkerModelId("random-seed-2"));
}

TEST(AdminModelRefTest, FileFormMatchesTheWorkersModelFile) {
  const std::string path = TempPath("weights.safetensors");
  std::ofstream(path) << "weights";
  Result<std::string> revision = WeightsRevisionOfFile(path);
  ASSERT_TRUE(revision.ok()) << revision.status().ToString();
  Result<ModelId> id = ResolveModel(path);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, WorkerModelId(*revision));
}

// The model id follows the weights, not the path: a file rewritten in place
// gets a new id, and the same bytes under another path the same one.
TEST(AdminModelRefTest, FileFormFollowsTheContentNotThePath) {
  const std::string path = TempPath("rewritten.safetensors");
  const std::string copy = TempPath("copy.safetensors");
  std::ofstream(path) << "weights v1";
  std::ofstream(copy) << "weights v1";
  Result<ModelId> first = ResolveModel(path);
  Result<ModelId> same_bytes = ResolveModel(copy);
  std::ofstream(path, std::ios::trunc) << "weights v2";
  Result<ModelId> rewritten = ResolveModel(path);
  ASSERT_TRUE(first.ok() && same_bytes.ok() && rewritten.ok());
  EXPECT_EQ(*first, *same_bytes);
  EXPECT_NE(*first, *rewritten);
  Result<std::string> revision = WeightsRevisionOfFile(path);
  ASSERT_TRUE(revision.ok());
  EXPECT_EQ(revision->size(), std::string("sha256:").size() + 32);
  EXPECT_EQ(WeightsRevisionOfFile(TempPath("missing")).status().code(), StatusCode::kNotFound);
}

TEST(AdminModelRefTest, HexIsTakenAsIsAndJunkIsRefused) {
  const ModelId worker = WorkerModelId("random-seed-7");
  Result<ModelId> id = ResolveModel(worker.ToHex());
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, worker);
  for (const char* bad : {"", "seed:", "seed:x", "abc", "/no/such/model/file"}) {
    Result<ModelId> r = ResolveModel(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(AdminModelRefTest, TokensFileAcceptsCommentsCommasAndNewlines) {
  const std::string path = TempPath("tokens.txt");
  std::ofstream(path) << "# prompt\n1 2,3\n\n4294967295\t5 # tail\n";
  Result<std::vector<uint32_t>> t = ReadTokensFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, (std::vector<uint32_t>{1, 2, 3, 4294967295u, 5}));
}

TEST(AdminModelRefTest, TokensFileRefusesWhatIsNotATokenId) {
  for (const char* text : {"1 2 x", "4294967296", "-1", "1.5", "12a"}) {
    const std::string path = TempPath("bad-tokens.txt");
    std::ofstream(path) << text << "\n";
    Result<std::vector<uint32_t>> t = ReadTokensFile(path);
    EXPECT_FALSE(t.ok()) << text;
    EXPECT_NE(t.status().message().find(":1:"), std::string::npos) << t.status().message();
  }
  EXPECT_FALSE(ReadTokensFile(TempPath("missing")).ok());
}

}  // namespace
}  // namespace strata::admin

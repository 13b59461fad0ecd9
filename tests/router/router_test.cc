// strata-router in front of two serving workers: real processes, HTTP from
// the test.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "strata/router/prefix_record.h"
#include "strata/router/routing_policy.h"
#include "temp_dir.h"
#include "worker_process.h"
#include "worker_test_util.h"

namespace strata::router {
namespace {

using strata::testing::Get;
using strata::testing::HttpResult;
using strata::testing::Json;
using strata::testing::MetricValue;
using strata::testing::Post;
using strata::testing::ScopedTempDir;
using strata::testing::WorkerProcess;
using strata::worker::testing::Tokens;

TEST(RoutingPolicyTest, CacheAwareWeighsTheCachedPrefixAgainstQueuedWork) {
  auto policy = MakeRoutingPolicy("cache_aware");
  ASSERT_TRUE(policy.ok());
  std::vector<WorkerView> w(2);
  w[1].cached_tokens = 1024;
  EXPECT_EQ((*policy)->Pick({1200, ""}, w, {}), 1u);  // it holds the prefix
  w[1].queued_tokens = 4000;                          // ...but is far behind
  EXPECT_EQ((*policy)->Pick({1200, ""}, w, {}), 0u);
  w[0].healthy = false;
  EXPECT_EQ((*policy)->Pick({1200, ""}, w, {}), 1u);
  EXPECT_FALSE((*policy)->Pick({1200, ""}, w, {false, true}).has_value());
  EXPECT_FALSE(MakeRoutingPolicy("random").ok());

  PrefixRecord record(256, 4);
  const std::vector<uint32_t> prompt = Tokens(1100, 1);
  const std::vector<uint64_t> hashes = record.BlockHashes(prompt);
  ASSERT_EQ(hashes.size(), 4u);
  record.Record(hashes, 1);
  EXPECT_EQ(record.CachedTokens(hashes, 1), 1024u);
  EXPECT_EQ(record.CachedTokens(hashes, 0), 0u);
  record.Record(record.BlockHashes(Tokens(300, 2)), 0);  // over capacity: the deepest go first
  EXPECT_EQ(record.CachedTokens(hashes, 1), 768u);
}

class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      std::string error;
      workers_.push_back(WorkerProcess::Start(Log("worker"), {"--store", "none"}, &error));
      ASSERT_NE(workers_.back(), nullptr) << error;
    }
  }
  std::unique_ptr<WorkerProcess> StartRouter(const std::string& policy) {
    std::string error;
    auto r =
        WorkerProcess::StartCommand({STRATA_ROUTER_BINARY, "--listen", "127.0.0.1:0", "--workers",
                                     Endpoint(0) + "," + Endpoint(1), "--policy", policy},
                                    Log("router"), &error);
    EXPECT_NE(r, nullptr) << error;
    return r;
  }
  std::string Endpoint(int i) const { return "127.0.0.1:" + std::to_string(workers_[i]->port()); }
  std::string Log(const std::string& what) {
    return dir_.path() + "/" + what + "-" + std::to_string(++logs_) + ".log";
  }
  double Completions(int i) const {
    return MetricValue(Get(workers_[i]->port(), "/metrics").body,
                       R"(strata_worker_http_requests_total{route="/v1/completions",code="200"})");
  }

  ScopedTempDir dir_{"strata-router-test"};
  int logs_ = 0;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
};

TEST_F(RouterTest, RoundRobinSpreadsRequestsAndStreamsAnswersAsTheWorkerWould) {
  auto router = StartRouter("round_robin");
  ASSERT_NE(router, nullptr);
  const Json body = {{"prompt", "route me"}, {"max_tokens", 6}, {"seed", 3}};
  const HttpResult direct = Post(workers_[0]->port(), body);
  ASSERT_EQ(direct.status, 200);
  const Json expected = Json::parse(direct.body).at("choices")[0].at("token_ids");
  for (int i = 0; i < 6; ++i) {
    Json b = body;
    b["stream"] = i % 2 == 1;
    const HttpResult r = Post(router->port(), b);
    ASSERT_EQ(r.status, 200) << r.body;
    if (i % 2 == 0) {
      EXPECT_EQ(Json::parse(r.body).at("choices")[0].at("token_ids"), expected);
    } else {
      std::vector<uint32_t> ids;
      for (const Json& e : r.events) {
        if (e.is_object() && e.contains("choices") && !e.at("choices").empty()) {
          ids.push_back(e.at("choices")[0].at("token_ids")[0]);
        }
      }
      EXPECT_EQ(Json(ids), expected);
      EXPECT_EQ(r.events.back(), "[DONE]");
    }
  }
  EXPECT_EQ(Completions(0), 1 + 3);
  EXPECT_EQ(Completions(1), 3);
  EXPECT_EQ(Get(router->port(), "/healthz").status, 200);
  EXPECT_EQ(Json::parse(Get(router->port(), "/v1/models").body).at("data")[0].at("id"),
            "strata-mini");
}

TEST_F(RouterTest, UnderCacheAwareAConversationsLaterTurnsFollowItsCache) {
  auto router = StartRouter("cache_aware");
  ASSERT_NE(router, nullptr);
  for (uint32_t conv = 0; conv < 2; ++conv) {
    std::vector<uint32_t> prompt = Tokens(700, 10 + conv);
    for (int turn = 0; turn < 3; ++turn) {
      const HttpResult r = Post(router->port(), {{"prompt", prompt}, {"max_tokens", 4}});
      ASSERT_EQ(r.status, 200) << r.body;
      const Json answer = Json::parse(r.body);
      if (turn > 0) {
        EXPECT_GT(answer.at("usage").at("strata").at("hbm_hit_tokens"), 0)
            << "conversation " << conv << " turn " << turn << ": " << answer.dump();
      }
      for (uint32_t id : answer.at("choices")[0].at("token_ids")) prompt.push_back(id);
      const std::vector<uint32_t> more = Tokens(200, 100 * conv + turn);
      prompt.insert(prompt.end(), more.begin(), more.end());
    }
  }
}

TEST_F(RouterTest, BadInputGetsTheWorkersAnswerUnchanged) {
  auto router = StartRouter("cache_aware");
  ASSERT_NE(router, nullptr);
  for (const std::string& body :
       {std::string("{\"prompt\": \"x\", \"max_tokens\": 0}"), std::string("{\"prompt\": [999]}"),
        std::string("not json"), std::string("{\"prompt\": \"x\", \"model\": \"other\"}")}) {
    const HttpResult direct =
        strata::testing::Exchange(workers_[0]->port(), "POST", "/v1/completions", body);
    const HttpResult routed =
        strata::testing::Exchange(router->port(), "POST", "/v1/completions", body);
    EXPECT_EQ(routed.status, direct.status) << body;
    EXPECT_EQ(routed.body, direct.body) << body;
  }
  EXPECT_EQ(Get(router->port(), "/nope").status, 404);
}

TEST_F(RouterTest, AWorkerThatIsDownIsPassedOver) {
  auto router = StartRouter("round_robin");
  ASSERT_NE(router, nullptr);
  workers_[1]->Kill();
  for (int i = 0; i < 4; ++i) {  // before and after the health check notices
    const HttpResult r = Post(router->port(), {{"prompt", "still here"}, {"max_tokens", 2}});
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(Completions(0), 4);
  workers_[0]->Kill();
  const HttpResult none = Post(router->port(), {{"prompt", "anyone?"}, {"max_tokens", 2}});
  EXPECT_EQ(none.status, 503) << none.body;
}

}  // namespace
}  // namespace strata::router

// strata-worker serve, as a client sees it: real processes (a worker, and a
// node where the store matters), HTTP from the test.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "node_process.h"
#include "strata/worker/engine.h"
#include "strata/worker/model.h"
#include "strata/worker/safetensors.h"
#include "temp_dir.h"
#include "worker_process.h"
#include "worker_test_util.h"

namespace strata::worker {
namespace {

using strata::testing::Get;
using strata::testing::HttpResult;
using strata::testing::Json;
using strata::testing::MetricValue;
using strata::testing::NodeProcess;
using strata::testing::Post;
using strata::testing::ScopedTempDir;
using strata::testing::WorkerProcess;

// The default model shape (its decode is slow enough for a request to be
// caught running), made once per test binary.
const std::string& ModelPath() {
  static const ScopedTempDir* dir = new ScopedTempDir("strata-serve-model");
  static const std::string path = [] {
    const std::string p = dir->path() + "/model.safetensors";
    EXPECT_TRUE(WriteSafetensors(p, RandomModelFile(DefaultModelConfig(), 5)).ok());
    return p;
  }();
  return path;
}

// What the batch runner's engine generates for `prompt` (no store).
std::vector<uint32_t> BatchOutput(const std::vector<uint32_t>& prompt, uint32_t max_tokens,
                                  SamplingParams sampling) {
  static const ModelWeights* model = new ModelWeights(LoadModel(ModelPath()).value());
  EngineOptions o;
  o.weights_revision = "batch";
  auto engine = Engine::Create(*model, o);
  EXPECT_TRUE(engine.ok());
  Request r;
  r.id = 1;
  r.prompt = prompt;
  r.max_new_tokens = max_tokens;
  r.sampling = sampling;
  EXPECT_TRUE((*engine)->AddRequest(r).ok());
  std::vector<uint32_t> out;
  for (const StepOutput& s : (*engine)->Drain()) {
    out.insert(out.end(), s.new_tokens.begin(), s.new_tokens.end());
  }
  return out;
}

std::vector<uint32_t> Ids(const Json& choice) { return choice.at("token_ids"); }

// The token ids of a streamed answer, checking its shape on the way.
std::vector<uint32_t> StreamedIds(const HttpResult& r, std::string* text = nullptr) {
  std::vector<uint32_t> ids;
  for (const Json& e : r.events) {
    if (!e.is_object() || !e.contains("choices") || e.at("choices").empty()) continue;
    const Json& c = e.at("choices")[0];
    for (uint32_t id : Ids(c)) ids.push_back(id);
    if (text != nullptr) *text += c.at("text").get<std::string>();
  }
  return ids;
}

std::vector<uint32_t> Prompt(size_t n, uint32_t seed) { return testing::Tokens(n, seed); }

class ServeTest : public ::testing::Test {
 protected:
  std::unique_ptr<WorkerProcess> StartWorker(std::vector<std::string> flags) {
    flags.insert(flags.end(), {"--model", ModelPath()});
    std::string error;
    auto w = WorkerProcess::Start(dir_.path() + "/worker-" + std::to_string(++workers_) + ".log",
                                  flags, &error);
    EXPECT_NE(w, nullptr) << error;
    return w;
  }
  std::unique_ptr<NodeProcess> StartNode() {
    std::string error;
    auto n = NodeProcess::Start(dir_.path(), {}, &error);
    EXPECT_NE(n, nullptr) << error;
    return n;
  }
  // Polls `port`'s /metrics until `series` reads `value` (10 s at most).
  static bool MetricReaches(int port, const std::string& series, double value) {
    for (int i = 0; i < 500; ++i) {
      if (MetricValue(Get(port, "/metrics").body, series) == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  ScopedTempDir dir_{"strata-serve-test"};
  int workers_ = 0;
};

TEST_F(ServeTest, StreamedAndWholeAnswersEqualTheBatchRunnersOutput) {
  auto worker = StartWorker({});
  ASSERT_NE(worker, nullptr);
  const std::string text = "The quick brown fox jumps over the lazy dog. ";
  const std::vector<uint32_t> text_ids(text.begin(), text.end());
  const std::vector<uint32_t> ids = Prompt(300, 3);
  for (const auto& [prompt, as_text] : {std::pair{text_ids, true}, std::pair{ids, false}}) {
    for (const float temperature : {0.0f, 0.9f}) {
      const SamplingParams sampling{temperature, 42};
      const std::vector<uint32_t> expected = BatchOutput(prompt, 24, sampling);
      Json body = {{"prompt", as_text ? Json(text) : Json(prompt)},
                   {"max_tokens", 24},
                   {"temperature", temperature},
                   {"seed", 42},
                   {"model", "strata-mini"}};
      const HttpResult whole = Post(worker->port(), body);
      ASSERT_EQ(whole.status, 200) << whole.body;
      const Json answer = Json::parse(whole.body);
      EXPECT_EQ(Ids(answer.at("choices")[0]), expected);
      EXPECT_EQ(answer.at("usage").at("prompt_tokens"), prompt.size());
      EXPECT_EQ(answer.at("usage").at("completion_tokens"), 24);
      EXPECT_EQ(answer.at("choices")[0].at("finish_reason"), "length");

      body["stream"] = true;
      const HttpResult streamed = Post(worker->port(), body);
      ASSERT_EQ(streamed.status, 200) << streamed.head;
      std::string streamed_text;
      EXPECT_EQ(StreamedIds(streamed, &streamed_text), expected);
      EXPECT_EQ(streamed_text, answer.at("choices")[0].at("text").get<std::string>());
      ASSERT_GE(streamed.events.size(), 26u);  // a token each, usage, [DONE]
      EXPECT_EQ(streamed.events.back(), "[DONE]");
      EXPECT_EQ(streamed.events[streamed.events.size() - 2].at("usage").at("completion_tokens"),
                24);
    }
  }
  const Json models = Json::parse(Get(worker->port(), "/v1/models").body);
  EXPECT_EQ(models.at("data")[0].at("id"), "strata-mini");
  EXPECT_EQ(models.at("data")[0].at("fingerprint").get<std::string>().size(), 32u);
  EXPECT_EQ(Get(worker->port(), "/healthz").body, "ok\n");
  const std::string metrics = Get(worker->port(), "/metrics").body;
  EXPECT_EQ(MetricValue(metrics,
                        R"(strata_worker_http_requests_total{route="/v1/completions",code="200"})"),
            8);
  EXPECT_EQ(MetricValue(metrics, R"(strata_worker_requests_total{outcome="finished"})"), 8)
      << metrics;
}

TEST_F(ServeTest, BadInputGetsA4xxWithAJsonErrorNamingTheField) {
  auto worker = StartWorker({"--max-tokens-limit", "100", "--max-prompt-tokens", "1000"});
  ASSERT_NE(worker, nullptr);
  struct Case {
    std::string body;
    int status;
    std::string param;  // "" : null
  };
  const std::vector<Case> cases = {
      {"{\"prompt\": \"hi\"", 400, ""},
      {"[1, 2]", 400, ""},
      {"{\"max_tokens\": 3}", 400, "prompt"},
      {"{\"prompt\": \"\"}", 400, "prompt"},
      {"{\"prompt\": []}", 400, "prompt"},
      {"{\"prompt\": \"" + std::string(1001, 'a') + "\"}", 400, "prompt"},
      {"{\"prompt\": [1, 256]}", 400, "prompt"},
      {"{\"prompt\": [1, -1]}", 400, "prompt"},
      {"{\"prompt\": [1, 2.5]}", 400, "prompt"},
      {"{\"prompt\": [\"a\", \"b\"]}", 400, "prompt"},
      {"{\"prompt\": 7}", 400, "prompt"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "max_tokens"},
      {"{\"prompt\": \"hi\", \"max_tokens\": -5}", 400, "max_tokens"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 101}", 400, "max_tokens"},
      {"{\"prompt\": \"hi\", \"max_tokens\": \"10\"}", 400, "max_tokens"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 99999999999999999999999}", 400, "max_tokens"},
      {"{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "temperature"},
      {"{\"prompt\": \"hi\", \"temperature\": 5}", 400, "temperature"},
      {"{\"prompt\": \"hi\", \"seed\": 1.5}", 400, "seed"},
      {"{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "stream"},
      {"{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": 1}}", 400,
       "stream_options.include_usage"},
      {"{\"prompt\": \"hi\", \"session_id\": 12}", 400, "session_id"},
      {"{\"prompt\": \"hi\", \"n\": 2}", 400, "n"},
      {"{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", 404, "model"},
  };
  for (const Case& c : cases) {
    const HttpResult r =
        strata::testing::Exchange(worker->port(), "POST", "/v1/completions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    const Json error = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << r.body;
    EXPECT_EQ(error.at("error").at("code"), c.status) << r.body;
    EXPECT_EQ(error.at("error").at("param"), c.param.empty() ? Json(nullptr) : Json(c.param))
        << c.body << " -> " << r.body;
  }
  // Deep nesting and unknown fields are no trouble; a body past the bound
  // is refused before it is read.
  const std::string deep =
      "{\"prompt\": \"hi\", \"max_tokens\": 1, \"x\": " + std::string(100000, '[') +
      std::string(100000, ']') + "}";
  EXPECT_EQ(strata::testing::Exchange(worker->port(), "POST", "/v1/completions", deep).status, 200);
  const std::string huge = strata::testing::RawExchange(
      worker->port(), "POST /v1/completions HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n{");
  EXPECT_EQ(huge.rfind("HTTP/1.1 413", 0), 0u) << huge;
  EXPECT_EQ(strata::testing::Exchange(worker->port(), "GET", "/v1/completions", "").status, 405);
  EXPECT_EQ(strata::testing::Exchange(worker->port(), "POST", "/v1/models", "{}").status, 405);
  EXPECT_EQ(Get(worker->port(), "/nope").status, 404);
  EXPECT_EQ(Get(worker->port(), "/healthz").body, "ok\n");  // still serving
}

TEST_F(ServeTest, PastTheInFlightBoundA429WithRetryAfterAndADisconnectEndsTheRequest) {
  auto worker = StartWorker({"--max-running", "1", "--max-queue", "1"});
  ASSERT_NE(worker, nullptr);
  const Json long_body = {{"prompt", "a long one"}, {"max_tokens", 4000}, {"stream", true}};
  std::atomic<bool> hang_up{false};
  std::vector<std::thread> clients;
  std::vector<HttpResult> results(2);
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      results[i] = Post(worker->port(), long_body, [&](const Json&) { return !hang_up.load(); });
    });
  }
  ASSERT_TRUE(MetricReaches(worker->port(), "strata_worker_http_in_flight", 2));
  const HttpResult refused = Post(worker->port(), {{"prompt", "one more"}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.head.find("Retry-After: 1"), std::string::npos) << refused.head;
  hang_up = true;
  for (std::thread& t : clients) t.join();
  for (const HttpResult& r : results) {
    EXPECT_TRUE(r.disconnected);
    EXPECT_LT(StreamedIds(r).size(), 4000u);
  }
  ASSERT_TRUE(MetricReaches(worker->port(), "strata_worker_http_in_flight", 0));
  EXPECT_TRUE(MetricReaches(worker->port(), "strata_worker_pool_pages_held", 0));
  EXPECT_EQ(MetricValue(Get(worker->port(), "/metrics").body,
                        R"(strata_worker_http_cancelled_total{reason="client_gone"})"),
            2);
  EXPECT_EQ(Post(worker->port(), {{"prompt", "now"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ServeTest, ADisconnectMidStreamLetsGoOfEveryPageAndLease) {
  auto node = StartNode();
  ASSERT_NE(node, nullptr);
  // No HBM tier: the prefix is fetched from the node, under a lease.
  auto worker =
      StartWorker({"--store", node->uri(), "--token", std::string(strata::testing::kTokenA.token),
                   "--hbm-cache-policy", "off"});
  ASSERT_NE(worker, nullptr);
  const std::vector<uint32_t> prompt = Prompt(1100, 9);
  ASSERT_EQ(Post(worker->port(), {{"prompt", prompt}, {"max_tokens", 2}}).status, 200);
  // The same prefix again, fetched from the node, then a hang-up mid-stream.
  std::vector<uint32_t> longer = prompt;
  longer.push_back(7);
  int events = 0;
  const HttpResult r =
      Post(worker->port(), {{"prompt", longer}, {"max_tokens", 4000}, {"stream", true}},
           [&](const Json&) { return ++events < 3; });
  EXPECT_TRUE(r.disconnected);
  ASSERT_TRUE(MetricReaches(worker->port(), "strata_worker_http_in_flight", 0));
  EXPECT_TRUE(MetricReaches(worker->port(), "strata_worker_pool_pages_held", 0));
  EXPECT_TRUE(MetricReaches(node->http_port(), R"(strata_leases_live{type="read"})", 0));
  EXPECT_TRUE(MetricReaches(node->http_port(), R"(strata_leases_live{type="write"})", 0));
  // The store still serves that prefix.
  const HttpResult again = Post(worker->port(), {{"prompt", longer}, {"max_tokens", 2}});
  ASSERT_EQ(again.status, 200);
  EXPECT_GE(Json::parse(again.body).at("usage").at("strata").at("store_hit_tokens"), 768);
}

// A conversation's second turn on the same worker finds its prefix in the
// HBM tier: no store match, and the output of a cold run.
TEST_F(ServeTest, ASecondTurnHitsTheHbmTierAndEqualsAColdRun) {
  auto node = StartNode();
  ASSERT_NE(node, nullptr);
  auto worker =
      StartWorker({"--store", node->uri(), "--token", std::string(strata::testing::kTokenA.token)});
  ASSERT_NE(worker, nullptr);
  std::vector<uint32_t> turn = Prompt(1100, 31);
  const HttpResult first =
      Post(worker->port(), {{"prompt", turn}, {"max_tokens", 16}, {"session_id", "conv-1"}});
  ASSERT_EQ(first.status, 200) << first.body;
  const std::vector<uint32_t> reply = Ids(Json::parse(first.body).at("choices")[0]);
  turn.insert(turn.end(), reply.begin(), reply.end());
  const std::vector<uint32_t> more = Prompt(200, 32);
  turn.insert(turn.end(), more.begin(), more.end());
  const double matches =
      MetricValue(Get(node->http_port(), "/metrics").body, "strata_match_requests_total");
  ASSERT_GE(matches, 1);
  const HttpResult second =
      Post(worker->port(),
           {{"prompt", turn}, {"max_tokens", 16}, {"stream", true}, {"session_id", "conv-1"}});
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(StreamedIds(second), BatchOutput(turn, 16, {}));
  const Json usage = second.events[second.events.size() - 2].at("usage");
  EXPECT_EQ(usage.at("strata").at("hbm_hit_tokens"), 1024) << usage.dump();
  EXPECT_EQ(usage.at("strata").at("store_hit_tokens"), 0);
  EXPECT_EQ(usage.at("prompt_tokens_details").at("cached_tokens"), 1024);
  EXPECT_EQ(MetricValue(Get(node->http_port(), "/metrics").body, "strata_match_requests_total"),
            matches);
  const std::string metrics = Get(worker->port(), "/metrics").body;
  EXPECT_EQ(MetricValue(metrics, R"(strata_worker_tier_hit_tokens_total{tier="hbm"})"), 1024);
  EXPECT_GT(MetricValue(metrics, "strata_worker_hbm_cached_pages"), 0);
  EXPECT_EQ(MetricValue(metrics, "strata_worker_pool_pages_held"), 0);
  EXPECT_EQ(MetricValue(metrics, R"(strata_worker_session_requests_total{prefix="hbm"})"), 1);
}

TEST_F(ServeTest, SigtermDrainsRunningRequestsRefusesNewOnesAndExitsZero) {
  auto worker = StartWorker({"--drain-grace", "300"});  // sanitizer builds are slow
  ASSERT_NE(worker, nullptr);
  std::vector<std::thread> clients;
  std::vector<HttpResult> results(2);
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      bool counted = false;
      results[i] =
          Post(worker->port(),
               {{"prompt", "drain " + std::to_string(i)}, {"max_tokens", 200}, {"stream", true}},
               [&](const Json&) {
                 if (!counted) ++started;
                 counted = true;
                 return true;
               });
    });
  }
  for (int i = 0; i < 500 && started.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(started.load(), 2);
  worker->SendSigterm();
  HttpResult health;
  for (int i = 0; i < 500; ++i) {
    health = Get(worker->port(), "/healthz");
    if (health.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, "draining\n");
  const HttpResult refused = Post(worker->port(), {{"prompt", "late"}});
  EXPECT_EQ(refused.status, 503) << refused.body;
  for (std::thread& t : clients) t.join();
  for (const HttpResult& r : results) {
    EXPECT_EQ(StreamedIds(r).size(), 200u);
    ASSERT_FALSE(r.events.empty());
    EXPECT_EQ(r.events.back(), "[DONE]");
  }
  EXPECT_EQ(worker->WaitExit(std::chrono::seconds(60)), 0) << worker->Log();
}

TEST_F(ServeTest, ARequestPastItsDeadlineIsAbortedWithAnError) {
  auto worker = StartWorker({"--request-timeout", "0.3"});
  ASSERT_NE(worker, nullptr);
  const HttpResult whole = Post(worker->port(), {{"prompt", "slow"}, {"max_tokens", 4000}});
  EXPECT_EQ(whole.status, 504) << whole.body;
  const HttpResult streamed =
      Post(worker->port(), {{"prompt", "slow"}, {"max_tokens", 4000}, {"stream", true}});
  EXPECT_EQ(streamed.status, 200);
  ASSERT_FALSE(streamed.events.empty());
  EXPECT_EQ(streamed.events.back().at("error").at("code"), 504) << streamed.body;
  EXPECT_LT(StreamedIds(streamed).size(), 4000u);
  ASSERT_TRUE(MetricReaches(worker->port(), "strata_worker_http_in_flight", 0));
  EXPECT_TRUE(MetricReaches(worker->port(), "strata_worker_pool_pages_held", 0));
  EXPECT_EQ(MetricValue(Get(worker->port(), "/metrics").body,
                        R"(strata_worker_http_cancelled_total{reason="deadline"})"),
            2);
}

TEST_F(ServeTest, RequestsCompleteByRecomputationWhenTheNodeIsKilledUnderThem) {
  auto node = StartNode();
  ASSERT_NE(node, nullptr);
  auto worker =
      StartWorker({"--store", node->uri(), "--token", std::string(strata::testing::kTokenA.token)});
  ASSERT_NE(worker, nullptr);
  const std::vector<uint32_t> prefix = Prompt(1024, 21);
  ASSERT_EQ(Post(worker->port(), {{"prompt", prefix}, {"max_tokens", 1}}).status, 200);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 4; ++i) {
    std::vector<uint32_t> p = prefix;
    const std::vector<uint32_t> tail = Prompt(300, 100 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  std::vector<HttpResult> results(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      results[i] = Post(worker->port(), {{"prompt", prompts[i]}, {"max_tokens", 40}});
    });
  }
  node->Kill();
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(results[i].status, 200) << results[i].body;
    EXPECT_EQ(Ids(Json::parse(results[i].body).at("choices")[0]), BatchOutput(prompts[i], 40, {}))
        << i;
  }
}

}  // namespace
}  // namespace strata::worker

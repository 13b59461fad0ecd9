#include "strata/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(MetricsTest, CounterAndGaugeArithmetic) {
  MetricsRegistry reg;
  Counter* c = reg.GetCounter("c_total", "help");
  EXPECT_EQ(c->Value(), 0u);
  c->Increment();
  c->Increment(41);
  EXPECT_EQ(c->Value(), 42u);

  Gauge* g = reg.GetGauge("g", "help");
  EXPECT_EQ(g->Value(), 0);
  g->Set(10);
  g->Add(-15);
  EXPECT_EQ(g->Value(), -5);
  g->Add(7);
  EXPECT_EQ(g->Value(), 2);
  g->Set(-100);
  EXPECT_EQ(g->Value(), -100);
}

TEST(MetricsTest, SameNameAndLabelsReturnSameObject) {
  MetricsRegistry reg;
  Counter* a = reg.GetCounter("req_total", "h", {{"op", "get"}, {"shard", "1"}});
  EXPECT_EQ(a, reg.GetCounter("req_total", "other help", {{"op", "get"}, {"shard", "1"}}));
  // Label order does not define identity.
  EXPECT_EQ(a, reg.GetCounter("req_total", "h", {{"shard", "1"}, {"op", "get"}}));
  Counter* b = reg.GetCounter("req_total", "h", {{"op", "put"}, {"shard", "1"}});
  EXPECT_NE(a, b);
  EXPECT_NE(a, reg.GetCounter("req_total", "h"));
  a->Increment(5);
  EXPECT_EQ(b->Value(), 0u);

  Gauge* g = reg.GetGauge("g", "h");
  EXPECT_EQ(g, reg.GetGauge("g", "h"));
  Histogram* h = reg.GetHistogram("lat", "h", {1, 2});
  EXPECT_EQ(h, reg.GetHistogram("lat", "h", {1, 2}));
  EXPECT_EQ(h, reg.GetHistogram("lat", "h", {1, 2, std::numeric_limits<double>::infinity()}));
  EXPECT_NE(h, reg.GetHistogram("lat", "h", {1, 2}, {{"op", "x"}}));
}

TEST(MetricsTest, PointersStayValidAcrossManyRegistrations) {
  MetricsRegistry reg;
  Counter* first = reg.GetCounter("c_total", "h", {{"i", "0"}});
  first->Increment(7);
  for (int i = 1; i < 1000; ++i) reg.GetCounter("c_total", "h", {{"i", std::to_string(i)}});
  EXPECT_EQ(first, reg.GetCounter("c_total", "h", {{"i", "0"}}));
  EXPECT_EQ(first->Value(), 7u);
}

TEST(MetricsTest, HistogramBucketEdgesUseLeSemantics) {
  Histogram h({1, 2, 5});
  ASSERT_EQ(h.Bounds(), (std::vector<double>{1, 2, 5}));
  h.Observe(-3);         // bucket le=1
  h.Observe(0);          // le=1
  h.Observe(1);          // equal to a bound: le=1
  h.Observe(1.0000001);  // le=2
  h.Observe(2);          // le=2
  h.Observe(5);          // le=5
  h.Observe(5.5);        // +Inf
  EXPECT_EQ(h.BucketCounts(), (std::vector<uint64_t>{3, 2, 1, 1}));
  EXPECT_EQ(h.Count(), 7u);
  EXPECT_DOUBLE_EQ(h.Sum(), -3 + 0 + 1 + 1.0000001 + 2 + 5 + 5.5);
}

TEST(MetricsTest, HistogramNanGoesToInfBucket) {
  Histogram h({1});
  h.Observe(std::nan(""));
  EXPECT_EQ(h.BucketCounts(), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(std::isnan(h.Sum()));
}

TEST(MetricsTest, RendersExactText) {
  MetricsRegistry reg;
  // Registered out of name order to check family sorting.
  reg.GetCounter("strata_requests_total", "Requests served.", {{"op", "get"}})->Increment(3);
  reg.GetGauge("strata_bytes", "Bytes stored.")->Set(-42);
  Histogram* h =
      reg.GetHistogram("strata_latency_seconds", "Latency.", {0.005, 0.5, 1}, {{"op", "get"}});
  reg.GetCounter("strata_requests_total", "ignored", {{"op", "put"}})->Increment();
  h->Observe(0.25);
  h->Observe(0.5);
  h->Observe(1);
  h->Observe(3);

  const std::string expected =
      "# HELP strata_bytes Bytes stored.\n"
      "# TYPE strata_bytes gauge\n"
      "strata_bytes -42\n"
      "# HELP strata_latency_seconds Latency.\n"
      "# TYPE strata_latency_seconds histogram\n"
      "strata_latency_seconds_bucket{op=\"get\",le=\"0.005\"} 0\n"
      "strata_latency_seconds_bucket{op=\"get\",le=\"0.5\"} 2\n"
      "strata_latency_seconds_bucket{op=\"get\",le=\"1\"} 3\n"
      "strata_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
      "strata_latency_seconds_sum{op=\"get\"} 4.75\n"
      "strata_latency_seconds_count{op=\"get\"} 4\n"
      "# HELP strata_requests_total Requests served.\n"
      "# TYPE strata_requests_total counter\n"
      "strata_requests_total{op=\"get\"} 3\n"
      "strata_requests_total{op=\"put\"} 1\n";
  EXPECT_EQ(reg.RenderPrometheus(), expected);
}

TEST(MetricsTest, RendersUnlabeledHistogramAndBoundFormats) {
  MetricsRegistry reg;
  Histogram* h = reg.GetHistogram("h", "x", {0.001, 0.25, 1000000, 1e20});
  h->Observe(2e20);
  const std::string expected =
      "# HELP h x\n"
      "# TYPE h histogram\n"
      "h_bucket{le=\"0.001\"} 0\n"
      "h_bucket{le=\"0.25\"} 0\n"
      "h_bucket{le=\"1000000\"} 0\n"
      "h_bucket{le=\"1e+20\"} 0\n"
      "h_bucket{le=\"+Inf\"} 1\n"
      "h_sum 2e+20\n"
      "h_count 1\n";
  EXPECT_EQ(reg.RenderPrometheus(), expected);
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry reg;
  reg.GetGauge("g", "line1\nback\\slash \"quoted\"", {{"path", "a\\b\"c\nd"}, {"k", "plain"}})
      ->Set(1);
  const std::string expected =
      "# HELP g line1\\nback\\\\slash \"quoted\"\n"
      "# TYPE g gauge\n"
      "g{path=\"a\\\\b\\\"c\\nd\",k=\"plain\"} 1\n";
  EXPECT_EQ(reg.RenderPrometheus(), expected);
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  constexpr int kThreads = 4;
  constexpr int kIters = 100000;
  MetricsRegistry reg;
  Counter* c = reg.GetCounter("c_total", "h");
  Gauge* g = reg.GetGauge("g", "h");
  Histogram* h = reg.GetHistogram("h", "h", {0.5, 1.5});
  std::atomic<bool> done{false};
  // Rendering concurrently with updates must be safe (checked under TSan).
  std::thread renderer([&] {
    while (!done.load()) EXPECT_FALSE(reg.RenderPrometheus().empty());
  });
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* mine = reg.GetCounter("per_thread_total", "h", {{"t", std::to_string(t)}});
      for (int i = 0; i < kIters; ++i) {
        c->Increment();
        g->Add(t % 2 == 0 ? 2 : -1);
        h->Observe(1.0);
        mine->Increment();
      }
    });
  }
  for (auto& t : threads) t.join();
  done.store(true);
  renderer.join();
  EXPECT_EQ(c->Value(), uint64_t{kThreads} * kIters);
  EXPECT_EQ(g->Value(), int64_t{kIters} * (2 + 2 - 1 - 1));
  EXPECT_EQ(h->Count(), uint64_t{kThreads} * kIters);
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{0, uint64_t{kThreads} * kIters, 0}));
  EXPECT_DOUBLE_EQ(h->Sum(), double{kThreads} * kIters);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(reg.GetCounter("per_thread_total", "h", {{"t", std::to_string(t)}})->Value(),
              uint64_t{kIters});
  }
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(MetricsRegistry::ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(MetricsRegistry::ExponentialBuckets(0.5, 4, 1), (std::vector<double>{0.5}));
  const std::vector<double> b = MetricsRegistry::ExponentialBuckets(0.001, 10, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_DOUBLE_EQ(b[0], 0.001);
  EXPECT_DOUBLE_EQ(b[1], 0.01);
  EXPECT_DOUBLE_EQ(b[2], 0.1);
}

TEST(MetricsDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  MetricsRegistry reg;
  reg.GetCounter("x_total", "h");
  reg.GetHistogram("lat", "h", {1, 2});
  EXPECT_DEATH(reg.GetGauge("x_total", "h"), "different type");
  EXPECT_DEATH(reg.GetHistogram("lat", "h", {1, 3}), "different bounds");
  EXPECT_DEATH(reg.GetCounter("1bad", "h"), "invalid metric name");
  EXPECT_DEATH(reg.GetCounter("bad-name", "h"), "invalid metric name");
  EXPECT_DEATH(reg.GetCounter("ok:name", "h", {{"a:b", "v"}}), "invalid label name");
  EXPECT_DEATH(reg.GetCounter("ok", "h", {{"a", "1"}, {"a", "2"}}), "duplicate label name");
  EXPECT_DEATH(reg.GetHistogram("h2", "h", {1}, {{"le", "1"}}), "reserved label name");
  EXPECT_DEATH(reg.GetHistogram("h3", "h", {2, 1}), "strictly increasing");
  EXPECT_DEATH(MetricsRegistry::ExponentialBuckets(1, 2, 0), "ExponentialBuckets");
}

}  // namespace
}  // namespace strata

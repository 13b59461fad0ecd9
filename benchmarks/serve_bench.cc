#include "serve_bench.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "bench_util.h"
#include "node_process.h"
#include "strata/trace/trace_generator.h"
#include "temp_dir.h"
#include "worker_process.h"

namespace strata::bench {
namespace {

using testing::NodeProcess;
using testing::WorkerProcess;

Result<std::vector<trace::TraceRequest>> LoadTrace(const ServeBenchOptions& o) {
  if (!o.trace_path.empty()) return trace::ReadTrace(o.trace_path);
  Result<trace::TraceGeneratorOptions> g = trace::TraceGeneratorOptions::Preset(o.preset);
  if (!g.ok()) return g.status();
  g->conversations = o.conversations;
  if (o.mean_turns > 0) g->mean_turns = o.mean_turns;
  g->seed = o.load.seed;
  return trace::GenerateTrace(*g);
}

// The two configurations compared: a worker with the HBM tier over a node,
// and the same worker with caching off.
struct Deployment {
  std::unique_ptr<NodeProcess> node;
  std::unique_ptr<WorkerProcess> worker;
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(worker->port()); }
};

Result<Deployment> Deploy(const std::string& dir, bool caching, uint32_t pool_pages) {
  static int n = 0;
  Deployment d;
  std::string error;
  std::vector<std::string> flags = {"--pool-pages", std::to_string(pool_pages)};
  if (caching) {
    d.node = NodeProcess::Start(dir, {}, &error);
    if (d.node == nullptr) return Unavailable("strata-node: " + error);
    flags.insert(flags.end(),
                 {"--store", d.node->uri(), "--token", std::string(testing::kTokenA.token)});
  } else {
    flags.insert(flags.end(), {"--store", "none", "--hbm-cache-policy", "off"});
  }
  d.worker = WorkerProcess::Start(dir + "/worker-" + std::to_string(++n) + ".log", flags, &error);
  if (d.worker == nullptr) return Unavailable("strata-worker: " + error);
  return d;
}

struct Run {
  double load = 0;
  bool caching = false;
  LoadSummary summary;
};

void AddRow(Table& t, const std::string& name, const LoadSummary& s) {
  t.Add(name + " TTFT p50/p90/p99 ms", Fixed(s.ttft_p50_ms, 1) + " / " + Fixed(s.ttft_p90_ms, 1) +
                                           " / " + Fixed(s.ttft_p99_ms, 1));
  t.Add(name + " TTFT p50 first / later turns ms",
        Fixed(s.ttft_p50_ms_first, 1) + " / " + Fixed(s.ttft_p50_ms_repeat, 1),
        std::to_string(s.repeats) + " later turns");
  t.Add(name + " TPOT p50/p90/p99 ms", Fixed(s.tpot_p50_ms, 2) + " / " + Fixed(s.tpot_p90_ms, 2) +
                                           " / " + Fixed(s.tpot_p99_ms, 2));
  t.Add(name + " throughput", Fixed(s.requests_per_s, 2) + " req/s",
        Fixed(s.output_tokens_per_s, 1) + " output tokens/s");
  t.Add(name + " prompt tokens: HBM / store / computed",
        Fixed(s.hbm_hit_ratio, 3) + " / " + Fixed(s.store_hit_ratio, 3) + " / " +
            Fixed(s.computed_ratio, 3),
        "HBM share of repeat turns' hits " + Fixed(s.hbm_saved_fraction, 3));
  t.Add(name + " errors", std::to_string(s.errors) + " of " + std::to_string(s.requests));
}

void AddJson(JsonObject& j, const std::string& prefix, const LoadSummary& s) {
  j.Add(prefix + "ttft_p50_ms", s.ttft_p50_ms);
  j.Add(prefix + "ttft_p90_ms", s.ttft_p90_ms);
  j.Add(prefix + "ttft_p99_ms", s.ttft_p99_ms);
  j.Add(prefix + "ttft_p50_ms_first", s.ttft_p50_ms_first);
  j.Add(prefix + "ttft_p50_ms_repeat", s.ttft_p50_ms_repeat);
  j.Add(prefix + "tpot_p50_ms", s.tpot_p50_ms);
  j.Add(prefix + "tpot_p90_ms", s.tpot_p90_ms);
  j.Add(prefix + "tpot_p99_ms", s.tpot_p99_ms);
  j.Add(prefix + "requests_per_s", s.requests_per_s);
  j.Add(prefix + "output_tokens_per_s", s.output_tokens_per_s);
  j.Add(prefix + "hbm_hit_ratio", s.hbm_hit_ratio);
  j.Add(prefix + "store_hit_ratio", s.store_hit_ratio);
  j.Add(prefix + "computed_ratio", s.computed_ratio);
  j.Add(prefix + "hbm_saved_fraction", s.hbm_saved_fraction);
  j.Add(prefix + "errors", static_cast<double>(s.errors));
}

int LoadOnly(const ServeBenchOptions& o, const std::vector<LoadRequest>& requests) {
  const LoadSummary s = Summarize(RunLoad(o.endpoints, requests, o.load, "serve"));
  if (o.json) {
    JsonObject j;
    j.Add("requests", static_cast<double>(s.requests));
    AddJson(j, "", s);
    std::printf("%s\n", j.Dump().c_str());
  } else {
    Table t;
    AddRow(t, "", s);
    t.Print("strata-bench serve: " + std::to_string(requests.size()) + " requests against " +
            std::to_string(o.endpoints.size()) + " endpoint(s)");
  }
  return s.errors == s.requests ? 1 : 0;
}

std::string Percent(double load) { return std::to_string(std::lround(load * 100)); }

// Returns the number of failed requests.
size_t PrintComparison(const ServeBenchOptions& o, double capacity, const std::vector<Run>& runs,
                       size_t requests) {
  const Run* cache_top = nullptr;
  const Run* nocache_top = nullptr;
  size_t errors = 0;
  for (const Run& r : runs) {
    errors += r.summary.errors;
    (r.caching ? cache_top : nocache_top) = &r;  // the highest load is last
  }
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0; };
  if (o.json) {
    JsonObject j;
    j.Add("requests", static_cast<double>(requests));
    j.Add("capacity_rps", capacity);
    j.Add("ttft_p50_ms_cache", cache_top->summary.ttft_p50_ms);
    j.Add("ttft_p50_ms_nocache", nocache_top->summary.ttft_p50_ms);
    j.Add("ttft_p50_ratio",
          ratio(cache_top->summary.ttft_p50_ms, nocache_top->summary.ttft_p50_ms));
    j.Add("ttft_p50_ratio_repeat",
          ratio(cache_top->summary.ttft_p50_ms_repeat, nocache_top->summary.ttft_p50_ms_repeat));
    j.Add("hbm_saved_fraction", cache_top->summary.hbm_saved_fraction);
    j.Add("errors", static_cast<double>(errors));
    for (const Run& r : runs) {
      AddJson(j, "load" + Percent(r.load) + (r.caching ? "_cache_" : "_nocache_"), r.summary);
    }
    std::printf("%s\n", j.Dump().c_str());
    return errors;
  }
  Table t;
  t.Add("capacity without caching", Fixed(capacity, 2) + " req/s",
        std::to_string(o.capacity_in_flight) + " requests open at once");
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    const Run& c = runs[i];
    const Run& n = runs[i + 1];
    const std::string at = Percent(c.load) + "% ";
    AddRow(t, at + "cache", c.summary);
    AddRow(t, at + "no cache", n.summary);
    t.Add(at + "TTFT p50, cache vs no cache",
          Fixed(ratio(c.summary.ttft_p50_ms, n.summary.ttft_p50_ms), 3) + "x", "target <= 0.5x");
    t.Add(at + "TTFT p99, cache vs no cache",
          Fixed(ratio(c.summary.ttft_p99_ms, n.summary.ttft_p99_ms), 3) + "x");
    t.Add(at + "TTFT p50 of later turns, cache vs no cache",
          Fixed(ratio(c.summary.ttft_p50_ms_repeat, n.summary.ttft_p50_ms_repeat), 3) + "x");
  }
  t.Add("HBM tier saved (of repeat turns' store bytes)",
        Fixed(cache_top->summary.hbm_saved_fraction, 3), "target >= 0.3");
  t.Print("strata-bench serve: " + std::to_string(requests) + " requests (" + o.preset +
          " trace), one worker: HBM tier + node store vs caching off");
  return errors;
}

}  // namespace

int RunServeBench(ServeBenchOptions o) {
  o.load.poisson = o.arrival == "poisson";
  Result<std::vector<trace::TraceRequest>> trace = LoadTrace(o);
  if (!trace.ok()) {
    std::fprintf(stderr, "strata-bench serve: %s\n", trace.status().ToString().c_str());
    return 1;
  }
  if (!o.endpoints.empty()) return LoadOnly(o, RequestsFromTrace(*trace, o.load));

  const std::string dir = testing::TempDir("serve-bench");
  const auto fail = [&](const Status& s) {
    std::fprintf(stderr, "strata-bench serve: %s\n", s.ToString().c_str());
    return 1;
  };
  // Capacity: the worker without caching, a few requests open at once.
  ServeLoadOptions closed = o.load;
  closed.poisson = true;
  closed.rate = 0;
  closed.max_in_flight = o.capacity_in_flight;
  double capacity = 0;
  {
    Result<Deployment> d = Deploy(dir, /*caching=*/false, o.pool_pages);
    if (!d.ok()) return fail(d.status());
    capacity = Summarize(RunLoad({d->endpoint()}, RequestsFromTrace(*trace, closed), closed,
                                 "capacity, no cache"))
                   .requests_per_s;
  }
  if (capacity <= 0) return fail(Internal("no request finished while measuring capacity"));
  std::vector<Run> runs;
  for (double load : o.loads) {
    ServeLoadOptions open = o.load;
    open.poisson = true;
    open.rate = load * capacity;
    const std::vector<LoadRequest> requests = RequestsFromTrace(*trace, open);
    for (bool caching : {true, false}) {
      Result<Deployment> d = Deploy(dir, caching, o.pool_pages);  // each run starts cold
      if (!d.ok()) return fail(d.status());
      const std::string label = Percent(load) + "% load, " + (caching ? "cache" : "no cache");
      runs.push_back({load, caching, Summarize(RunLoad({d->endpoint()}, requests, open, label))});
    }
  }
  // Every request must be answered: an error fails the run.
  return PrintComparison(o, capacity, runs, trace->size()) == 0 ? 0 : 1;
}

}  // namespace strata::bench

// strata-worker: attaches the mini V4.1 model to a store and runs a
// workload file, printing per request TTFT, hit, replayed and recomputed
// tokens, then the hit ratio and cold vs warm TTFT.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "strata/chain_key.h"
#include "strata/client.h"
#include "strata/http_endpoint.h"
#include "strata/json_text.h"
#include "strata/metrics.h"
#include "strata/worker/engine.h"
#include "strata/worker/model.h"
#include "strata/worker/workload.h"

namespace {

int Fail(const strata::Status& st) {
  std::fprintf(stderr, "strata-worker: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-worker: the mini V4.1 model on a Strata store"};
  std::string store_uri = "inproc://";
  std::string model_path;
  std::string workload_path;
  std::string token;
  uint64_t random_seed = 1;
  bool json = false;
  std::string metrics_listen;
  std::string metrics_file;
  strata::worker::EngineOptions eo;
  app.add_option("--store", store_uri, "Store URI: inproc:// or strata://host:port");
  app.add_option("--token", token, "Bearer token for strata://");
  app.add_option("--model", model_path,
                 "safetensors weights (strata-mkmodel); default: random weights, --seed");
  app.add_option("--seed", random_seed, "Seed of the random weights when no --model is given");
  app.add_option("--workload", workload_path, "Workload file (strata-mkworkload)")->required();
  app.add_option("--keep-tokens", eo.keep_tokens, "Decoder bounded replay: tokens kept")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--max-batch-tokens", eo.max_batch_tokens, "Prefill tokens per step")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--pool-pages", eo.pool_pages, "Block pool pages")
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--max-running", eo.max_running, "Requests admitted at once; the rest queue")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--exact-after-replays", eo.exact_after_replays,
                 "After this many bounded replays over one prefix, compute it exactly once and "
                 "store its SWA state (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 20));
  app.add_flag("--json", json, "One JSON object instead of tables");
  app.add_option("--metrics-listen", metrics_listen,
                 "Serve /metrics (Prometheus text) and /healthz on host:port while running");
  app.add_option("--metrics-file", metrics_file,
                 "Write the metrics (Prometheus text) here at the end");
  CLI11_PARSE(app, argc, argv);

  using namespace strata::worker;
  strata::Result<ModelWeights> model = strata::InvalidArgument("unset");
  if (model_path.empty()) {
    model = ModelFromFile(RandomModelFile(DefaultModelConfig(), random_seed));
    eo.weights_revision = "random-seed-" + std::to_string(random_seed);
  } else {
    model = LoadModel(model_path);
    if (model.ok()) {
      strata::Result<std::string> revision = strata::WeightsRevisionOfFile(model_path);
      if (!revision.ok()) return Fail(revision.status());
      eo.weights_revision = *revision;
    }
  }
  if (!model.ok()) return Fail(model.status());
  strata::Result<std::vector<WorkloadItem>> items = ReadWorkloadFile(workload_path);
  if (!items.ok()) return Fail(items.status());
  strata::ClientOptions co;
  co.token = token;
  strata::Result<std::unique_ptr<strata::Store>> store = strata::OpenStore(store_uri, co);
  if (!store.ok()) return Fail(store.status());
  eo.store = store->get();
  strata::MetricsRegistry metrics;
  eo.metrics = &metrics;
  // Opened first: a path that cannot be written fails before the run.
  std::ofstream metrics_out;
  if (!metrics_file.empty()) {
    metrics_out.open(metrics_file, std::ios::trunc);
    if (!metrics_out) {
      return Fail(strata::InvalidArgument("cannot write the metrics to " + metrics_file));
    }
  }
  std::unique_ptr<strata::HttpEndpoint> http;
  if (!metrics_listen.empty()) {
    auto started = strata::HttpEndpoint::Start(
        metrics_listen, [&metrics] { return metrics.RenderPrometheus(); }, [] { return true; });
    if (!started.ok()) return Fail(started.status());
    http = std::move(started).value();
    std::fprintf(stderr, "strata-worker: metrics on http://%s:%d/metrics\n",
                 metrics_listen.substr(0, metrics_listen.rfind(':')).c_str(), http->port());
  }
  strata::Result<std::unique_ptr<Engine>> engine = Engine::Create(*model, eo);
  if (!engine.ok()) return Fail(engine.status());
  strata::Result<std::vector<WorkloadResult>> results = RunWorkload(**engine, *items);
  if (metrics_out.is_open()) {  // a failed run's metrics too
    metrics_out << metrics.RenderPrometheus();
    if (!metrics_out.flush()) {
      return Fail(strata::Unavailable("cannot write the metrics to " + metrics_file));
    }
  }
  if (!results.ok()) return Fail(results.status());

  uint64_t prompt = 0, hit = 0, store_errors = 0, store_skipped = 0;
  double cold_ttft = 0, warm_ttft = 0;
  int cold_n = 0, warm_n = 0;
  for (const WorkloadResult& r : *results) {
    prompt += r.stats.prompt_tokens;
    hit += r.stats.hit_tokens;
    store_errors += r.stats.store_errors;
    store_skipped += r.stats.store_skipped;
    if (r.turn >= 2) {
      warm_ttft += r.stats.ttft_s;
      ++warm_n;
    } else {
      cold_ttft += r.stats.ttft_s;
      ++cold_n;
    }
  }
  const double hit_ratio = prompt ? static_cast<double>(hit) / static_cast<double>(prompt) : 0;
  const double cold_ms = cold_n ? cold_ttft / cold_n * 1e3 : 0;
  const double warm_ms = warm_n ? warm_ttft / warm_n * 1e3 : 0;
  if (json) {
    std::printf("{\"store\":%s,\"requests\":[", strata::JsonString(store_uri).c_str());
    for (size_t i = 0; i < results->size(); ++i) {
      const WorkloadResult& r = (*results)[i];
      std::printf(
          "%s{\"item\":%zu,\"conversation\":%s,\"turn\":%u,\"prompt_tokens\":%lu,"
          "\"hit_tokens\":%lu,\"swa_hit\":%s,\"swa_rejected\":%s,\"replayed_tokens\":%lu,"
          "\"exact_recompute\":%s,\"computed_tokens\":%lu,"
          "\"recomputed_tokens\":%lu,\"output_tokens\":%zu,\"ttft_ms\":%.3f}",
          i ? "," : "", r.item, strata::JsonString(r.conversation).c_str(), r.turn,
          static_cast<unsigned long>(r.stats.prompt_tokens),
          static_cast<unsigned long>(r.stats.hit_tokens), r.stats.swa_hit ? "true" : "false",
          r.stats.swa_rejected ? "true" : "false",
          static_cast<unsigned long>(r.stats.replayed_tokens),
          r.stats.exact_recompute ? "true" : "false",
          static_cast<unsigned long>(r.stats.computed_tokens),
          static_cast<unsigned long>(r.stats.recomputed_tokens), r.output.size(),
          r.stats.ttft_s * 1e3);
    }
    std::printf(
        "],\"hit_ratio\":%.4f,\"ttft_cold_ms\":%.3f,\"ttft_warm_ms\":%.3f,\"store_errors\":%lu,"
        "\"store_skipped\":%lu}\n",
        hit_ratio, cold_ms, warm_ms, static_cast<unsigned long>(store_errors),
        static_cast<unsigned long>(store_skipped));
    return 0;
  }
  std::printf("%-5s %-6s %-4s %8s %8s %4s %8s %8s %10s %9s\n", "item", "conv", "turn", "prompt",
              "hit", "swa", "replayed", "computed", "recomputed", "ttft_ms");
  for (const WorkloadResult& r : *results) {
    std::printf("%-5zu %-6s %-4u %8lu %8lu %4s %8lu %8lu %10lu %9.2f\n", r.item,
                r.conversation.empty() ? "-" : r.conversation.c_str(), r.turn,
                static_cast<unsigned long>(r.stats.prompt_tokens),
                static_cast<unsigned long>(r.stats.hit_tokens),
                r.stats.swa_hit           ? "yes"
                : r.stats.exact_recompute ? "ex"
                : r.stats.swa_rejected    ? "rej"
                                          : "no",
                static_cast<unsigned long>(r.stats.replayed_tokens),
                static_cast<unsigned long>(r.stats.computed_tokens),
                static_cast<unsigned long>(r.stats.recomputed_tokens), r.stats.ttft_s * 1e3);
  }
  std::printf("\nhit ratio: %.1f%% of %lu prompt tokens\n", hit_ratio * 100,
              static_cast<unsigned long>(prompt));
  std::printf("TTFT cold turns (first turn / prompts): %.2f ms mean over %d\n", cold_ms, cold_n);
  std::printf("TTFT warm turns (turn >= 2):            %.2f ms mean over %d", warm_ms, warm_n);
  if (warm_n && cold_ms > 0) std::printf("  (%.2fx of cold)", warm_ms / cold_ms);
  std::printf("\n");
  if (store_errors + store_skipped > 0) {
    std::printf("store: %lu failed calls, %lu skipped while it was out of reach (computed)\n",
                static_cast<unsigned long>(store_errors),
                static_cast<unsigned long>(store_skipped));
  }
  return 0;
}

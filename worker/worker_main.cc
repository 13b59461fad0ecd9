// strata-worker: attaches the mini V4.1 model to a store, then runs a
// workload file to completion (the batch runner) or, with `serve`, serves
// the HTTP API until SIGTERM.
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
#include "worker_commands.h"

namespace {

int Fail(const strata::Status& st) {
  std::fprintf(stderr, "strata-worker: %s\n", st.ToString().c_str());
  return 1;
}

// `strata-worker send`: the workload through a serving worker's API.
int SendWorkload(const std::string& endpoint, const std::string& workload_path, bool json) {
  using namespace strata::worker;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) {
    return Fail(strata::InvalidArgument("--endpoint is host:port, not '" + endpoint + "'"));
  }
  strata::Result<std::vector<WorkloadItem>> items = ReadWorkloadFile(workload_path);
  if (!items.ok()) return Fail(items.status());
  strata::Result<std::vector<WorkloadResult>> results = RunWorkloadOverHttp(
      endpoint.substr(0, colon), std::atoi(endpoint.c_str() + colon + 1), *items);
  if (!results.ok()) return Fail(results.status());
  return PrintWorkloadReport(*results, "http://" + endpoint, json);
}

// `strata-worker serve`: its own flags; the store, model and engine flags
// of the main command are accepted after it too.
CLI::App* AddServeCommand(CLI::App& app, strata::worker::ServeFlags& flags) {
  CLI::App* serve = app.add_subcommand("serve", "Serve the HTTP API (OpenAI-style completions)");
  serve->fallthrough();
  serve->add_option("--listen", flags.api.listen, "host:port (port 0 picks a free one)")
      ->required();
  serve->add_option("--served-model-name", flags.api.model_name, "The model's name in the API")
      ->capture_default_str();
  serve
      ->add_option("--max-queue", flags.max_queued,
                   "Requests accepted past --max-running; past it: 429")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 20));
  serve->add_option("--max-prompt-tokens", flags.api.limits.max_prompt_tokens, "Longest prompt")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{strata::kMaxPromptTokens}));
  serve->add_option("--max-tokens-limit", flags.api.limits.max_tokens, "Largest max_tokens")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  serve
      ->add_option_function<double>(
          "--request-timeout",
          [&flags](double s) { flags.api.request_timeout = static_cast<strata::Nanos>(s * 1e9); },
          "Seconds from a request's arrival to its last token; past it: aborted (default 600)")
      ->check(CLI::Range(0.001, 86400.0));
  serve
      ->add_option_function<double>(
          "--drain-grace",
          [&flags](double s) { flags.drain_grace = static_cast<strata::Nanos>(s * 1e9); },
          "Seconds SIGTERM waits for running requests before aborting them (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  return serve;
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
  app.add_option("--store", store_uri,
                 "Store URI: inproc:// or strata://host:port; none: no store (every token "
                 "computed, save what the HBM tier holds)");
  app.add_option("--token", token, "Bearer token for strata://");
  app.add_option("--model", model_path,
                 "safetensors weights (strata-mkmodel); default: random weights, --seed");
  app.add_option("--seed", random_seed, "Seed of the random weights when no --model is given");
  app.add_option("--workload", workload_path, "Workload file (strata-mkworkload)");
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
  app.add_option_function<std::string>(
         "--hbm-cache-policy",
         [&eo](const std::string& p) { eo.hbm_cache_policy = p == "off" ? "" : p; },
         "The HBM tier (a prefix cache in the block pool): its eviction policy, lru, aslru or "
         "deadline; off: none (default lru)")
      ->check(CLI::IsMember({"lru", "aslru", "deadline", "off"}));
  app.add_flag("--json", json, "One JSON object instead of tables");
  app.add_option("--metrics-listen", metrics_listen,
                 "Serve /metrics (Prometheus text) and /healthz on host:port while running");
  app.add_option("--metrics-file", metrics_file,
                 "Write the metrics (Prometheus text) here at the end");
  strata::worker::ServeFlags serve_flags;
  CLI::App* serve = AddServeCommand(app, serve_flags);
  std::string endpoint;
  CLI::App* send = app.add_subcommand(
      "send", "Send the --workload to a serving worker over HTTP; print the same report");
  send->fallthrough();
  send->add_option("--endpoint", endpoint, "host:port of `strata-worker serve`")->required();
  CLI11_PARSE(app, argc, argv);

  using namespace strata::worker;
  // Before any thread starts (the store client's), so the signals reach
  // only Serve's sigwait.
  const sigset_t signals = BlockTerminationSignals();
  if (!serve->parsed() && workload_path.empty()) {
    return Fail(strata::InvalidArgument("--workload is required (or run `strata-worker serve`)"));
  }
  if (send->parsed()) return SendWorkload(endpoint, workload_path, json);
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
  strata::ClientOptions co;
  co.token = token;
  strata::Result<std::unique_ptr<strata::Store>> store = std::unique_ptr<strata::Store>();
  if (store_uri != "none") store = strata::OpenStore(store_uri, co);
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
  if (serve->parsed()) {
    serve_flags.api.fingerprint = (*engine)->model_id().ToHex();
    serve_flags.api.limits.vocab = model->config.vocab;
    serve_flags.api.max_in_flight = eo.max_running + serve_flags.max_queued;
    return Serve(std::move(engine).value(), metrics, serve_flags, signals);
  }
  strata::Result<std::vector<WorkloadItem>> items = ReadWorkloadFile(workload_path);
  if (!items.ok()) return Fail(items.status());
  strata::Result<std::vector<WorkloadResult>> results = RunWorkload(**engine, *items);
  if (metrics_out.is_open()) {  // a failed run's metrics too
    metrics_out << metrics.RenderPrometheus();
    if (!metrics_out.flush()) {
      return Fail(strata::Unavailable("cannot write the metrics to " + metrics_file));
    }
  }
  if (!results.ok()) return Fail(results.status());

  return PrintWorkloadReport(*results, store_uri, json);
}

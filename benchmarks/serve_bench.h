// `strata-bench serve`: serving workers under a multi-turn request trace,
// over HTTP.
//
// With --endpoint: a load generator against running workers (one run,
// Poisson or trace-timed arrivals). Without: the comparison, all in one
// run on this machine: a worker with the HBM tier and a node's store vs the
// same worker with caching off, at fractions of the measured capacity of
// the worker without caching (TTFT, time per output token, throughput,
// hits by tier).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "serve_load.h"

namespace strata::bench {

struct ServeBenchOptions {
  std::vector<std::string> endpoints;  // host:port of running workers
  std::string trace_path;              // Mooncake format; empty: generated
  std::string preset = "chat";         // strata-tracegen preset for a generated trace
  uint32_t conversations = 16;
  double mean_turns = 0;                   // 0: the preset's
  std::vector<double> loads = {0.5, 0.9};  // of the measured capacity (comparison)
  uint32_t capacity_in_flight = 4;         // concurrency of the capacity run
  uint32_t pool_pages = 256;               // the workers' block pool (HBM tier)
  std::string arrival = "poisson";
  ServeLoadOptions load;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--endpoint", endpoints,
                   "host:port of a serving worker (repeat for several); none: start a node and "
                   "workers here and compare caching on vs off");
    app.add_option("--trace", trace_path, "A Mooncake-format trace (strata-tracegen writes them)");
    app.add_option("--preset", preset, "Generated trace preset: chat or agent")
        ->check(CLI::IsMember({"chat", "agent"}));
    app.add_option("--conversations", conversations, "Conversations in a generated trace")
        ->check(CLI::Range(1u, 100000u));
    app.add_option("--mean-turns", mean_turns,
                   "Mean turns per conversation of a generated trace (default: the preset's)")
        ->check(CLI::Range(1.0, 100.0));
    app.add_option("--loads", loads, "Offered load as fractions of the measured capacity")
        ->check(CLI::Range(0.05, 4.0));
    app.add_option("--capacity-in-flight", capacity_in_flight,
                   "Requests open at once while measuring capacity")
        ->check(CLI::Range(1u, 256u));
    app.add_option("--pool-pages", pool_pages, "Block pool pages of the workers started here")
        ->check(CLI::Range(8u, 1u << 16));
    app.add_option("--arrival", arrival, "poisson or trace (the trace's own timestamps)")
        ->check(CLI::IsMember({"poisson", "trace"}));
    app.add_option("--rate", load.rate, "Poisson arrivals per second (--endpoint runs)");
    app.add_option("--time-scale", load.time_scale, "Trace-timed: run the trace this much faster")
        ->check(CLI::Range(1e-3, 1e6));
    app.add_option("--tokens-per-hash-id", load.tokens_per_hash_id,
                   "Tokens per trace block (512 in the trace) for the mini model")
        ->check(CLI::Range(1u, 512u));
    app.add_option("--max-prompt-tokens", load.max_prompt_tokens, "Longer prompts keep their head")
        ->check(CLI::Range(16u, 1u << 20));
    app.add_option("--max-output-tokens", load.max_output_tokens, "Answer length cap")
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--max-in-flight", load.max_in_flight, "Requests open at once")
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--seed", load.seed, "Trace and arrival seed");
    app.add_flag("--json", json, "Print one JSON object instead of tables");
  }
};

int RunServeBench(ServeBenchOptions options);

}  // namespace strata::bench

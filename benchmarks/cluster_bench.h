// `strata-bench cluster`: the cluster client over 1, 2 and 3 real
// strata-node processes on loopback (static membership, R = 1): aggregate
// fetch throughput of concurrent clients reading 227,840 B blocks, and
// match latency for a 131,072-token prompt spread over 1 vs 3 nodes (the
// per-node lookups run in parallel, so 3 nodes should cost about what 1
// does), next to a plain single-node client as the baseline.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace strata::bench {

struct ClusterBenchOptions {
  uint32_t prompt_blocks = 64;  // blocks per match + fetch
  uint32_t prompts = 4;         // distinct prompts cycled through
  uint32_t clients = 4;         // concurrent clients, each with its own connections
  double seconds = 2.0;
  uint32_t match_tokens = 131072;
  uint32_t match_iters = 200;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--prompt-blocks", prompt_blocks, "Blocks per match + fetch")
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--prompts", prompts, "Distinct prompts cycled through")
        ->check(CLI::Range(1u, 64u));
    app.add_option("--clients", clients, "Concurrent clients")->check(CLI::Range(1u, 64u));
    app.add_option("--seconds", seconds, "Seconds per measurement")->check(CLI::Range(0.1, 60.0));
    app.add_option("--match-tokens", match_tokens, "Prompt tokens for the match latency")
        ->check(CLI::Range(256u, 1u << 20));
    app.add_option("--match-iters", match_iters, "Matches timed")->check(CLI::Range(10u, 100000u));
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunClusterBench(const ClusterBenchOptions& options);

}  // namespace strata::bench

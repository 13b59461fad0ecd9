// `strata-bench node`: 227,840 B blocks fetched through a real strata-node
// over UCX shared memory and over UCX TCP, each next to raw UCX on the same
// transport, and next to Redis (started here; no persistence) over TCP and
// a unix socket with the same value size and concurrency; plus match
// latency for a 131,072-token prompt through the node.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::bench {

struct NodeBenchOptions {
  uint32_t prompt_blocks = 64;  // blocks per match + fetch (a 16K-token prefix)
  uint32_t prompts = 4;         // distinct prompts cycled through
  uint32_t clients = 1;         // concurrent clients (threads, one endpoint each)
  // Raw UCX and Redis: requests in flight per client; 0 = prompt_blocks,
  // what one fetch through the node has in flight (same bytes, same
  // destination footprint).
  uint32_t depth = 0;
  double seconds = 1.0;
  // Raw UCX and the node are measured in turn this many times per
  // transport; throughputs and ratios are medians (loopback throughput on a
  // shared machine drifts, so each ratio pairs neighbouring windows).
  uint32_t repeats = 3;
  uint32_t match_tokens = 131072;
  uint32_t match_iters = 200;
  std::string redis_server = "redis-server";
  bool skip_redis = false;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--prompt-blocks", prompt_blocks, "Blocks per match + fetch")
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--prompts", prompts, "Distinct prompts cycled through")
        ->check(CLI::Range(1u, 64u));
    app.add_option("--clients", clients, "Concurrent clients")->check(CLI::Range(1u, 64u));
    app.add_option("--depth", depth, "Raw UCX / Redis requests in flight per client")
        ->check(CLI::Range(0u, 4096u));
    app.add_option("--seconds", seconds, "Seconds per measurement")->check(CLI::Range(0.1, 60.0));
    app.add_option("--repeats", repeats, "Measurements per throughput (the median is reported)")
        ->check(CLI::Range(1u, 15u));
    app.add_option("--match-tokens", match_tokens, "Prompt tokens for the match latency")
        ->check(CLI::Range(256u, 1u << 20));
    app.add_option("--match-iters", match_iters, "Matches timed")->check(CLI::Range(10u, 100000u));
    app.add_option("--redis-server", redis_server, "redis-server binary");
    app.add_flag("--skip-redis", skip_redis, "Leave Redis out");
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunNodeBench(const NodeBenchOptions& options);

}  // namespace strata::bench

// `strata-bench replay`: a request trace through the real store, next to
// prefix-safe LRU and the offline optimum (Belady) computed in the same run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::bench {

struct ReplayBenchOptions {
  std::string trace;
  uint64_t capacity_tokens = 3'000'000;
  std::string policy = "deadline";
  bool full_payload = false;
  uint64_t ssd_capacity_tokens = 0;  // 0: DRAM only
  std::string ssd_dir = "/var/tmp";
  std::string ssd_policy = "lru";
  std::string node;         // strata://host:port: replay against this node instead
  std::string token;        // for --node; empty: $STRATA_TOKEN
  size_t max_requests = 0;  // 0: all
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--trace", trace, "Mooncake-format JSONL trace")->required();
    app.add_option("--capacity-tokens", capacity_tokens, "Cache capacity in tokens")
        ->check(CLI::Range(uint64_t{512}, uint64_t{1} << 40));
    app.add_option("--policy", policy,
                   "Eviction policy under test: deadline, aslru or lru (with --node: the one "
                   "the node should be running)")
        ->check(CLI::IsMember({"deadline", "aslru", "lru"}));
    app.add_flag("--full-payload", full_payload,
                 "Store and fetch 890 B/token of global KV per block (default: metadata only)");
    CLI::Option* ssd =
        app.add_option("--ssd-capacity-tokens", ssd_capacity_tokens,
                       "Two tiers: an SSD tier of this many tokens behind the DRAM tier (0: off)")
            ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
    app.add_option("--ssd-dir", ssd_dir,
                   "Where the SSD tier's files go (a fresh subdirectory, removed afterwards; "
                   "needs O_DIRECT)")
        ->needs(ssd);
    app.add_option("--ssd-policy", ssd_policy,
                   "The SSD tier's eviction policy under test: deadline or lru")
        ->check(CLI::IsMember({"deadline", "lru"}))
        ->needs(ssd);
    app.add_option("--node", node,
                   "Replay against a running strata-node (strata://host:port) under its own "
                   "policy and capacity; prints the settings it needs");
    app.add_option("--token", token, "Bearer token for --node (default: $STRATA_TOKEN)");
    app.add_option("--max-requests", max_requests, "Replay only the first N requests");
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunReplayBench(const ReplayBenchOptions& options);

}  // namespace strata::bench

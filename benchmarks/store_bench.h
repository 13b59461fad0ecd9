// `strata-bench store`: the in-process store on V4.1-sized blocks.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace strata::bench {

struct StoreBenchOptions {
  uint32_t prompt_tokens = 131072;  // 512 blocks of 256 tokens
  int fetch_rounds = 9;
  int commit_rounds = 5;
  int match_rounds = 300;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--prompt-tokens", prompt_tokens, "Prompt length in tokens")
        ->check(CLI::Range(256u, 1u << 20));
    app.add_option("--fetch-rounds", fetch_rounds, "Timed fetch rounds")
        ->check(CLI::Range(1, 1000));
    app.add_option("--commit-rounds", commit_rounds, "Timed commit rounds")
        ->check(CLI::Range(1, 1000));
    app.add_option("--match-rounds", match_rounds, "Timed match rounds")
        ->check(CLI::Range(10, 100000));
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunStoreBench(const StoreBenchOptions& options);

}  // namespace strata::bench

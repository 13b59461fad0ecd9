// `strata-bench worker`: TTFT of the mini V4.1 worker, cold vs warm (90%
// prefix hit with SWA state) at 2K/8K/32K tokens, TTFT with the SWA state
// missing (encoder bounded replay) at 8K vs 32K with equal uncached
// suffixes, and decode throughput. All against an in-process store in the
// same run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

struct WorkerBenchOptions {
  std::vector<uint32_t> lengths = {2048, 8192, 32768};
  double hit = 0.9;
  uint32_t swa_miss_suffix = 512;
  uint32_t decode_tokens = 32;
  bool tiny = false;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--lengths", lengths,
                   "Prompt lengths in tokens (8192 and 32768 also drive "
                   "the SWA-miss rows)")
        ->check(CLI::Range(1024u, 1u << 20));
    app.add_option("--hit", hit, "Prefix hit fraction of the warm runs")
        ->check(CLI::Range(0.1, 0.99));
    app.add_option("--swa-miss-suffix", swa_miss_suffix, "Uncached suffix of the SWA-miss runs")
        ->check(CLI::Range(256u, 8192u));
    app.add_option("--decode-tokens", decode_tokens, "Tokens decoded for decode_tokens_per_s")
        ->check(CLI::Range(2u, 4096u));
    app.add_flag("--tiny", tiny, "The small test model instead of the default config");
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunWorkerBench(const WorkerBenchOptions& options);

}  // namespace strata::bench

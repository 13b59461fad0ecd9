// strata-worker (no subcommand): runs a workload file to completion and
// prints per request TTFT, hit, replayed and recomputed tokens, then the hit
// ratio and cold vs warm TTFT.
#include <cstdio>
#include <string>
#include <vector>

#include "strata/json_text.h"
#include "strata/worker/workload.h"
#include "worker_commands.h"

namespace strata::worker {

int PrintWorkloadReport(const std::vector<WorkloadResult>& results, const std::string& store_uri,
                        bool json) {
  // "hit" is global KV from any tier; "of_hbm" the part the worker's own HBM
  // tier held.
  uint64_t prompt = 0, hit = 0, store_errors = 0, store_skipped = 0;
  double cold_ttft = 0, warm_ttft = 0;
  int cold_n = 0, warm_n = 0;
  for (const WorkloadResult& r : results) {
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
    for (size_t i = 0; i < results.size(); ++i) {
      const WorkloadResult& r = results[i];
      std::printf(
          "%s{\"item\":%zu,\"conversation\":%s,\"turn\":%u,\"prompt_tokens\":%lu,"
          "\"hit_tokens\":%lu,\"hbm_hit_tokens\":%lu,\"swa_hit\":%s,\"swa_rejected\":%s,\"replayed_"
          "tokens\":%lu,"
          "\"exact_recompute\":%s,\"computed_tokens\":%lu,"
          "\"recomputed_tokens\":%lu,\"output_tokens\":%zu,\"ttft_ms\":%.3f}",
          i ? "," : "", r.item, strata::JsonString(r.conversation).c_str(), r.turn,
          static_cast<unsigned long>(r.stats.prompt_tokens),
          static_cast<unsigned long>(r.stats.hit_tokens),
          static_cast<unsigned long>(r.stats.hbm_hit_tokens), r.stats.swa_hit ? "true" : "false",
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
  std::printf("%-5s %-6s %-4s %8s %8s %8s %4s %8s %8s %10s %9s\n", "item", "conv", "turn", "prompt",
              "hit", "of_hbm", "swa", "replayed", "computed", "recomputed", "ttft_ms");
  for (const WorkloadResult& r : results) {
    std::printf("%-5zu %-6s %-4u %8lu %8lu %8lu %4s %8lu %8lu %10lu %9.2f\n", r.item,
                r.conversation.empty() ? "-" : r.conversation.c_str(), r.turn,
                static_cast<unsigned long>(r.stats.prompt_tokens),
                static_cast<unsigned long>(r.stats.hit_tokens),
                static_cast<unsigned long>(r.stats.hbm_hit_tokens),
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

}  // namespace strata::worker

// The worker's metrics (DESIGN §10), strata_worker_*: what each request got
// from the store (hit, replayed, recomputed tokens, the SWA state's fate),
// match and fetch latency, time to first token, and the engine's load.
// Rendered by whoever owns the registry (strata-worker: --metrics-listen).
#pragma once

#include <optional>

#include "strata/metrics.h"
#include "strata/worker/engine.h"

namespace strata::worker {

class EngineMetrics {
 public:
  explicit EngineMetrics(MetricsRegistry& registry);

  void OnMatch(double seconds);
  // A fetch whose bytes were all used: its first layer group and its end.
  void OnFetch(std::optional<double> first_group_seconds, std::optional<double> seconds);
  void OnFirstToken(double ttft_seconds);
  // An aborted request counts its outcome and the work done, not what it
  // had planned to get from the store.
  void OnFinish(const RequestStats& stats, bool aborted);
  void SetLoad(const EngineCounters& counters);

 private:
  Counter* finished_;
  Counter* aborted_;
  Counter* prompt_tokens_;
  Counter* matched_tokens_;
  Counter* hit_tokens_;
  Counter* hbm_hit_tokens_;
  Counter* dram_hit_tokens_;
  Counter* ssd_hit_tokens_;
  Counter* computed_tokens_;
  Counter* replayed_tokens_;
  Counter* recomputed_tokens_;
  Counter* exact_recomputes_;
  Counter* swa_hit_;
  Counter* swa_rejected_;
  Counter* swa_missing_;
  Counter* committed_blocks_;
  Counter* committed_swa_;
  Counter* store_errors_;
  Counter* store_skipped_;
  Histogram* match_seconds_;
  Histogram* fetch_seconds_;
  Histogram* first_layer_seconds_;
  Histogram* ttft_seconds_;
  Gauge* running_;
  Gauge* queued_;
  Gauge* pool_pages_used_;
  Gauge* pool_pages_held_;
  Gauge* hbm_cached_pages_;
};

}  // namespace strata::worker

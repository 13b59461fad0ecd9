#include "engine_metrics.h"

namespace strata::worker {

EngineMetrics::EngineMetrics(MetricsRegistry& r) {
  const std::vector<double> latency = MetricsRegistry::ExponentialBuckets(1e-5, 4, 11);  // to 10 s
  const std::vector<double> ttft = MetricsRegistry::ExponentialBuckets(1e-3, 2, 16);     // to 33 s
  const char* requests = "strata_worker_requests_total";
  const char* requests_help = "Requests ended, by outcome.";
  finished_ = r.GetCounter(requests, requests_help, {{"outcome", "finished"}});
  aborted_ = r.GetCounter(requests, requests_help, {{"outcome", "aborted"}});
  prompt_tokens_ = r.GetCounter("strata_worker_prompt_tokens_total", "Prompt tokens of requests.");
  matched_tokens_ = r.GetCounter("strata_worker_matched_tokens_total",
                                 "Global KV tokens the store reported for prompts.");
  hit_tokens_ = r.GetCounter("strata_worker_hit_tokens_total",
                             "Global KV tokens fetched from the store and used.");
  computed_tokens_ =
      r.GetCounter("strata_worker_computed_tokens_total", "Prompt tokens prefilled here.");
  replayed_tokens_ = r.GetCounter("strata_worker_replayed_tokens_total",
                                  "Tokens run again by encoder bounded replay (SWA state missing "
                                  "or rejected).");
  recomputed_tokens_ = r.GetCounter("strata_worker_recomputed_tokens_total",
                                    "Planned hit tokens recomputed after a failed fetch.");
  exact_recomputes_ =
      r.GetCounter("strata_worker_exact_recomputes_total",
                   "Requests computed from token 0 because their prefix had been replayed "
                   "exact_after_replays times (the way back to the exact path).");
  const char* swa = "strata_worker_swa_states_total";
  const char* swa_help =
      "SWA state at a request's hit boundary: used, rejected (computed over other global KV), "
      "or missing.";
  swa_hit_ = r.GetCounter(swa, swa_help, {{"result", "hit"}});
  swa_rejected_ = r.GetCounter(swa, swa_help, {{"result", "rejected"}});
  swa_missing_ = r.GetCounter(swa, swa_help, {{"result", "missing"}});
  committed_blocks_ = r.GetCounter("strata_worker_committed_blocks_total",
                                   "Global KV blocks committed (or already stored).");
  committed_swa_ = r.GetCounter("strata_worker_committed_swa_total", "SWA states committed.");
  store_errors_ = r.GetCounter("strata_worker_store_errors_total",
                               "Store calls that failed (the work was recomputed or not cached).");
  store_skipped_ = r.GetCounter("strata_worker_store_skipped_total",
                                "Store calls not tried: the store was out of reach.");
  match_seconds_ = r.GetHistogram(
      "strata_worker_match_seconds",
      "Latency of a match call (a request deferred for pool pages matches again).", latency);
  fetch_seconds_ = r.GetHistogram("strata_worker_fetch_seconds",
                                  "From the start of a fetch to its last byte.", latency);
  first_layer_seconds_ =
      r.GetHistogram("strata_worker_fetch_first_layer_ready_seconds",
                     "From the start of a fetch to its first layer group in every block.", latency);
  ttft_seconds_ = r.GetHistogram("strata_worker_ttft_seconds", "Time to first token.", ttft);
  running_ = r.GetGauge("strata_worker_running_requests", "Requests prefilling or decoding.");
  queued_ = r.GetGauge("strata_worker_queued_requests", "Requests waiting for admission.");
  pool_pages_used_ = r.GetGauge("strata_worker_pool_pages_used",
                                "Block pool pages in use (the HBM tier's included).");
  pool_pages_held_ = r.GetGauge(
      "strata_worker_pool_pages_held",
      "Block pool pages requests and transfers hold (not those only the HBM tier keeps).");
  hbm_cached_pages_ = r.GetGauge("strata_worker_hbm_cached_pages",
                                 "Pages in the HBM tier (the local prefix cache).");
  const char* tier = "strata_worker_tier_hit_tokens_total";
  const char* tier_help =
      "Global KV tokens used from each tier: this worker's HBM, the store's "
      "DRAM and SSD.";
  hbm_hit_tokens_ = r.GetCounter(tier, tier_help, {{"tier", "hbm"}});
  dram_hit_tokens_ = r.GetCounter(tier, tier_help, {{"tier", "dram"}});
  ssd_hit_tokens_ = r.GetCounter(tier, tier_help, {{"tier", "ssd"}});
}

void EngineMetrics::OnMatch(double seconds) { match_seconds_->Observe(seconds); }

void EngineMetrics::OnFetch(std::optional<double> first_group_seconds,
                            std::optional<double> seconds) {
  if (first_group_seconds.has_value()) first_layer_seconds_->Observe(*first_group_seconds);
  if (seconds.has_value()) fetch_seconds_->Observe(*seconds);
}

void EngineMetrics::OnFirstToken(double ttft_seconds) { ttft_seconds_->Observe(ttft_seconds); }

void EngineMetrics::OnFinish(const RequestStats& s, bool aborted) {
  (aborted ? aborted_ : finished_)->Increment();
  prompt_tokens_->Increment(s.prompt_tokens);
  computed_tokens_->Increment(s.computed_tokens);
  recomputed_tokens_->Increment(s.recomputed_tokens);
  if (s.exact_recompute) exact_recomputes_->Increment();
  committed_blocks_->Increment(s.committed_blocks);
  committed_swa_->Increment(s.committed_swa);
  store_errors_->Increment(s.store_errors);
  store_skipped_->Increment(s.store_skipped);
  if (aborted) return;
  matched_tokens_->Increment(s.matched_tokens);
  hit_tokens_->Increment(s.hit_tokens);
  hbm_hit_tokens_->Increment(s.hbm_hit_tokens);
  ssd_hit_tokens_->Increment(s.ssd_hit_tokens);
  dram_hit_tokens_->Increment(s.hit_tokens - s.hbm_hit_tokens - s.ssd_hit_tokens);
  replayed_tokens_->Increment(s.replayed_tokens);
  if (s.swa_hit) {
    swa_hit_->Increment();
  } else if (s.swa_rejected) {
    swa_rejected_->Increment();
  } else if (s.hit_tokens > 0) {
    swa_missing_->Increment();
  }
}

void EngineMetrics::SetLoad(const EngineCounters& c) {
  running_->Set(c.running);
  queued_->Set(c.queued);
  pool_pages_used_->Set(c.pool_pages_used);
  pool_pages_held_->Set(c.pool_pages_held);
  hbm_cached_pages_->Set(c.hbm_cached_pages);
}

}  // namespace strata::worker

// `strata-bench serve`'s load generator: a request trace (Mooncake format,
// or strata-tracegen's) turned into completions for the mini model, sent to
// one or more serving workers over HTTP with Poisson or trace-timed
// arrivals, every answer streamed and timed.
//
// Scaling to the mini model: a trace block (512 tokens) becomes
// `tokens_per_hash_id` tokens, derived from its hash id alone, so equal ids
// give equal tokens and shared prefixes stay shared; answers are capped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/trace/trace.h"

namespace strata::bench {

struct ServeLoadOptions {
  uint32_t tokens_per_hash_id = 64;
  uint32_t max_prompt_tokens = 4096;  // a longer prompt keeps its head
  uint32_t max_output_tokens = 16;    // answers: the trace's, scaled, at most this
  bool poisson = true;                // false: the trace's own timestamps
  double rate = 0;                    // Poisson requests/s; 0: all at once (closed loop)
  double time_scale = 1;              // trace-timed: the trace runs this many times faster
  uint32_t max_in_flight = 64;        // requests open at once; later ones wait (and it counts)
  uint64_t seed = 1;
};

struct LoadRequest {
  std::vector<uint32_t> prompt;
  uint32_t max_tokens = 1;
  double send_at_s = 0;  // from the start of the run
  // The conversation's previous turn (an index), or -1: a next turn is sent
  // no earlier than the answer to the one before it, as a user would.
  int64_t after = -1;
};

// The previous turn of a request is the latest earlier one whose blocks,
// all but its (partial) last, begin this one's: how strata-tracegen's and
// Mooncake's multi-turn traces extend a conversation.
std::vector<LoadRequest> RequestsFromTrace(const std::vector<trace::TraceRequest>& trace,
                                           const ServeLoadOptions& options);

struct RequestOutcome {
  bool ok = false;
  bool repeat = false;  // a conversation's turn after its first
  std::string error;
  double ttft_s =
      0;  // from when it was due (its time, or its previous turn's end) to its first token
  double tpot_s = 0;  // mean gap between its tokens after the first
  double end_s = 0;   // when it finished, from the start of the run
  uint64_t prompt_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t hbm_hit_tokens = 0;
  uint64_t store_hit_tokens = 0;
  uint64_t computed_tokens = 0;
};

// Sends every request to `endpoints` (host:port, round robin) and waits for
// all; a progress line goes to stderr under `label`.
std::vector<RequestOutcome> RunLoad(const std::vector<std::string>& endpoints,
                                    const std::vector<LoadRequest>& requests,
                                    const ServeLoadOptions& options, const std::string& label);

struct LoadSummary {
  size_t requests = 0;
  size_t errors = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double ttft_p50_ms_first = 0;   // first turns (and lone prompts)
  double ttft_p50_ms_repeat = 0;  // later turns: where a cache can help
  size_t repeats = 0;
  double tpot_p50_ms = 0, tpot_p90_ms = 0, tpot_p99_ms = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  // Shares of all prompt tokens: from the HBM tier, from the store, computed.
  double hbm_hit_ratio = 0, store_hit_ratio = 0, computed_ratio = 0;
  // Of the prefix tokens repeat turns (any hit) got from HBM or the store,
  // the HBM tier's share: store bytes it saved.
  double hbm_saved_fraction = 0;
};

LoadSummary Summarize(const std::vector<RequestOutcome>& outcomes);

}  // namespace strata::bench

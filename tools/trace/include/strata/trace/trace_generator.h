// Synthetic multi-turn traces in the Mooncake format, so policies are not
// tuned to one file. A conversation starts with one of a few shared system
// prompts (Zipf popularity), then alternates a new user message (or tool
// output) with the model's answer; every turn re-sends the whole history,
// so turn t+1 extends turn t's prefix. Block ids follow the format: a full
// block keeps its id across turns, the partial last block of each turn gets
// a fresh one, and blocks inside a shared system prompt are shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"
#include "strata/trace/trace.h"

namespace strata::trace {

struct TraceGeneratorOptions {
  // Defaults ("chat") come near the Mooncake conversation trace: ~12k
  // requests an hour, ~11k-token prompts, about a third of them reusable.
  uint64_t seed = 1;
  uint32_t conversations = 5500;
  double duration_s = 3600;         // new conversations arrive uniformly at random in it
  double mean_turns = 2.2;          // geometric number of turns, at least 1
  double mean_think_s = 150;        // exponential gap between a reply and the next turn
  uint32_t system_prompts = 16;     // shared prefixes
  double system_prompt_zipf = 1.0;  // popularity skew across them
  uint32_t system_prompt_tokens = 1024;
  uint32_t first_message_tokens = 8000;  // mean, exponential: documents, code, long asks
  uint32_t message_tokens = 400;         // mean of later user messages / tool outputs
  uint32_t output_tokens = 400;          // mean answer length
  uint32_t max_context_tokens = 131072;  // a conversation ends when it would exceed this

  // Presets: "chat" (the defaults) and "agent" (many quick turns with tool
  // output: 12 turns, 5 s think time, 1500-token tool outputs, 150-token
  // answers, 4000 sessions an hour).
  static Result<TraceGeneratorOptions> Preset(const std::string& name);

  // Times and means finite and in range (at least one turn, a positive
  // arrival window, timestamps that fit in milliseconds).
  Status Validate() const;
};

// Requests sorted by timestamp; INVALID_ARGUMENT if !options.Validate().
Result<std::vector<TraceRequest>> GenerateTrace(const TraceGeneratorOptions& options);

}  // namespace strata::trace

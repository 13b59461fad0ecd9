#include "strata/trace/trace_generator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

namespace strata::trace {

Result<TraceGeneratorOptions> TraceGeneratorOptions::Preset(const std::string& name) {
  TraceGeneratorOptions o;
  if (name == "chat") return o;
  if (name == "agent") {
    o.conversations = 4000;
    o.mean_turns = 12;
    o.mean_think_s = 5;
    o.message_tokens = 1500;
    o.output_tokens = 150;
    o.first_message_tokens = 2000;
    return o;
  }
  return InvalidArgument("unknown trace preset '" + name + "' (known: chat, agent)");
}

Status TraceGeneratorOptions::Validate() const {
  // About 31 years: every timestamp fits in int64 milliseconds.
  constexpr double kMaxSeconds = 1e9;
  const auto within = [](double v, double lo, double hi) {
    return std::isfinite(v) && v >= lo && v <= hi;
  };
  if (!within(duration_s, 0, kMaxSeconds) || duration_s == 0) {
    return InvalidArgument("duration_s must be positive and at most 1e9");
  }
  if (!within(mean_turns, 1, 1e6)) return InvalidArgument("mean_turns must be in 1..1e6");
  if (!within(mean_think_s, 0, kMaxSeconds)) {
    return InvalidArgument("mean_think_s must be in 0..1e9");
  }
  if (!within(system_prompt_zipf, 0, 100)) {
    return InvalidArgument("system_prompt_zipf must be in 0..100");
  }
  return Status::Ok();
}

Result<std::vector<TraceRequest>> GenerateTrace(const TraceGeneratorOptions& o) {
  STRATA_RETURN_IF_ERROR(o.Validate());
  std::mt19937_64 rng(o.seed);
  auto exponential = [&](double mean) {
    return std::exponential_distribution<double>(1.0 / std::max(mean, 1e-9))(rng);
  };
  auto tokens = [&](double mean) { return static_cast<uint64_t>(1 + exponential(mean)); };
  std::vector<double> zipf(std::max<uint32_t>(o.system_prompts, 1));
  for (size_t k = 0; k < zipf.size(); ++k) zipf[k] = 1.0 / std::pow(k + 1.0, o.system_prompt_zipf);
  std::discrete_distribution<uint32_t> pick_prompt(zipf.begin(), zipf.end());
  std::uniform_real_distribution<double> arrival(0, o.duration_s);
  // Its p must be below 1: a mean of one turn draws no extra turns.
  std::geometric_distribution<uint32_t> extra_turns(o.mean_turns > 1 ? 1.0 / o.mean_turns : 0.5);

  // Block identities -> ids. (kind, a, b, c): kind 0 = system prompt block
  // (prompt, block); 1 = a full conversation block (conversation, block);
  // 2 = a partial last block (conversation, block, turn).
  std::map<std::tuple<int, uint64_t, uint64_t, uint64_t>, uint64_t> ids;
  auto id_of = [&](int kind, uint64_t a, uint64_t b, uint64_t c) {
    auto [it, inserted] = ids.emplace(std::make_tuple(kind, a, b, c), ids.size());
    return it->second;
  };

  std::vector<TraceRequest> out;
  const uint64_t sys_len = o.system_prompt_tokens;
  for (uint32_t conv = 0; conv < o.conversations; ++conv) {
    const uint32_t prompt = pick_prompt(rng);
    const uint32_t turns = 1 + (o.mean_turns > 1 ? extra_turns(rng) : 0);
    double t = arrival(rng);
    uint64_t context = sys_len;  // tokens before this turn's new message
    for (uint32_t turn = 0; turn < turns; ++turn) {
      const uint64_t message = tokens(turn == 0 ? o.first_message_tokens : o.message_tokens);
      const uint64_t input = context + message;
      const uint64_t output = tokens(o.output_tokens);
      if (input > o.max_context_tokens) break;
      TraceRequest r;
      r.timestamp_ms = static_cast<int64_t>(t * 1000);
      r.input_length = input;
      r.output_length = output;
      const uint64_t blocks = (input + kTraceBlockTokens - 1) / kTraceBlockTokens;
      for (uint64_t b = 0; b < blocks; ++b) {
        const uint64_t end = (b + 1) * kTraceBlockTokens;
        if (end <= sys_len) {
          r.hash_ids.push_back(id_of(0, prompt, b, 0));
        } else if (end <= input) {
          r.hash_ids.push_back(id_of(1, conv, b, 0));
        } else {
          r.hash_ids.push_back(id_of(2, conv, b, turn));
        }
      }
      out.push_back(std::move(r));
      context = input + output;
      // The answer takes time to generate (~50 tokens/s), then the user thinks.
      t += static_cast<double>(output) / 50.0 + exponential(o.mean_think_s);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.timestamp_ms < b.timestamp_ms;
  });
  return out;
}

}  // namespace strata::trace

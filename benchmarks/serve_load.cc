#include "serve_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "bench_util.h"
#include "http_client.h"

namespace strata::bench {
namespace {

using testing::Json;

// The tokens of a trace block: a function of its hash id alone.
void AppendBlock(uint64_t hash_id, uint32_t n, std::vector<uint32_t>* out) {
  uint64_t x = hash_id * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (uint32_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out->push_back(static_cast<uint32_t>((x >> 33) % 256));
  }
}

struct Endpoint {
  std::string host;
  int port = 0;
};

// "host:port", "http://host:port" or "[v6]:port".
Endpoint ParseEndpoint(std::string text) {
  if (text.rfind("http://", 0) == 0) text = text.substr(7);
  if (!text.empty() && text.back() == '/') text.pop_back();
  Endpoint e;
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  e.port = std::atoi(text.c_str() + colon + 1);
  return e;
}

uint64_t Field(const Json& usage, const char* outer, const char* name) {
  const Json& o = outer != nullptr ? usage.value(outer, Json::object()) : usage;
  return o.value(name, uint64_t{0});
}

// One streamed completion, timed from `scheduled` (seconds, NowSeconds()).
RequestOutcome Send(const Endpoint& at, const LoadRequest& request, double scheduled,
                    double run_start) {
  RequestOutcome r;
  r.prompt_tokens = request.prompt.size();
  const Json body = {{"prompt", request.prompt},
                     {"max_tokens", request.max_tokens},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  double first = 0, last = 0;
  Json usage;
  const testing::HttpResult answer = testing::Exchange(
      at.host, at.port, "POST", "/v1/completions", body.dump(),
      [&](const Json& event) {
        if (!event.is_object()) return true;
        if (event.contains("usage")) usage = event.at("usage");
        if (event.contains("choices") && !event.at("choices").empty()) {
          last = NowSeconds();
          if (first == 0) first = last;
          ++r.output_tokens;
        }
        return true;
      },
      /*recv_timeout_s=*/600);
  const bool done = !answer.events.empty() && answer.events.back() == "[DONE]";
  if (answer.status != 200 || !done || first == 0) {
    r.error = answer.status == 0 ? "no answer" : "HTTP " + std::to_string(answer.status);
    if (answer.status == 200) r.error = "stream ended early";
    return r;
  }
  r.ok = true;
  r.ttft_s = first - scheduled;
  r.tpot_s = r.output_tokens > 1 ? (last - first) / static_cast<double>(r.output_tokens - 1) : 0;
  r.end_s = last - run_start;
  r.hbm_hit_tokens = Field(usage, "strata", "hbm_hit_tokens");
  r.store_hit_tokens = Field(usage, "strata", "store_hit_tokens");
  r.computed_tokens = Field(usage, "strata", "computed_tokens");
  return r;
}

// The latest request before `i` whose hash ids but its last begin request
// i's (at least two of them: a shared system prompt alone is no turn).
int64_t PreviousTurn(const std::vector<trace::TraceRequest>& trace, size_t i) {
  const std::vector<uint64_t>& ids = trace[i].hash_ids;
  for (size_t j = i; j-- > 0;) {
    const std::vector<uint64_t>& prev = trace[j].hash_ids;
    if (prev.size() < 3 || prev.size() - 1 > ids.size()) continue;
    if (std::equal(prev.begin(), prev.end() - 1, ids.begin())) return static_cast<int64_t>(j);
  }
  return -1;
}

}  // namespace

std::vector<LoadRequest> RequestsFromTrace(const std::vector<trace::TraceRequest>& trace,
                                           const ServeLoadOptions& o) {
  std::vector<LoadRequest> out;
  out.reserve(trace.size());
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  double at = 0;
  const int64_t t0 = trace.empty() ? 0 : trace.front().timestamp_ms;
  for (const trace::TraceRequest& t : trace) {
    LoadRequest r;
    const double scale = static_cast<double>(o.tokens_per_hash_id) / trace::kTraceBlockTokens;
    const uint64_t total = std::clamp<uint64_t>(
        static_cast<uint64_t>(std::ceil(static_cast<double>(t.input_length) * scale)), 1,
        o.max_prompt_tokens);
    for (uint64_t id : t.hash_ids) {
      if (r.prompt.size() >= total) break;
      AppendBlock(
          id,
          static_cast<uint32_t>(std::min<uint64_t>(o.tokens_per_hash_id, total - r.prompt.size())),
          &r.prompt);
    }
    r.max_tokens = static_cast<uint32_t>(std::clamp<double>(
        std::ceil(static_cast<double>(t.output_length) * scale), 1, o.max_output_tokens));
    if (!o.poisson) {
      r.send_at_s = static_cast<double>(t.timestamp_ms - t0) / 1e3 / o.time_scale;
    } else if (o.rate > 0) {
      r.send_at_s = at;
      at += gap(rng);
    }
    r.after = PreviousTurn(trace, out.size());
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RequestOutcome> RunLoad(const std::vector<std::string>& endpoints,
                                    const std::vector<LoadRequest>& requests,
                                    const ServeLoadOptions& options, const std::string& label) {
  std::vector<Endpoint> at;
  at.reserve(endpoints.size());
  for (const std::string& e : endpoints) at.push_back(ParseEndpoint(e));
  std::vector<RequestOutcome> out(requests.size());
  std::atomic<size_t> next{0}, done{0}, errors{0};
  std::mutex mu;
  std::condition_variable ended;
  std::vector<double> end_at(requests.size(), -1);  // under mu: when each finished
  const double start = NowSeconds();
  // Each sender takes the next request in order and waits for its time (and
  // its previous turn's end): past max_in_flight open requests, a request
  // waits for a sender, and the wait is part of its TTFT (measured from when
  // it was due).
  auto sender = [&] {
    for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
      double due = start + requests[i].send_at_s;
      if (requests[i].after >= 0) {
        std::unique_lock lock(mu);
        ended.wait(lock, [&] { return end_at[requests[i].after] >= 0; });
        due = std::max(due, end_at[requests[i].after]);
      }
      const double wait = due - NowSeconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      out[i] = Send(at[i % at.size()], requests[i], due, start);
      out[i].repeat = requests[i].after >= 0;
      if (!out[i].ok) ++errors;
      {
        std::lock_guard lock(mu);
        end_at[i] = NowSeconds();
      }
      ended.notify_all();
      ++done;
    }
  };
  std::vector<std::thread> senders;
  const size_t n = std::min<size_t>(options.max_in_flight, requests.size());
  for (size_t i = 0; i < n; ++i) senders.emplace_back(sender);
  while (done.load() < requests.size()) {
    std::fprintf(stderr, "\r  %s: %zu/%zu done, %zu errors, %.0f s", label.c_str(), done.load(),
                 requests.size(), errors.load(), NowSeconds() - start);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  for (std::thread& t : senders) t.join();
  std::fprintf(stderr, "\r  %s: %zu/%zu done, %zu errors, %.1f s\n", label.c_str(), done.load(),
               requests.size(), errors.load(), NowSeconds() - start);
  return out;
}

LoadSummary Summarize(const std::vector<RequestOutcome>& outcomes) {
  LoadSummary s;
  s.requests = outcomes.size();
  std::vector<double> ttft, tpot, first_ttft, repeat_ttft;
  double wall = 0;
  uint64_t prompt = 0, hbm = 0, store = 0, computed = 0, output = 0;
  uint64_t repeat_hbm = 0, repeat_store = 0;
  for (const RequestOutcome& r : outcomes) {
    if (!r.ok) {
      ++s.errors;
      continue;
    }
    ttft.push_back(r.ttft_s * 1e3);
    (r.repeat ? repeat_ttft : first_ttft).push_back(r.ttft_s * 1e3);
    if (r.output_tokens > 1) tpot.push_back(r.tpot_s * 1e3);
    wall = std::max(wall, r.end_s);
    prompt += r.prompt_tokens;
    hbm += r.hbm_hit_tokens;
    store += r.store_hit_tokens;
    computed += r.computed_tokens;
    output += r.output_tokens;
    if (r.hbm_hit_tokens + r.store_hit_tokens > 0) {
      repeat_hbm += r.hbm_hit_tokens;
      repeat_store += r.store_hit_tokens;
    }
  }
  s.ttft_p50_ms = Percentile(ttft, 0.5);
  s.ttft_p90_ms = Percentile(ttft, 0.9);
  s.ttft_p99_ms = Percentile(ttft, 0.99);
  s.ttft_p50_ms_first = Percentile(first_ttft, 0.5);
  s.ttft_p50_ms_repeat = Percentile(repeat_ttft, 0.5);
  s.repeats = repeat_ttft.size();
  s.tpot_p50_ms = Percentile(tpot, 0.5);
  s.tpot_p90_ms = Percentile(tpot, 0.9);
  s.tpot_p99_ms = Percentile(tpot, 0.99);
  const size_t ok = outcomes.size() - s.errors;
  s.requests_per_s = wall > 0 ? static_cast<double>(ok) / wall : 0;
  s.output_tokens_per_s = wall > 0 ? static_cast<double>(output) / wall : 0;
  const auto share = [&](uint64_t n) {
    return prompt > 0 ? static_cast<double>(n) / static_cast<double>(prompt) : 0;
  };
  s.hbm_hit_ratio = share(hbm);
  s.store_hit_ratio = share(store);
  s.computed_ratio = share(computed);
  s.hbm_saved_fraction =
      repeat_hbm + repeat_store > 0
          ? static_cast<double>(repeat_hbm) / static_cast<double>(repeat_hbm + repeat_store)
          : 0;
  return s;
}

}  // namespace strata::bench

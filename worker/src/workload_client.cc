// RunWorkloadOverHttp: a workload file sent to a serving worker
// (`strata-worker serve`) as a client would, through POST /v1/completions.
// Conversations run side by side, each on its own connection, their turns
// in order: a turn's prompt is the conversation so far, token ids included
// as the model generated them (text would lose bytes that are not UTF-8).
#include <httplib.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "strata/worker/tokenizer.h"
#include "strata/worker/workload.h"

namespace strata::worker {
namespace {

using Json = nlohmann::json;

// The usage of a completion as RequestStats (completion_api.h).
RequestStats StatsOf(const Json& usage) {
  RequestStats s;
  const Json strata = usage.value("strata", Json::object());
  s.prompt_tokens = usage.value("prompt_tokens", uint64_t{0});
  s.hit_tokens = usage.value("prompt_tokens_details", Json::object()).value("cached_tokens", 0ull);
  s.hbm_hit_tokens = strata.value("hbm_hit_tokens", uint64_t{0});
  s.ssd_hit_tokens = strata.value("store_ssd_hit_tokens", uint64_t{0});
  s.replayed_tokens = strata.value("replayed_tokens", uint64_t{0});
  s.computed_tokens = strata.value("computed_tokens", uint64_t{0});
  s.recomputed_tokens = strata.value("recomputed_tokens", uint64_t{0});
  s.swa_hit = strata.value("swa_hit", false);
  s.ttft_s = strata.value("ttft_ms", 0.0) / 1e3;
  return s;
}

// One completion; its output and stats into *result.
Status Complete(httplib::Client& client, const std::string& session,
                const std::vector<uint32_t>& prompt, uint32_t max_tokens, WorkloadResult* result) {
  Json body = {{"prompt", prompt}, {"max_tokens", max_tokens}};
  if (!session.empty()) body["session_id"] = session;
  httplib::Result r = client.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return Unavailable("worker API: " + httplib::to_string(r.error()));
  const Json answer = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status != 200 || !answer.is_object() || !answer.contains("choices")) {
    return Unavailable("worker API: HTTP " + std::to_string(r->status) + ": " + r->body);
  }
  try {
    result->output = answer.at("choices").at(0).at("token_ids").get<std::vector<uint32_t>>();
    result->stats = StatsOf(answer.at("usage"));
  } catch (const std::exception& e) {
    return Unavailable(std::string("worker API: unexpected answer: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<WorkloadResult>> RunWorkloadOverHttp(const std::string& host, int port,
                                                        const std::vector<WorkloadItem>& items) {
  STRATA_RETURN_IF_ERROR(CheckWorkload(items));
  std::vector<WorkloadResult> results(items.size());
  // Each lane runs its items in order: one per conversation, one per prompt.
  std::map<std::string, std::vector<size_t>> lanes;
  for (size_t i = 0; i < items.size(); ++i) {
    results[i].item = i;
    results[i].conversation = items[i].conversation;
    const std::string lane =
        items[i].conversation.empty() ? "\x01" + std::to_string(i) : items[i].conversation;
    lanes[lane].push_back(i);
    if (!items[i].conversation.empty()) {
      results[i].turn = static_cast<uint32_t>(lanes[lane].size());
    }
  }
  std::mutex mu;
  Status first_error;
  std::vector<std::thread> threads;
  threads.reserve(lanes.size());
  for (const auto& [lane, order] : lanes) {
    threads.emplace_back([&, order = order] {
      httplib::Client client(host, port);
      client.set_read_timeout(600, 0);
      std::vector<uint32_t> history;
      for (size_t i : order) {
        const std::vector<uint32_t> text = ByteTokenizer::Encode(items[i].text);
        history.insert(history.end(), text.begin(), text.end());
        const Status s =
            Complete(client, items[i].conversation, items[i].conversation.empty() ? text : history,
                     items[i].max_new_tokens, &results[i]);
        if (!s.ok()) {
          std::lock_guard lock(mu);
          if (first_error.ok()) first_error = s;
          return;
        }
        history.insert(history.end(), results[i].output.begin(), results[i].output.end());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;
  return results;
}

}  // namespace strata::worker

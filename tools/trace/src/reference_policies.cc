#include "strata/trace/reference_policies.h"

#include <limits>
#include <list>
#include <queue>
#include <tuple>
#include <unordered_map>

namespace strata::trace {
namespace {

size_t LeadingRun(const TraceRequest& r, const auto& resident) {
  size_t n = 0;
  while (n < r.hash_ids.size() && resident.count(r.hash_ids[n]) != 0) ++n;
  return n;
}

}  // namespace

HitStats SimulateLru(const std::vector<TraceRequest>& requests, uint64_t capacity_blocks) {
  HitStats stats;
  std::list<uint64_t> order;  // front: most recent
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  for (const TraceRequest& r : requests) {
    stats.input_tokens += r.input_length;
    stats.hit_tokens += PrefixTokens(r, LeadingRun(r, where));
    for (size_t j = r.hash_ids.size(); j-- > 0;) {  // root-last
      const uint64_t id = r.hash_ids[j];
      auto it = where.find(id);
      if (it != where.end()) {
        order.splice(order.begin(), order, it->second);
      } else {
        order.push_front(id);
        where.emplace(id, order.begin());
      }
    }
    while (where.size() > capacity_blocks) {
      where.erase(order.back());
      order.pop_back();
    }
  }
  return stats;
}

HitStats SimulateBelady(const std::vector<TraceRequest>& requests, uint64_t capacity_blocks) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // next_use[i][j]: index of the next request after i that holds block j.
  std::vector<std::vector<uint64_t>> next_use(requests.size());
  std::unordered_map<uint64_t, uint64_t> upcoming;
  for (size_t i = requests.size(); i-- > 0;) {
    const auto& ids = requests[i].hash_ids;
    next_use[i].resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      auto it = upcoming.find(ids[j]);
      next_use[i][j] = it == upcoming.end() ? kNever : it->second;
    }
    for (uint64_t id : ids) upcoming[id] = i;
  }
  HitStats stats;
  // id -> its next use. Victim: the farthest next use; among equals the
  // deepest block, so a shared prefix outlives its tails.
  std::unordered_map<uint64_t, uint64_t> resident;
  using Candidate = std::tuple<uint64_t, size_t, uint64_t>;  // (next use, depth, id)
  std::priority_queue<Candidate> farthest;                   // lazily pruned
  for (size_t i = 0; i < requests.size(); ++i) {
    const TraceRequest& r = requests[i];
    stats.input_tokens += r.input_length;
    stats.hit_tokens += PrefixTokens(r, LeadingRun(r, resident));
    for (size_t j = 0; j < r.hash_ids.size(); ++j) {
      resident[r.hash_ids[j]] = next_use[i][j];
      farthest.emplace(next_use[i][j], j, r.hash_ids[j]);
    }
    while (resident.size() > capacity_blocks) {
      auto [use, depth, id] = farthest.top();
      farthest.pop();
      auto it = resident.find(id);
      if (it != resident.end() && it->second == use) resident.erase(it);
    }
  }
  return stats;
}

}  // namespace strata::trace

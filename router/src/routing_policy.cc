#include "strata/router/routing_policy.h"

#include <functional>

namespace strata::router {
namespace {

bool Eligible(const std::vector<WorkerView>& w, const std::vector<bool>& exclude, size_t i) {
  return w[i].healthy && !(i < exclude.size() && exclude[i]);
}

class RoundRobin final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  std::optional<size_t> Pick(const RouteRequest&, const std::vector<WorkerView>& w,
                             const std::vector<bool>& exclude) override {
    for (size_t k = 0; k < w.size(); ++k) {
      const size_t i = next_++ % w.size();
      if (Eligible(w, exclude, i)) return i;
    }
    return std::nullopt;
  }

 private:
  size_t next_ = 0;
};

// The eligible worker with the smallest cost; ties go round robin.
std::optional<size_t> Cheapest(const std::vector<WorkerView>& w, const std::vector<bool>& exclude,
                               size_t& start,
                               const std::function<double(const WorkerView&)>& cost) {
  std::optional<size_t> best;
  double best_cost = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    const size_t i = (start + k) % w.size();
    if (!Eligible(w, exclude, i)) continue;
    const double c = cost(w[i]);
    if (!best.has_value() || c < best_cost) {
      best = i;
      best_cost = c;
    }
  }
  ++start;
  return best;
}

class LeastLoaded final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  std::optional<size_t> Pick(const RouteRequest&, const std::vector<WorkerView>& w,
                             const std::vector<bool>& exclude) override {
    return Cheapest(w, exclude, start_, [](const WorkerView& v) { return v.in_flight; });
  }

 private:
  size_t start_ = 0;
};

// Expected TTFT in units of prefill tokens: the prefill queued ahead on the
// worker plus this prompt's own uncached part. A prefix the worker holds
// is worth its tokens; queued work costs the same per token, so a busy
// worker with the cache loses to an idle one once its queue is longer
// than the prefix it would save.
class CacheAware final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "cache_aware"; }
  std::optional<size_t> Pick(const RouteRequest& r, const std::vector<WorkerView>& w,
                             const std::vector<bool>& exclude) override {
    return Cheapest(w, exclude, start_, [&r](const WorkerView& v) {
      const uint64_t cached = std::min(v.cached_tokens, r.prompt_tokens);
      return static_cast<double>(v.queued_tokens + (r.prompt_tokens - cached)) +
             1e-3 * v.in_flight;  // equal work: the one with fewer requests
    });
  }

 private:
  size_t start_ = 0;
};

}  // namespace

Result<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const std::string& name) {
  if (name == "round_robin") return std::unique_ptr<RoutingPolicy>(new RoundRobin());
  if (name == "least_loaded") return std::unique_ptr<RoutingPolicy>(new LeastLoaded());
  if (name == "cache_aware") return std::unique_ptr<RoutingPolicy>(new CacheAware());
  return InvalidArgument("unknown routing policy '" + name +
                         "' (known: round_robin, least_loaded, cache_aware)");
}

}  // namespace strata::router

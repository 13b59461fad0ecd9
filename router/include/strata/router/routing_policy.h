// How strata-router picks a worker for a request (docs/serving.md,
// "Routing"): round_robin, least_loaded, or cache_aware (the default),
// which estimates each worker's time to first token from the prompt tokens
// it would have to compute (the prefix it holds, from the router's record
// of what it sent where) and the prefill work already queued on it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::router {

// What the router knows of one worker when it routes.
struct WorkerView {
  bool healthy = true;
  uint32_t in_flight = 0;      // requests the router has open on it
  uint64_t queued_tokens = 0;  // prompt tokens of those still to compute (estimated)
  uint64_t cached_tokens = 0;  // of this prompt, the prefix it likely holds
};

struct RouteRequest {
  uint64_t prompt_tokens = 0;
  std::string session_id;  // an input of cache_aware's tie-break only
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual std::string_view name() const = 0;
  // The index of the worker to use, among the healthy ones of `workers`
  // not in `exclude`; nullopt when there is none.
  virtual std::optional<size_t> Pick(const RouteRequest& request,
                                     const std::vector<WorkerView>& workers,
                                     const std::vector<bool>& exclude) = 0;
};

// "round_robin", "least_loaded" or "cache_aware".
Result<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const std::string& name);

}  // namespace strata::router

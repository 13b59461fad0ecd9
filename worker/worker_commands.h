// strata-worker's two commands: run a workload file (the batch runner,
// run_workload_command.cc) or serve the HTTP API (serve_command.cc).
#pragma once

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "strata/clock.h"
#include "strata/metrics.h"
#include "strata/worker/api_server.h"
#include "strata/worker/engine.h"
#include "strata/worker/workload.h"

namespace strata::worker {

int PrintWorkloadReport(const std::vector<WorkloadResult>& results, const std::string& store_uri,
                        bool json);

struct ServeFlags {
  ApiServerOptions api;
  uint32_t max_queued = 64;
  Nanos drain_grace = Seconds(30);
};

// SIGTERM and SIGINT, blocked in every thread (call before any starts) so
// that Serve takes them with sigwait.
sigset_t BlockTerminationSignals();

// Serves until SIGTERM or SIGINT, then drains: running requests finish
// within the grace, new ones get 503. Returns the exit code.
int Serve(std::unique_ptr<Engine> engine, MetricsRegistry& metrics, const ServeFlags& flags,
          const sigset_t& signals);

}  // namespace strata::worker

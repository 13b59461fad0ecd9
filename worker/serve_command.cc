// strata-worker serve: the HTTP API (api_server.h) until SIGTERM, then a
// drain within the grace and exit 0.
#include <pthread.h>

#include <cstdio>

#include "worker_commands.h"

namespace strata::worker {

sigset_t BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int Serve(std::unique_ptr<Engine> engine, MetricsRegistry& metrics, const ServeFlags& flags,
          const sigset_t& signals) {
  Result<std::unique_ptr<ApiServer>> server =
      ApiServer::Start(std::move(engine), &metrics, flags.api);
  if (!server.ok()) {
    std::fprintf(stderr, "strata-worker: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("listening http=%d\n", (*server)->port());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "strata-worker: %s: draining, %lld s grace\n",
               signal == SIGTERM ? "SIGTERM" : "SIGINT",
               static_cast<long long>(flags.drain_grace / kNanosPerSecond));
  const bool clean = (*server)->Drain(flags.drain_grace);
  const ApiServer::Stats stats = (*server)->stats();
  (*server)->Stop();
  std::fprintf(stderr, "strata-worker: %s; %llu requests finished, %llu cancelled, %llu refused\n",
               clean ? "drained" : "grace over, the rest aborted",
               static_cast<unsigned long long>(stats.finished),
               static_cast<unsigned long long>(stats.cancelled),
               static_cast<unsigned long long>(stats.refused));
  return 0;
}

}  // namespace strata::worker

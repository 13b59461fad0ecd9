// strata-router: the worker's HTTP API in front of N serving workers
// (router.h). Prints "listening http=PORT" once ready; SIGTERM stops it.
#include <pthread.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "strata/metrics.h"
#include "strata/router/router.h"

int main(int argc, char** argv) {
  CLI::App app{"strata-router: routes completions across serving workers"};
  strata::router::RouterOptions o;
  std::string workers;
  app.add_option("--listen", o.listen, "host:port (port 0 picks a free one)")->required();
  app.add_option("--workers", workers, "Serving workers: host:port,host:port,...")->required();
  app.add_option("--policy", o.policy, "round_robin, least_loaded or cache_aware")
      ->capture_default_str()
      ->check(CLI::IsMember({"round_robin", "least_loaded", "cache_aware"}));
  app.add_option("--retries", o.retries, "Other workers tried before the first byte")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  app.add_option("--max-in-flight", o.max_in_flight, "Requests open at once; past it: 429")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  CLI11_PARSE(app, argc, argv);
  for (size_t start = 0; start <= workers.size();) {
    const size_t comma = workers.find(',', start);
    const std::string w = workers.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!w.empty()) o.workers.push_back(w);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  // Blocked before any thread starts, so only sigwait takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  strata::MetricsRegistry metrics;
  auto router = strata::router::Router::Start(o, &metrics);
  if (!router.ok()) {
    std::fprintf(stderr, "strata-router: %s\n", router.status().ToString().c_str());
    return 1;
  }
  std::printf("listening http=%d\n", (*router)->port());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  (*router)->Stop();
  return 0;
}

// strata-router (docs/serving.md, "Routing"): the worker's HTTP API in
// front of N serving workers. It picks a worker per request (a
// RoutingPolicy), proxies the request and streams the answer back as it
// comes; a worker that fails before the answer's first byte gets the
// request re-sent to another, one that fails after it ends the stream
// with an error event. Health checks take workers that are down or
// draining out of routing until they answer again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/clock.h"
#include "strata/http_server.h"
#include "strata/metrics.h"
#include "strata/router/prefix_record.h"
#include "strata/router/routing_policy.h"
#include "strata/status.h"

namespace strata::router {

struct RouterOptions {
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> workers;  // host:port of `strata-worker serve`
  std::string policy = "cache_aware";
  uint32_t max_in_flight = 1024;  // past it: 429
  uint32_t retries = 2;           // other workers tried before the first byte
  Nanos health_interval = Seconds(1);
  size_t max_body_bytes = 4 << 20;
  HttpLimits http;
};

class Router {
 public:
  static Result<std::unique_ptr<Router>> Start(RouterOptions options, MetricsRegistry* metrics);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;
  int port() const { return http_->port(); }
  void Stop();

 private:
  struct Worker {
    std::string host;
    int port = 0;
    std::string name;  // host:port
    bool healthy = true;
    uint32_t in_flight = 0;
    uint64_t queued_tokens = 0;
  };
  struct Attempt;

  Router(RouterOptions options, std::unique_ptr<RoutingPolicy> policy, MetricsRegistry* metrics);
  void Handle(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder);
  void Proxy(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder);
  int Forward(const HttpRequest& request, size_t worker, HttpResponder& responder,
              bool* answered_any);
  std::optional<size_t> Choose(const HttpRequest& request, const std::vector<bool>& exclude,
                               std::vector<uint64_t>* hashes, uint64_t* uncached);
  void Finish(size_t worker, uint64_t uncached, bool ok, const std::vector<uint64_t>& hashes);
  void CheckHealth();
  void Count(const std::string& name, const std::string& worker, int code);

  const RouterOptions options_;
  MetricsRegistry* const metrics_;
  std::unique_ptr<HttpServer> http_;
  std::thread health_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<RoutingPolicy> policy_;  // under mu_
  std::vector<Worker> workers_;            // under mu_ (the list is fixed)
  PrefixRecord record_;                    // under mu_
  uint32_t in_flight_ = 0;                 // proxy threads running
  bool stopping_ = false;
};

}  // namespace strata::router

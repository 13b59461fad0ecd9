// HTTP /metrics (Prometheus text) and /healthz for a node or a worker
// (DESIGN §10), served to anyone who can reach the port: an HttpServer
// (strata/http_server.h, built for hostile clients) that serves GET and
// HEAD of those two paths and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "strata/http_server.h"
#include "strata/status.h"

namespace strata {

class HttpEndpoint {
 public:
  // `listen` is host:port (port 0 picks a free one; a port in use is an
  // error). `render_metrics` and `healthy` are called from the HTTP thread.
  static Result<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                     std::function<std::string()> render_metrics,
                                                     std::function<bool()> healthy,
                                                     HttpLimits limits = {});
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;
  void Stop() { server_->Stop(); }
  int port() const { return server_->port(); }

  using Stats = HttpServer::Stats;
  Stats stats() const { return server_->stats(); }

 private:
  explicit HttpEndpoint(std::unique_ptr<HttpServer> server) : server_(std::move(server)) {}
  std::unique_ptr<HttpServer> server_;
};

}  // namespace strata

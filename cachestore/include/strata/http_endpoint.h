// HTTP /metrics (Prometheus text) and /healthz for a node or a worker
// (DESIGN §10).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "strata/status.h"

namespace httplib {
class Server;
}

namespace strata {

class HttpEndpoint {
 public:
  // `listen` is host:port (port 0 picks a free one). `render_metrics` and
  // `healthy` are called from the HTTP thread.
  static Result<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                     std::function<std::string()> render_metrics,
                                                     std::function<bool()> healthy);
  ~HttpEndpoint();
  void Stop();
  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace strata

// HTTP /metrics (Prometheus text) and /healthz for a node or a worker
// (DESIGN §10), served to anyone who can reach the port, so built to take
// hostile clients (docs/security.md):
//  - one thread runs every connection from a poll loop: a slow or stalled
//    client costs a socket, never a thread, and cannot hold others up;
//  - a request's head is bounded in bytes and header lines, and must arrive
//    within a deadline; a connection idle past its keep-alive timeout, or
//    with a reply unread past the write timeout, is closed;
//  - only GET and HEAD without a body are served; anything else is answered
//    (405 / 400 / 413 / 431) and the connection closed, its body never read;
//  - past max_connections the connection that has waited longest for a
//    request's head to finish is dropped to make room for the new one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "strata/clock.h"
#include "strata/status.h"

namespace strata {

struct HttpLimits {
  size_t max_connections = 64;
  size_t max_head_bytes = 8192;  // request line + headers
  size_t max_header_lines = 64;
  Nanos head_timeout = Seconds(5);        // from a request's first byte (or accept) to its end
  Nanos keep_alive_timeout = Seconds(5);  // idle between requests
  Nanos write_timeout = Seconds(10);      // a reply the client does not read
  size_t max_requests_per_connection = 1000;
};

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
  void Stop();
  int port() const { return port_; }

  struct Stats {
    uint64_t connections_open = 0;
    uint64_t connections_dropped = 0;  // closed for a limit or timeout, or to make room
    uint64_t requests = 0;             // heads parsed
    uint64_t rejected = 0;             // answered 4xx
  };
  Stats stats() const;

  class Loop;  // the poll loop, in http_endpoint.cc

 private:
  HttpEndpoint() = default;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace strata

#include "strata/http_endpoint.h"

#include <httplib.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <memory>
#include <thread>

namespace strata {
namespace {

// A body the endpoint would read at all (a GET's, where a client sends one).
constexpr size_t kMaxRequestBodyBytes = 4096;

}  // namespace

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, std::function<std::string()> render_metrics,
    std::function<bool()> healthy) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    auto [p, ec] = std::from_chars(listen.data() + colon + 1, listen.data() + listen.size(), port);
    if (ec != std::errc() || p != listen.data() + listen.size()) port = -1;
  }
  if (colon == std::string::npos || port < 0 || port > 65535) {
    return InvalidArgument("the HTTP listen address must be host:port, got '" + listen + "'");
  }
  std::string host = listen.substr(0, colon);
  // "[::1]:port", as gRPC's listen takes it; getaddrinfo wants the bare address.
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<HttpEndpoint> ep(new HttpEndpoint());
  ep->server_ = std::make_unique<httplib::Server>();
  // Only GET and HEAD are served. Anything else is refused before its body
  // is read: cpp-httplib 0.11 reads (and inflates, for gzip or br) a body
  // whole before it looks for a handler, and allows any size by default.
  ep->server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_header("Connection", "close");
    res.set_content("only GET and HEAD are served\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  ep->server_->set_payload_max_length(kMaxRequestBodyBytes);
  // A client that stalls mid-request gives its thread back sooner (the
  // library has no deadline for a whole request).
  ep->server_->set_read_timeout(std::chrono::seconds(2));
  ep->server_->set_keep_alive_max_count(16);
  ep->server_->Get("/metrics", [render = std::move(render_metrics)](const httplib::Request&,
                                                                    httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4");
  });
  ep->server_->Get("/healthz",
                   [healthy = std::move(healthy)](const httplib::Request&, httplib::Response& res) {
                     const bool ok = healthy();
                     res.status = ok ? 200 : 503;
                     res.set_content(ok ? "ok\n" : "draining\n", "text/plain");
                   });
  ep->port_ = port == 0 ? ep->server_->bind_to_any_port(host)
                        : (ep->server_->bind_to_port(host, port) ? port : -1);
  if (ep->port_ <= 0) return Unavailable("cannot listen for HTTP on " + listen);
  auto exited = std::make_shared<std::atomic<bool>>(false);  // the thread outlives Start
  ep->thread_ = std::thread([server = ep->server_.get(), exited] {
    (void)server->listen_after_bind();
    *exited = true;
  });
  // stop() does nothing until the listener is running (cpp-httplib 0.11),
  // so a Stop right after Start would wait forever on the join: return once
  // it runs (or has given up).
  for (int i = 0; i < 5000 && !ep->server_->is_running() && !exited->load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ep;
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

void HttpEndpoint::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace strata

#include "strata/http_endpoint.h"

#include <utility>

namespace strata {
namespace {

HttpReply Route(const HttpRequest& request, const std::function<std::string()>& render_metrics,
                const std::function<bool()>& healthy) {
  HttpReply r;
  if (request.path == "/metrics") {
    r.body = render_metrics();
    r.content_type = "text/plain; version=0.0.4";
  } else if (request.path == "/healthz") {
    const bool ok = healthy();
    r.status = ok ? 200 : 503;
    r.body = ok ? "ok\n" : "draining\n";
  } else {
    r.status = 404;
    r.body = "not found; try /metrics or /healthz\n";
  }
  return r;
}

}  // namespace

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, std::function<std::string()> render_metrics,
    std::function<bool()> healthy, HttpLimits limits) {
  HttpServerOptions options;
  options.limits = limits;
  auto handler = [render_metrics = std::move(render_metrics), healthy = std::move(healthy)](
                     HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    responder->Reply(Route(request, render_metrics, healthy));
  };
  Result<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(listen, std::move(handler), std::move(options));
  if (!server.ok()) return server.status();
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(server).value()));
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

}  // namespace strata

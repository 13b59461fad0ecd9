#include "strata/router/router.h"

#include <httplib.h>

#include <utility>

#include "strata/json_text.h"
#include "strata/worker/completion_api.h"

namespace strata::router {
namespace {

constexpr const char* kJson = "application/json";

HttpReply JsonError(int status, const std::string& message) {
  HttpReply r;
  r.status = status;
  r.content_type = kJson;
  r.body = HttpErrorBody(status, message, /*json=*/true);
  return r;
}

// The prompt's tokens and session, as far as the router can read them; a
// body it cannot read is routed anyway, for the worker to refuse.
worker::CompletionRequest ReadForRouting(const std::string& body) {
  worker::CompletionLimits limits;
  limits.vocab = UINT32_MAX;
  limits.max_prompt_tokens = UINT64_MAX;
  limits.max_tokens = UINT32_MAX;
  limits.max_session_id_bytes = SIZE_MAX;
  worker::ApiError error;
  std::optional<worker::CompletionRequest> r = worker::ParseCompletionRequest(body, limits, &error);
  return r.has_value() ? std::move(*r) : worker::CompletionRequest{};
}

}  // namespace

Router::Router(RouterOptions options, std::unique_ptr<RoutingPolicy> policy,
               MetricsRegistry* metrics)
    : options_(std::move(options)), metrics_(metrics), policy_(std::move(policy)) {
  for (const std::string& w : options_.workers) {
    Worker worker;
    const size_t colon = w.rfind(':');
    worker.host = w.substr(0, colon);
    worker.port = std::atoi(w.c_str() + colon + 1);
    worker.name = w;
    workers_.push_back(std::move(worker));
  }
}

Result<std::unique_ptr<Router>> Router::Start(RouterOptions options, MetricsRegistry* metrics) {
  if (options.workers.empty()) return InvalidArgument("router: no workers");
  if (options.workers.size() > 64) return InvalidArgument("router: at most 64 workers");
  for (const std::string& w : options.workers) {
    const size_t colon = w.rfind(':');
    if (colon == std::string::npos || colon == 0 || std::atoi(w.c_str() + colon + 1) <= 0) {
      return InvalidArgument("router: worker '" + w + "' is not host:port");
    }
  }
  Result<std::unique_ptr<RoutingPolicy>> policy = MakeRoutingPolicy(options.policy);
  if (!policy.ok()) return policy.status();
  std::unique_ptr<Router> router(
      new Router(std::move(options), std::move(policy).value(), metrics));
  HttpServerOptions http;
  http.limits = router->options_.http;
  http.methods = {"GET", "HEAD", "POST"};
  http.max_body_bytes = router->options_.max_body_bytes;
  http.json_errors = true;
  Router* self = router.get();
  Result<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      router->options_.listen,
      [self](const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder) {
        self->Handle(request, responder);
      },
      http, "router");
  if (!server.ok()) return server.status();
  router->http_ = std::move(server).value();
  router->health_thread_ = std::thread([self] { self->CheckHealth(); });
  return router;
}

Router::~Router() { Stop(); }

void Router::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (http_ != nullptr) http_->Stop();  // proxies see their clients gone
  if (health_thread_.joinable()) health_thread_.join();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
}

void Router::Count(const std::string& name, const std::string& worker, int code) {
  if (metrics_ == nullptr) return;
  metrics_
      ->GetCounter(name, "Requests the router answered, by worker and code",
                   {{"worker", worker}, {"code", std::to_string(code)}})
      ->Increment();
}

void Router::Handle(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder) {
  if (request.path == "/healthz") {
    size_t healthy = 0;
    {
      std::lock_guard lock(mu_);
      for (const Worker& w : workers_) healthy += w.healthy ? 1 : 0;
    }
    HttpReply r;
    r.status = healthy > 0 ? 200 : 503;
    r.body = healthy > 0 ? "ok\n" : "no worker is up\n";
    responder->Reply(r);
    return;
  }
  if (request.path == "/metrics") {
    HttpReply r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_ != nullptr ? metrics_->RenderPrometheus() : "";
    responder->Reply(r);
    return;
  }
  const bool completion = request.path == "/v1/completions";
  if (!completion && request.path != "/v1/models") {
    responder->Reply(JsonError(
        404, "no route " + request.path + "; try /v1/completions, /v1/models, /healthz, /metrics"));
    return;
  }
  // The rest is the workers' answer, proxied on a thread of its own (the
  // HTTP thread never waits on a worker).
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      responder->Reply(JsonError(503, "the router is stopping"));
      return;
    }
    if (in_flight_ >= options_.max_in_flight) {
      HttpReply r = JsonError(429, "the router has " + std::to_string(in_flight_) +
                                       " requests in flight, its limit; retry later");
      r.headers.emplace_back("Retry-After", "1");
      responder->Reply(r);
      return;
    }
    ++in_flight_;
  }
  std::thread([this, request, responder] {
    Proxy(request, responder);
    std::lock_guard lock(mu_);
    --in_flight_;
    cv_.notify_all();
  }).detach();
}

std::optional<size_t> Router::Choose(const HttpRequest& request, const std::vector<bool>& exclude,
                                     std::vector<uint64_t>* hashes, uint64_t* uncached) {
  const worker::CompletionRequest read =
      request.method == "POST" ? ReadForRouting(request.body) : worker::CompletionRequest{};
  std::lock_guard lock(mu_);
  *hashes = record_.BlockHashes(read.prompt);
  std::vector<WorkerView> views(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    views[i].healthy = workers_[i].healthy;
    views[i].in_flight = workers_[i].in_flight;
    views[i].queued_tokens = workers_[i].queued_tokens;
    views[i].cached_tokens = record_.CachedTokens(*hashes, i);
  }
  std::optional<size_t> pick = policy_->Pick({read.prompt.size(), read.session_id}, views, exclude);
  if (!pick.has_value()) return pick;
  Worker& w = workers_[*pick];
  *uncached =
      read.prompt.size() - std::min<uint64_t>(views[*pick].cached_tokens, read.prompt.size());
  ++w.in_flight;
  w.queued_tokens += *uncached;
  return pick;
}

void Router::Finish(size_t worker, uint64_t uncached, bool ok,
                    const std::vector<uint64_t>& hashes) {
  std::lock_guard lock(mu_);
  Worker& w = workers_[worker];
  --w.in_flight;
  w.queued_tokens -= std::min(w.queued_tokens, uncached);
  if (ok) record_.Record(hashes, worker);
}

void Router::Proxy(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder) {
  std::vector<bool> tried(workers_.size(), false);
  for (uint32_t attempt = 0; attempt <= options_.retries; ++attempt) {
    std::vector<uint64_t> hashes;
    uint64_t uncached = 0;
    const std::optional<size_t> w = Choose(request, tried, &hashes, &uncached);
    if (!w.has_value()) break;
    tried[*w] = true;
    bool answered_any = false;
    const int status = Forward(request, *w, *responder, &answered_any);
    Finish(*w, uncached, status == 200, hashes);
    if (answered_any || responder->client_gone()) return;
    if (metrics_ != nullptr) {
      metrics_
          ->GetCounter("strata_router_retries_total",
                       "Requests re-sent to another worker after one failed before answering",
                       {{"worker", workers_[*w].name}})
          ->Increment();
    }
  }
  Count("strata_router_requests_total", "none", 503);
  responder->Reply(JsonError(503, "no worker could take the request"));
}

// Sends `request` to worker `w` and relays its answer: the worker's status
// (its 4xx unchanged), or 0 when it failed (a stream it broke off ends with
// an error event). *answered_any once any of its answer reached the client:
// then the request cannot be re-sent.
int Router::Forward(const HttpRequest& request, size_t w, HttpResponder& responder,
                    bool* answered_any) {
  const Worker& worker = workers_[w];  // host and port never change
  httplib::Client client(worker.host, worker.port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(600, 0);
  httplib::Request out;
  out.method = request.method == "HEAD" ? "GET" : request.method;
  out.path = request.target;
  out.body = request.body;
  if (!request.body.empty()) out.set_header("Content-Type", kJson);
  int status = 0;
  std::string content_type;
  bool streaming = false;
  std::string whole;  // a non-streamed answer, relayed at its end
  out.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    content_type = r.get_header_value("Content-Type");
    streaming = status == 200 && content_type.rfind("text/event-stream", 0) == 0;
    if (streaming) {
      responder.StartStream(200, content_type);
      *answered_any = true;
    }
    return true;
  };
  out.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (!streaming) {
      whole.append(data, n);
      return true;
    }
    return responder.Send(std::string_view(data, n));
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(out, response, error);
  if (streaming) {
    if (!sent && !responder.client_gone()) {
      // The worker failed mid-stream: a clean error event, then the end.
      std::string event = "data: ";
      event += HttpErrorBody(502, "worker " + worker.name + " failed mid-stream", true);
      event.pop_back();
      event += "\n\n";
      responder.Send(event);
    }
    responder.End();
    Count("strata_router_requests_total", worker.name, sent ? 200 : 502);
    return sent ? 200 : 0;
  }
  // No answer, or the worker cannot take it (draining, full, failing):
  // another worker may.
  if (!sent || status == 0 || status == 429 || (status >= 500 && status != 504)) return 0;
  HttpReply r;
  r.status = status;
  r.content_type = content_type.empty() ? kJson : content_type;
  r.body = std::move(whole);
  if (const std::string retry = response.get_header_value("Retry-After"); !retry.empty()) {
    r.headers.emplace_back("Retry-After", retry);
  }
  if (const std::string allow = response.get_header_value("Allow"); !allow.empty()) {
    r.headers.emplace_back("Allow", allow);
  }
  responder.Reply(r);
  *answered_any = true;
  Count("strata_router_requests_total", worker.name, status);
  return status;
}

void Router::CheckHealth() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    std::vector<std::pair<std::string, int>> targets;
    for (const Worker& w : workers_) targets.emplace_back(w.host, w.port);
    lock.unlock();
    std::vector<bool> up(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      httplib::Client client(targets[i].first, targets[i].second);
      client.set_connection_timeout(1, 0);
      client.set_read_timeout(1, 0);
      httplib::Result r = client.Get("/healthz");
      up[i] = r && r->status == 200;
    }
    lock.lock();
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].healthy = up[i];
      if (metrics_ != nullptr) {
        metrics_
            ->GetGauge("strata_router_worker_up", "1 while a worker answers its health check",
                       {{"worker", workers_[i].name}})
            ->Set(up[i] ? 1 : 0);
      }
    }
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.health_interval),
                 [&] { return stopping_; });
  }
}

}  // namespace strata::router

#include "strata/worker/api_server.h"

#include <chrono>
#include <ctime>
#include <utility>

namespace strata::worker {
namespace {

constexpr const char* kJson = "application/json";

HttpReply JsonReply(int status, std::string body) {
  HttpReply r;
  r.status = status;
  r.content_type = kJson;
  r.body = std::move(body);
  return r;
}

}  // namespace

struct ApiServer::Live {
  CompletionRequest request;
  std::shared_ptr<HttpResponder> responder;
  CompletionIdentity who;
  Nanos deadline = 0;
  std::vector<uint32_t> output;
  Utf8Decoder decoder;
  bool streaming = false;  // the stream's head went out: errors come as events
};

ApiServer::ApiServer(std::unique_ptr<Engine> engine, MetricsRegistry* metrics,
                     ApiServerOptions options)
    : engine_(std::move(engine)),
      metrics_(metrics),
      options_(std::move(options)),
      started_unix_(static_cast<int64_t>(std::time(nullptr))) {
  if (metrics_ != nullptr) {
    in_flight_gauge_ = metrics_->GetGauge("strata_worker_http_in_flight",
                                          "Completions accepted and not yet finished");
    draining_gauge_ =
        metrics_->GetGauge("strata_worker_draining", "1 while the worker drains (SIGTERM)");
  }
}

Result<std::unique_ptr<ApiServer>> ApiServer::Start(std::unique_ptr<Engine> engine,
                                                    MetricsRegistry* metrics,
                                                    ApiServerOptions options) {
  std::unique_ptr<ApiServer> server(new ApiServer(std::move(engine), metrics, std::move(options)));
  HttpServerOptions http;
  http.limits = server->options_.http;
  http.methods = {"GET", "HEAD", "POST"};
  http.max_body_bytes = server->options_.max_body_bytes;
  http.json_errors = true;
  ApiServer* self = server.get();
  Result<std::unique_ptr<HttpServer>> started = HttpServer::Start(
      server->options_.listen,
      [self](const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder) {
        self->Handle(request, responder);
      },
      http, "worker API");
  if (!started.ok()) return started.status();
  server->http_ = std::move(started).value();
  server->engine_thread_ = std::thread([self] { self->EngineLoop(); });
  return server;
}

ApiServer::~ApiServer() { Stop(); }

void ApiServer::Stop() {
  if (http_ != nullptr) http_->Stop();  // clients still waiting see their end below
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (engine_thread_.joinable()) engine_thread_.join();
}

bool ApiServer::Drain(Nanos grace) {
  std::unique_lock lock(mu_);
  draining_ = true;
  if (draining_gauge_ != nullptr) draining_gauge_->Set(1);
  const bool done = drained_.wait_for(lock, std::chrono::nanoseconds(grace),
                                      [&] { return stats_.in_flight == 0; });
  if (done) return true;
  abort_all_ = true;
  wake_.notify_all();
  drained_.wait(lock, [&] { return stats_.in_flight == 0 || stopping_; });
  return false;
}

ApiServer::Stats ApiServer::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// --- The HTTP thread ---------------------------------------------------------

void ApiServer::Count(const std::string& route, int code) {
  if (metrics_ == nullptr) return;
  metrics_
      ->GetCounter("strata_worker_http_requests_total", "HTTP requests answered, by route and code",
                   {{"route", route}, {"code", std::to_string(code)}})
      ->Increment();
}

void ApiServer::ReplyError(HttpResponder& responder, const ApiError& error, HttpHeaders headers) {
  HttpReply r = JsonReply(error.status, ErrorJson(error));
  r.headers = std::move(headers);
  responder.Reply(r);
}

void ApiServer::Handle(const HttpRequest& request,
                       const std::shared_ptr<HttpResponder>& responder) {
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (path == "/v1/completions" && request.method == "POST") {
    HandleCompletion(request, responder);
    return;
  }
  if (path == "/v1/completions" ||
      ((path == "/v1/models" || path == "/healthz" || path == "/metrics") && !get)) {
    Count(path, 405);
    ReplyError(*responder, {405, request.method + " is not served on " + path, ""},
               {{"Allow", path == "/v1/completions" ? "POST" : "GET, HEAD"}});
    return;
  }
  HttpReply r;
  if (path == "/v1/models") {
    r = JsonReply(200, ModelsJson(options_.model_name, options_.fingerprint, started_unix_));
  } else if (path == "/healthz") {
    std::lock_guard lock(mu_);
    r.status = draining_ ? 503 : 200;
    r.body = draining_ ? "draining\n" : "ok\n";
  } else if (path == "/metrics") {
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_ != nullptr ? metrics_->RenderPrometheus() : "";
  } else {
    r = JsonReply(
        404, ErrorJson(
                 {404, "no route " + path + "; try /v1/completions, /v1/models, /healthz, /metrics",
                  ""}));
  }
  Count(r.status == 404 ? "other" : path, r.status);
  responder->Reply(r);
}

void ApiServer::HandleCompletion(const HttpRequest& request,
                                 const std::shared_ptr<HttpResponder>& responder) {
  const std::string route = "/v1/completions";
  ApiError error;
  std::optional<CompletionRequest> parsed =
      ParseCompletionRequest(request.body, options_.limits, &error);
  if (parsed && !parsed->model.empty() && parsed->model != options_.model_name) {
    error = {404,
             "model: '" + parsed->model + "' is not served here; this worker serves '" +
                 options_.model_name + "'",
             "model"};
    parsed.reset();
  }
  if (!parsed) {
    Count(route, error.status);
    ReplyError(*responder, error);
    return;
  }
  Arrival arrival{0, std::move(*parsed), responder, clock_.Now()};
  {
    std::lock_guard lock(mu_);
    if (draining_ || stopping_) {
      error = {503, "the worker is draining; send the request elsewhere", ""};
    } else if (stats_.in_flight >= options_.max_in_flight) {
      error = {429,
               "the worker has " + std::to_string(stats_.in_flight) +
                   " requests in flight, its limit; retry later",
               ""};
    } else {
      arrival.id = next_id_++;
      ++stats_.accepted;
      ++stats_.in_flight;
      if (in_flight_gauge_ != nullptr)
        in_flight_gauge_->Set(static_cast<int64_t>(stats_.in_flight));
    }
    if (arrival.id == 0) ++stats_.refused;
  }
  if (arrival.id == 0) {
    Count(route, error.status);
    ReplyError(*responder, error,
               error.status == 429 ? HttpHeaders{{"Retry-After", "1"}} : HttpHeaders{});
    return;
  }
  const uint64_t id = arrival.id;
  {
    std::lock_guard lock(mu_);
    arrivals_.push_back(std::move(arrival));
  }
  // After the hand-over: a client gone at once is then a cancel that
  // finds its request.
  responder->OnClientGone([this, id] {
    {
      std::lock_guard lock(mu_);
      cancels_.push_back(id);
    }
    wake_.notify_all();
  });
  wake_.notify_all();
}

// --- The engine thread ------------------------------------------------------

void ApiServer::EngineLoop() {
  std::vector<Arrival> arrivals;
  std::vector<uint64_t> cancels;
  for (;;) {
    const bool stop = TakeInbox(&arrivals, &cancels, /*wait=*/engine_->Idle());
    for (Arrival& a : arrivals) Admit(std::move(a));
    for (uint64_t id : cancels) End(id, EndReason::kClientGone);
    if (stop) break;
    ExpireDeadlines();
    if (!engine_->Idle()) {
      for (const StepOutput& out : engine_->Step()) Deliver(out);
    }
  }
  while (!live_.empty()) End(live_.begin()->first, EndReason::kShutdown);
  engine_->WaitForAbandonedFetches();
}

// Takes what the HTTP thread handed over; true when the loop is to end.
// With `wait` (the engine idle), sleeps until there is something, or until
// a deadline may have passed.
bool ApiServer::TakeInbox(std::vector<Arrival>* arrivals, std::vector<uint64_t>* cancels,
                          bool wait) {
  std::unique_lock lock(mu_);
  if (wait) {
    wake_.wait_for(lock, std::chrono::milliseconds(live_.empty() ? 1000 : 20), [&] {
      return !arrivals_.empty() || !cancels_.empty() || stopping_ || abort_all_;
    });
  }
  arrivals->swap(arrivals_);
  arrivals_.clear();
  cancels->swap(cancels_);
  cancels_.clear();
  if (abort_all_) {
    abort_all_ = false;
    lock.unlock();
    for (Arrival& a : *arrivals) Admit(std::move(a));
    arrivals->clear();
    while (!live_.empty()) End(live_.begin()->first, EndReason::kShutdown);
    lock.lock();
  }
  return stopping_;
}

void ApiServer::Admit(Arrival arrival) {
  auto live = std::make_unique<Live>();
  live->request = std::move(arrival.request);
  live->responder = std::move(arrival.responder);
  live->who = {"cmpl-" + std::to_string(arrival.id), static_cast<int64_t>(std::time(nullptr)),
               options_.model_name};
  live->deadline = arrival.arrived + options_.request_timeout;
  Request r;
  r.id = arrival.id;
  r.prompt = live->request.prompt;
  r.max_new_tokens = live->request.max_tokens;
  r.sampling = live->request.sampling;
  const Status added = engine_->AddRequest(std::move(r));
  if (!added.ok()) {
    ReplyError(*live->responder, {500, "the engine refused the request: " + added.ToString(), ""});
    Leave(&Stats::finished);
    return;
  }
  live_.emplace(arrival.id, std::move(live));
}

void ApiServer::Deliver(const StepOutput& out) {
  auto it = live_.find(out.id);
  if (it == live_.end()) return;
  Live& live = *it->second;
  live.output.insert(live.output.end(), out.new_tokens.begin(), out.new_tokens.end());
  if (live.request.stream) SendTokens(live, out);
  if (out.finished) Finish(out.id, live, out);
}

void ApiServer::SendTokens(Live& live, const StepOutput& out) {
  if (out.new_tokens.empty()) return;
  if (!live.streaming) {
    live.responder->StartStream(200, "text/event-stream");
    live.streaming = true;
  }
  for (size_t i = 0; i < out.new_tokens.size(); ++i) {
    const bool last = out.finished && i + 1 == out.new_tokens.size();
    std::string text = live.decoder.Push(static_cast<uint8_t>(out.new_tokens[i]));
    if (last) text += live.decoder.Flush();
    live.responder->Send(TokenEvent(live.who, out.new_tokens[i], text, last));
  }
}

void ApiServer::Finish(uint64_t id, Live& live, const StepOutput& out) {
  // Counted before the answer goes: a client that has it sees it counted.
  Count("/v1/completions", 200);
  if (metrics_ != nullptr && !live.request.session_id.empty()) {
    // Where a conversation's turn found its prefix: how well turns stick
    // to the worker that holds their history.
    const char* prefix = out.stats.hbm_hit_tokens > 0 ? "hbm"
                         : out.stats.hit_tokens > 0   ? "store"
                                                      : "none";
    metrics_
        ->GetCounter("strata_worker_session_requests_total",
                     "Completions that named a session_id, by where their prefix came from",
                     {{"prefix", prefix}})
        ->Increment();
  }
  if (live.request.stream) {
    if (!live.streaming) live.responder->StartStream(200, "text/event-stream");
    if (live.request.include_usage) {
      live.responder->Send(UsageEvent(live.who, out.stats, live.output.size()));
    }
    live.responder->Send(kDoneEvent);
    live.responder->End();
  } else {
    live.responder->Reply(JsonReply(200, CompletionJson(live.who, live.output, out.stats)));
  }
  live_.erase(id);
  Leave(&Stats::finished);
}

// Ends a request before its last token: the engine lets go of everything
// it holds for it, and a client still there gets an error.
void ApiServer::End(uint64_t id, EndReason reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return;  // finished already
  Live& live = *it->second;
  (void)engine_->AbortRequest(id);
  const char* why = reason == EndReason::kClientGone ? "client_gone"
                    : reason == EndReason::kDeadline ? "deadline"
                                                     : "shutdown";
  if (reason != EndReason::kClientGone) {
    const ApiError error =
        reason == EndReason::kDeadline
            ? ApiError{504,
                       "the request ran past its deadline of " +
                           std::to_string(options_.request_timeout / kNanosPerSecond) + " s",
                       ""}
            : ApiError{503, "the worker is shutting down", ""};
    Count("/v1/completions", error.status);
    if (live.streaming) {
      live.responder->Send(ErrorEvent(error));
      live.responder->End();
    } else {
      ReplyError(*live.responder, error);
    }
  }
  if (metrics_ != nullptr) {
    metrics_
        ->GetCounter("strata_worker_http_cancelled_total",
                     "Completions ended before their last token, by reason", {{"reason", why}})
        ->Increment();
  }
  live_.erase(it);
  Leave(&Stats::cancelled);
}

// A request is over: counted under `outcome`, no longer in flight (a drain
// may be waiting for that).
void ApiServer::Leave(uint64_t Stats::*outcome) {
  std::lock_guard lock(mu_);
  ++(stats_.*outcome);
  --stats_.in_flight;
  if (in_flight_gauge_ != nullptr) in_flight_gauge_->Set(static_cast<int64_t>(stats_.in_flight));
  drained_.notify_all();
}

void ApiServer::ExpireDeadlines() {
  const Nanos now = clock_.Now();
  std::vector<uint64_t> late;
  for (const auto& [id, live] : live_) {
    if (now >= live->deadline) late.push_back(id);
  }
  for (uint64_t id : late) End(id, EndReason::kDeadline);
}

}  // namespace strata::worker

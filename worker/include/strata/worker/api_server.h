// strata-worker serve (docs/serving.md): the HTTP API in front of one
// engine. The HTTP thread only parses, admits or refuses, and hands a
// request over; one engine thread runs Engine::Step and sends each request
// its answer or its tokens (server-sent events) through its HttpResponder.
// A client that goes away, or a request past its deadline, is aborted the
// way Engine::AbortRequest ends any request: its pages, fetch, lease and
// staged commits are let go.
//
//   POST /v1/completions   completion_api.h
//   GET  /v1/models        the served model and its fingerprint
//   GET  /healthz          200 "ok", or 503 "draining"
//   GET  /metrics          strata_worker_* (Prometheus text)
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/clock.h"
#include "strata/http_server.h"
#include "strata/metrics.h"
#include "strata/status.h"
#include "strata/worker/completion_api.h"
#include "strata/worker/engine.h"

namespace strata::worker {

struct ApiServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string model_name = "strata-mini";
  std::string fingerprint;  // the model id, in hex (GET /v1/models)
  CompletionLimits limits;
  // Requests accepted and not yet finished, running or queued; past it a
  // new one gets 429 with Retry-After.
  uint32_t max_in_flight = 320;
  Nanos request_timeout = Seconds(600);  // from arrival to the last token
  size_t max_body_bytes = 4 << 20;
  HttpLimits http;
};

class ApiServer {
 public:
  // Takes the engine: from here on only the engine thread calls it.
  // `metrics` (may be null) must outlive the server.
  static Result<std::unique_ptr<ApiServer>> Start(std::unique_ptr<Engine> engine,
                                                  MetricsRegistry* metrics,
                                                  ApiServerOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  int port() const { return http_->port(); }

  // /healthz says draining and new completions get 503; returns true once
  // every accepted request has finished, false at `grace`, after aborting
  // what is left (those clients get an error).
  bool Drain(Nanos grace);
  // Aborts what runs, then stops the HTTP and engine threads.
  void Stop();

  struct Stats {
    uint64_t accepted = 0;
    uint64_t finished = 0;
    uint64_t cancelled = 0;  // client gone, deadline, shutdown
    uint64_t refused = 0;    // 429 and 503
    uint64_t in_flight = 0;
  };
  Stats stats() const;

 private:
  struct Live;  // one accepted request, the engine thread's
  struct Arrival {
    uint64_t id = 0;
    CompletionRequest request;
    std::shared_ptr<HttpResponder> responder;
    Nanos arrived = 0;
  };
  enum class EndReason { kClientGone, kDeadline, kShutdown };

  ApiServer(std::unique_ptr<Engine> engine, MetricsRegistry* metrics, ApiServerOptions options);

  // The HTTP thread's side.
  void Handle(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder);
  void HandleCompletion(const HttpRequest& request,
                        const std::shared_ptr<HttpResponder>& responder);
  void ReplyError(HttpResponder& responder, const ApiError& error, HttpHeaders headers = {});
  void Count(const std::string& route, int code);

  // The engine thread's side.
  void EngineLoop();
  bool TakeInbox(std::vector<Arrival>* arrivals, std::vector<uint64_t>* cancels, bool wait);
  void Admit(Arrival arrival);
  void Deliver(const StepOutput& out);
  void SendTokens(Live& live, const StepOutput& out);
  void Finish(uint64_t id, Live& live, const StepOutput& out);
  void End(uint64_t id, EndReason reason);
  void Leave(uint64_t Stats::*outcome);
  void ExpireDeadlines();

  std::unique_ptr<Engine> engine_;
  MetricsRegistry* const metrics_;
  const ApiServerOptions options_;
  const int64_t started_unix_;
  SteadyClock clock_;
  std::unique_ptr<HttpServer> http_;
  std::thread engine_thread_;

  mutable std::mutex mu_;  // the inbox and the counts below
  std::condition_variable wake_;
  std::vector<Arrival> arrivals_;
  std::vector<uint64_t> cancels_;
  bool stopping_ = false;
  bool abort_all_ = false;  // Drain's grace ran out
  bool draining_ = false;
  uint64_t next_id_ = 1;
  Stats stats_;
  std::condition_variable drained_;

  std::unordered_map<uint64_t, std::unique_ptr<Live>> live_;  // engine thread only

  Gauge* in_flight_gauge_ = nullptr;
  Gauge* draining_gauge_ = nullptr;
};

}  // namespace strata::worker

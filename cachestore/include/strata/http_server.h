// A small HTTP/1.1 server for the parts of Strata that speak HTTP: the
// node's and worker's /metrics and /healthz (HttpEndpoint), the worker's
// inference API. Every byte comes from a client that may be hostile
// (docs/security.md), so:
//  - one thread runs every connection from a poll loop: a slow or stalled
//    client costs a socket, never a thread, and cannot hold others up;
//  - a request's head is bounded in bytes and header lines, its body in
//    bytes (Content-Length only; chunked bodies are refused), and both must
//    arrive within a deadline; a connection idle past its keep-alive
//    timeout, or with a reply unread past the write timeout, is closed;
//  - a method not served, or a body past its bound, is answered (405 / 413)
//    and the connection closed, the body never read;
//  - past max_connections the connection that has waited longest for a
//    request's head to finish is dropped to make room for the new one.
//
// The handler runs on the server's thread and must not block: it answers at
// once, or keeps its HttpResponder and answers (or streams) later from any
// thread. A client that goes away before its answer ends is reported to the
// responder's OnClientGone callback, so the work done for it can stop.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

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

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string target;  // as sent, query included
  std::string path;    // the target up to '?'
  bool http10 = false;
  HttpHeaders headers;
  std::string body;
  // The first header of that name (case-insensitive); empty when absent.
  std::string_view Header(std::string_view name) const;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  HttpHeaders headers;  // extra ones (Allow, Retry-After, ...)
  bool close = false;   // close the connection after it
};

// One exchange's way back to its client. Thread-safe; may outlive the
// connection and the server (then everything it sends is dropped).
class HttpResponder {
 public:
  struct Exchange;  // shared with the server's loop
  explicit HttpResponder(std::shared_ptr<Exchange> exchange);
  ~HttpResponder();
  HttpResponder(const HttpResponder&) = delete;
  HttpResponder& operator=(const HttpResponder&) = delete;

  // The whole answer; once, and not after StartStream.
  void Reply(const HttpReply& reply);
  // A streamed answer: its head now (chunked on HTTP/1.1; on HTTP/1.0 the
  // body runs to the close), then Send each part, then End.
  void StartStream(int status, const std::string& content_type, const HttpHeaders& headers = {});
  // False once the client is gone (the part is dropped).
  bool Send(std::string_view part);
  void End();

  bool client_gone() const;
  // Called once, on the server's thread, when the client goes (or the
  // server stops) before the answer ended; at once, on this thread, when
  // that already happened. Never called after the answer ended.
  void OnClientGone(std::function<void()> callback);

 private:
  std::shared_ptr<Exchange> exchange_;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  HttpLimits limits;
  std::vector<std::string> methods = {"GET", "HEAD"};  // others get 405
  size_t max_body_bytes = 0;                           // past it: 413
  // Error answers of the server itself (400, 405, 413, 431) as
  // {"error":{"message","type","code"}} instead of a line of text.
  bool json_errors = false;
};

class HttpServer {
 public:
  // `listen` is host:port (port 0 picks a free one; a port in use is an
  // error); `what` names the server in errors.
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& listen, HttpHandler handler,
                                                   HttpServerOptions options,
                                                   const std::string& what = "HTTP");
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // Closes every connection; answers still pending see their client gone.
  void Stop();
  int port() const { return port_; }

  struct Stats {
    uint64_t connections_open = 0;
    uint64_t connections_dropped = 0;  // closed for a limit or timeout, or to make room
    uint64_t requests = 0;             // heads parsed
    uint64_t rejected = 0;             // answered 4xx by the server itself
  };
  Stats stats() const;

  class Loop;  // the poll loop, in http_server.cc

 private:
  HttpServer() = default;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
};

// The body of an error answer: a line of text, or OpenAI's error object.
std::string HttpErrorBody(int status, std::string_view message, bool json,
                          std::string_view param = {});
const char* HttpReason(int status);

}  // namespace strata

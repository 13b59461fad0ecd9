#include "strata/http_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/json_text.h"
#include "util/listen_socket.h"
#include "util/mutex.h"

namespace strata {
namespace {

// After an error reply the connection is half-closed and what the client
// still sends is read and dropped for this long (at most this many bytes),
// so the close does not reset the connection before the reply is read.
constexpr Nanos kLingerTime = Seconds(1);
constexpr size_t kLingerBytes = 64 << 10;
constexpr size_t kReadChunk = 16 << 10;
// A streamed answer the client does not read is cut off past this many
// bytes waiting (before the write timeout, so memory stays bounded).
constexpr size_t kMaxPendingBytes = 8 << 20;
// How long a stopping server goes on writing answers that had ended.
constexpr Nanos kStopFlushTime = Seconds(2);

Nanos Now() { return SteadyClock().Now(); }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string Head(int status, const std::string& content_type, const HttpHeaders& headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + HttpReason(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\n";
  for (const auto& [name, value] : headers) {
    out.append(name).append(": ").append(value).append("\r\n");
  }
  return out;
}

}  // namespace

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (EqualsIgnoreCase(n, name)) return v;
  }
  return {};
}

const char* HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Error";
  }
}

std::string HttpErrorBody(int status, std::string_view message, bool json, std::string_view param) {
  if (!json) return std::string(message) + "\n";
  std::string out = "{\"error\":{\"message\":";
  AppendJsonString(message, &out);
  out += ",\"type\":";
  AppendJsonString(status >= 500 ? "server_error" : "invalid_request_error", &out);
  out += ",\"param\":";
  if (param.empty()) {
    out += "null";
  } else {
    AppendJsonString(param, &out);
  }
  out += ",\"code\":" + std::to_string(status) + "}}\n";
  return out;
}

// Wakes the loop from another thread; outlives the loop while a responder
// holds it.
struct Waker {
  explicit Waker(int fd) : fd(fd) {}
  ~Waker() { close(fd); }
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  void Wake() const {
    const uint64_t one = 1;
    (void)!write(fd, &one, sizeof(one));
  }
  const int fd;
};

struct HttpResponder::Exchange {
  Exchange(std::shared_ptr<Waker> waker, bool head_only, bool http10, bool close_after)
      : waker(std::move(waker)), head_only(head_only), http10(http10), close_after(close_after) {}

  // What the loop takes on each turn.
  struct Taken {
    std::string bytes;
    bool ended = false;
    bool close_after = false;
    bool overflow = false;
  };
  Taken Take() {
    MutexLock lock(mu);
    Taken t;
    t.bytes.swap(out);
    t.ended = ended;
    t.close_after = close_after;
    t.overflow = overflow;
    return t;
  }

  // The client is gone (or the server stopped): later parts are dropped;
  // the callback runs if the answer had not ended.
  void MarkGone() {
    std::function<void()> callback;
    {
      MutexLock lock(mu);
      if (gone) return;
      gone = true;
      out.clear();
      if (!ended) callback = std::move(on_gone);
      on_gone = nullptr;
    }
    if (callback) callback();
  }

  const std::shared_ptr<Waker> waker;
  const bool head_only;  // HEAD: headers, no body
  const bool http10;
  Mutex mu;
  std::string out ABSL_GUARDED_BY(mu);  // bytes for the loop to send
  bool answered ABSL_GUARDED_BY(mu) = false;
  bool streaming ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  bool close_after ABSL_GUARDED_BY(mu);
  bool gone ABSL_GUARDED_BY(mu) = false;
  bool overflow ABSL_GUARDED_BY(mu) = false;
  std::function<void()> on_gone ABSL_GUARDED_BY(mu);
};

HttpResponder::HttpResponder(std::shared_ptr<Exchange> exchange) : exchange_(std::move(exchange)) {}

// A responder dropped without an answer would leave its client waiting for
// ever: it answers 500.
HttpResponder::~HttpResponder() {
  bool unanswered;
  bool streaming;
  {
    MutexLock lock(exchange_->mu);
    unanswered = !exchange_->answered && !exchange_->gone;
    streaming = exchange_->streaming && !exchange_->ended;
  }
  if (unanswered) {
    HttpReply r;
    r.status = 500;
    r.body = "no answer\n";
    r.close = true;
    Reply(r);
  } else if (streaming) {
    End();
  }
}

void HttpResponder::Reply(const HttpReply& reply) {
  Exchange& e = *exchange_;
  {
    MutexLock lock(e.mu);
    if (e.answered || e.gone) return;
    e.answered = true;
    e.ended = true;
    e.close_after = e.close_after || reply.close;
    std::string out = Head(reply.status, reply.content_type, reply.headers);
    out += "Content-Length: " + std::to_string(reply.body.size()) + "\r\n";
    out += e.close_after ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    if (!e.head_only) out += reply.body;
    e.out += out;
  }
  e.waker->Wake();
}

void HttpResponder::StartStream(int status, const std::string& content_type,
                                const HttpHeaders& headers) {
  Exchange& e = *exchange_;
  {
    MutexLock lock(e.mu);
    if (e.answered || e.gone) return;
    e.answered = true;
    e.streaming = true;
    std::string out = Head(status, content_type, headers);
    out += "Cache-Control: no-cache\r\n";
    if (e.http10) {
      e.close_after = true;  // the body runs to the close
      out += "Connection: close\r\n\r\n";
    } else {
      out += "Transfer-Encoding: chunked\r\n";
      out += e.close_after ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    }
    e.out += out;
    if (e.head_only) e.ended = true;
  }
  e.waker->Wake();
}

bool HttpResponder::Send(std::string_view part) {
  Exchange& e = *exchange_;
  {
    MutexLock lock(e.mu);
    if (e.gone || e.overflow) return false;
    if (!e.streaming || e.ended || part.empty()) return true;  // an empty chunk would end it
    if (e.out.size() + part.size() > kMaxPendingBytes) {
      e.overflow = true;  // the loop drops the connection
    } else if (e.http10) {
      e.out += part;
    } else {
      char size[20];
      auto [end, ec] = std::to_chars(size, size + sizeof(size), part.size(), 16);
      e.out.append(size, end);
      e.out += "\r\n";
      e.out += part;
      e.out += "\r\n";
    }
  }
  e.waker->Wake();
  return !client_gone();
}

void HttpResponder::End() {
  Exchange& e = *exchange_;
  {
    MutexLock lock(e.mu);
    if (e.gone || !e.streaming || e.ended) return;
    e.ended = true;
    if (!e.http10) e.out += "0\r\n\r\n";
  }
  e.waker->Wake();
}

bool HttpResponder::client_gone() const {
  MutexLock lock(exchange_->mu);
  return exchange_->gone || exchange_->overflow;
}

void HttpResponder::OnClientGone(std::function<void()> callback) {
  {
    MutexLock lock(exchange_->mu);
    if (exchange_->ended) return;
    if (!exchange_->gone) {
      exchange_->on_gone = std::move(callback);
      return;
    }
  }
  callback();
}

class HttpServer::Loop {
 public:
  Loop(int listen_fd, std::shared_ptr<Waker> waker, HttpHandler handler, HttpServerOptions options)
      : listen_fd_(listen_fd),
        waker_(std::move(waker)),
        handler_(std::move(handler)),
        options_(std::move(options)),
        limits_(options_.limits) {
    for (size_t i = 0; i < options_.methods.size(); ++i) {
      allow_ += (i ? ", " : "") + options_.methods[i];
    }
  }
  ~Loop() { close(listen_fd_); }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  void Run() {
    std::vector<pollfd> fds;
    Nanos flush_until = 0;
    for (;;) {
      if (stop_.load(std::memory_order_acquire)) {
        if (flush_until == 0) flush_until = Now() + kStopFlushTime;
        if (!KeepOnlyFinishingAnswers() || Now() >= flush_until) break;
      }
      fds.clear();
      // Out of descriptors, the listener stays readable: rest it a moment.
      // Stopping, it accepts no one.
      const bool accepting = Now() >= accept_again_at_ && flush_until == 0;
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      fds.push_back({waker_->fd, POLLIN, 0});
      for (const Connection& c : connections_) fds.push_back({c.fd, Events(c), 0});
      (void)poll(fds.data(), fds.size(), PollTimeoutMs());
      if ((fds[1].revents & POLLIN) != 0) {
        uint64_t count;
        (void)!read(waker_->fd, &count, sizeof(count));
      }
      const Nanos now = Now();
      size_t i = 2;
      for (auto it = connections_.begin(); it != connections_.end(); ++i) {
        const bool keep = Turn(*it, fds[i].revents, now);
        if (keep) {
          ++it;
        } else {
          // A client that closed, or a lingering close that ended, is a
          // clean end; a timeout is not.
          Drop(it, /*forced=*/fds[i].revents == 0 && it->state != State::kLingering);
        }
      }
      if ((fds[0].revents & POLLIN) != 0) Accept(now);
    }
    while (!connections_.empty()) {
      auto it = connections_.begin();
      Drop(it, /*forced=*/false);
    }
  }

  void Stop() {
    stop_.store(true, std::memory_order_release);
    waker_->Wake();
  }

  // Stopping: drops every connection but those whose answer has ended and
  // still has bytes to write, so a reply or a stream finished just before
  // the stop reaches its client. False when none is left.
  bool KeepOnlyFinishingAnswers() {
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& c = *it;
      const bool finishing =
          c.state == State::kAnswering && Pump(c) && c.ended && c.written < c.out.size();
      if (finishing) {
        ++it;
      } else {
        Drop(it, /*forced=*/false);
      }
    }
    return !connections_.empty();
  }

  HttpServer::Stats stats() const {
    return {open_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed),
            requests_.load(std::memory_order_relaxed), rejected_.load(std::memory_order_relaxed)};
  }

 private:
  enum class State : uint8_t { kReadingHead, kReadingBody, kAnswering, kLingering };
  struct Connection {
    int fd = -1;
    State state = State::kReadingHead;
    std::string in;   // the request being read (and what was pipelined after it)
    std::string out;  // answer bytes not yet written
    size_t written = 0;
    Nanos since = 0;         // when the current state began (writing: the last progress)
    bool has_bytes = false;  // the head being read has begun
    size_t requests = 0;
    size_t lingered = 0;
    HttpRequest request;  // its head, while its body is read
    size_t head_bytes = 0;
    size_t body_bytes = 0;
    std::shared_ptr<HttpResponder::Exchange> exchange;  // while answering; null for our own
    bool ended = false;                                 // the answer is all in `out`
    bool close_after = false;
  };
  using Iter = std::list<Connection>::iterator;

  static int16_t Events(const Connection& c) {
    if (c.state != State::kAnswering) return POLLIN;
    // While an answer is made, only the client's going is watched for: a
    // pipelined request waits unread until the answer ends.
    return static_cast<int16_t>(POLLRDHUP | (c.written < c.out.size() ? POLLOUT : 0));
  }

  Nanos Deadline(const Connection& c) const {
    switch (c.state) {
      case State::kReadingHead:
        return c.since +
               (c.has_bytes || c.requests == 0 ? limits_.head_timeout : limits_.keep_alive_timeout);
      case State::kReadingBody:
        return c.since + limits_.head_timeout;
      case State::kAnswering:
        // The handler's work has no deadline here; a client that does not
        // read what is ready has.
        return c.written < c.out.size() ? c.since + limits_.write_timeout : kNever;
      case State::kLingering:
        return c.since + kLingerTime;
    }
    return c.since;
  }
  static constexpr Nanos kNever = INT64_MAX;
  bool Expired(const Connection& c, Nanos now) const { return now >= Deadline(c); }

  int PollTimeoutMs() const {
    const Nanos now = Now();
    Nanos next = now + Seconds(1);
    if (accept_again_at_ > now) next = std::min(next, accept_again_at_);
    for (const Connection& c : connections_) next = std::min(next, Deadline(c));
    return static_cast<int>(std::max<Nanos>(0, next - now) / kNanosPerMilli + 1);
  }

  // Counted before the close: a client that sees its connection end then
  // sees it in stats() too.
  void Drop(Iter& it, bool forced) {
    if (forced) dropped_.fetch_add(1, std::memory_order_relaxed);
    open_.fetch_sub(1, std::memory_order_relaxed);
    close(it->fd);
    std::shared_ptr<HttpResponder::Exchange> exchange = std::move(it->exchange);
    it = connections_.erase(it);
    if (exchange != nullptr) exchange->MarkGone();
  }

  void Accept(Nanos now) {
    for (int n = 0; n < 64; ++n) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) accept_again_at_ = now + 100 * kNanosPerMilli;
        return;
      }
      if (connections_.size() >= limits_.max_connections && !MakeRoom()) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        close(fd);  // every connection has an answer under way
        continue;
      }
      Connection c;
      c.fd = fd;
      c.since = now;
      connections_.push_back(std::move(c));
      open_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Drops the connection that has waited longest for its request (a
  // stalled or slow client); never one whose answer is under way.
  bool MakeRoom() {
    auto victim = connections_.end();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (it->state == State::kAnswering) continue;
      if (victim == connections_.end() || it->since < victim->since) victim = it;
    }
    if (victim == connections_.end()) return false;
    Drop(victim, /*forced=*/true);
    return true;
  }

  // One loop turn for `c`; false when it is to be closed.
  bool Turn(Connection& c, int16_t revents, Nanos now) {
    switch (c.state) {
      case State::kReadingHead:
      case State::kReadingBody:
        return revents != 0 ? Read(c, now) : !Expired(c, now);
      case State::kAnswering:
        if ((revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return false;  // the client went
        return Pump(c) && Write(c, now);
      case State::kLingering:
        return revents != 0 ? Linger(c, now) : !Expired(c, now);
    }
    return false;
  }

  bool Read(Connection& c, Nanos now) {
    char buf[kReadChunk];
    const size_t cap =
        limits_.max_head_bytes + (c.state == State::kReadingBody ? c.head_bytes + c.body_bytes : 0);
    while (c.in.size() <= cap) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;  // the client closed
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        return false;
      }
      if (!c.has_bytes) {
        c.has_bytes = true;
        c.since = now;
      }
      c.in.append(buf, static_cast<size_t>(n));
    }
    return Dispatch(c, now);
  }

  // Moves the request in c.in on as far as it is complete.
  bool Dispatch(Connection& c, Nanos now) {
    if (c.state == State::kReadingHead) {
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos || end > limits_.max_head_bytes) {
        if (c.in.size() <= limits_.max_head_bytes) return !Expired(c, now);  // wait for more
        return Refuse(c, 431, "request head too large", now);
      }
      requests_.fetch_add(1, std::memory_order_relaxed);
      int refusal = 0;
      std::string why;
      if (!ParseHead(std::string_view(c.in).substr(0, end), c, &refusal, &why)) {
        return Refuse(c, refusal, why, now);
      }
      c.head_bytes = end + 4;
      c.state = State::kReadingBody;
      c.since = now;
    }
    if (c.in.size() < c.head_bytes + c.body_bytes) return !Expired(c, now);
    c.request.body = c.in.substr(c.head_bytes, c.body_bytes);
    c.in.erase(0, c.head_bytes + c.body_bytes);
    return Answer(c, now);
  }

  // Parses `text` (the head without its blank line) into c.request and
  // c.body_bytes; false with the status and reason to refuse it with.
  bool ParseHead(std::string_view text, Connection& c, int* refusal, std::string* why) const {
    HttpRequest& r = c.request;
    r = HttpRequest();
    size_t line_end = text.find("\r\n");
    std::string_view line = text.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
      return Fail(400, "malformed request line", refusal, why);
    }
    const std::string_view version = line.substr(sp2 + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
      return Fail(400, "only HTTP/1.0 and HTTP/1.1 are served", refusal, why);
    }
    r.method = line.substr(0, sp1);
    r.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    r.path = r.target.substr(0, r.target.find('?'));
    r.http10 = version == "HTTP/1.0";
    if (std::find(options_.methods.begin(), options_.methods.end(), r.method) ==
        options_.methods.end()) {
      return Fail(405, "only " + allow_ + " are served", refusal, why);
    }
    while (line_end != std::string_view::npos) {
      const size_t start = line_end + 2;
      line_end = text.find("\r\n", start);
      line = text.substr(start, line_end == std::string_view::npos ? line_end : line_end - start);
      const size_t colon = line.find(':');
      if (colon == 0 || colon == std::string_view::npos ||
          line.substr(0, colon).find_first_of(" \t") != std::string_view::npos) {
        return Fail(400, "malformed header line", refusal, why);
      }
      if (r.headers.size() == limits_.max_header_lines) {
        return Fail(431, "too many header lines", refusal, why);
      }
      r.headers.emplace_back(line.substr(0, colon), Trim(line.substr(colon + 1)));
    }
    return ParseBodyLength(c, refusal, why);
  }

  // A body is read only when its length is announced and within bounds: one
  // that is refused ends the connection, so its bytes can never be taken
  // for the next request.
  bool ParseBodyLength(Connection& c, int* refusal, std::string* why) const {
    c.body_bytes = 0;
    bool has_length = false;
    for (const auto& [name, value] : c.request.headers) {
      if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
        if (options_.max_body_bytes == 0) {
          return Fail(413, c.request.method + " requests carry no body here", refusal, why);
        }
        return Fail(411, "chunked request bodies are not accepted; send Content-Length", refusal,
                    why);
      }
      if (!EqualsIgnoreCase(name, "Content-Length")) continue;
      size_t n = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || end != value.data() + value.size() || value.empty() ||
          (has_length && n != c.body_bytes)) {
        return Fail(400, "malformed Content-Length", refusal, why);
      }
      has_length = true;
      c.body_bytes = n;
    }
    if (c.body_bytes > options_.max_body_bytes) {
      if (options_.max_body_bytes == 0) {
        return Fail(413, c.request.method + " requests carry no body here", refusal, why);
      }
      return Fail(413,
                  "request body of " + std::to_string(c.body_bytes) +
                      " bytes is past the limit of " + std::to_string(options_.max_body_bytes),
                  refusal, why);
    }
    return true;
  }

  static bool Fail(int status, std::string text, int* refusal, std::string* why) {
    *refusal = status;
    *why = std::move(text);
    return false;
  }

  bool WantsClose(const Connection& c) const {
    bool close = c.request.http10;
    for (const auto& [name, value] : c.request.headers) {
      if (!EqualsIgnoreCase(name, "Connection")) continue;
      if (EqualsIgnoreCase(value, "close")) close = true;
      if (EqualsIgnoreCase(value, "keep-alive")) close = false;
    }
    return close || c.requests + 1 >= limits_.max_requests_per_connection;
  }

  // Hands the complete request to the handler.
  bool Answer(Connection& c, Nanos now) {
    ++c.requests;
    c.state = State::kAnswering;
    c.since = now;
    c.ended = false;
    c.exchange = std::make_shared<HttpResponder::Exchange>(waker_, c.request.method == "HEAD",
                                                           c.request.http10, WantsClose(c));
    auto responder = std::make_shared<HttpResponder>(c.exchange);
    handler_(std::move(c.request), std::move(responder));
    c.request = HttpRequest();
    return Pump(c) && Write(c, now);
  }

  // Answers a request the server itself refuses, then closes.
  bool Refuse(Connection& c, int status, const std::string& why, Nanos now) {
    if (status >= 400 && status < 500) rejected_.fetch_add(1, std::memory_order_relaxed);
    HttpHeaders headers;
    if (status == 405) headers.emplace_back("Allow", allow_);
    const std::string body = HttpErrorBody(status, why, options_.json_errors);
    c.out = Head(status, options_.json_errors ? "application/json" : "text/plain", headers);
    c.out += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    c.out += body;
    c.written = 0;
    c.ended = true;
    c.close_after = true;
    c.exchange = nullptr;
    c.state = State::kAnswering;
    c.since = now;
    ++c.requests;
    return Write(c, now);
  }

  // Takes what the answer's maker has ready; false when it overflowed.
  bool Pump(Connection& c) {
    if (c.exchange == nullptr) return true;
    HttpResponder::Exchange::Taken t = c.exchange->Take();
    if (t.overflow) return false;
    if (!t.bytes.empty()) {
      if (c.written == c.out.size()) {
        c.out.clear();
        c.written = 0;
        c.since = Now();
      }
      c.out += t.bytes;
    }
    c.ended = t.ended;
    c.close_after = t.close_after;
    return true;
  }

  bool Write(Connection& c, Nanos now) {
    while (c.written < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return !Expired(c, now);
        if (errno == EINTR) continue;
        return false;
      }
      c.written += static_cast<size_t>(n);
      c.since = now;
    }
    c.out.clear();
    c.written = 0;
    if (!c.ended) return true;  // more of the answer to come
    c.exchange = nullptr;
    c.since = now;
    if (c.close_after) {
      // Half-close, then drop what the client still sends for a moment: a
      // close with unread bytes would reset the connection and could lose
      // the reply on its way.
      shutdown(c.fd, SHUT_WR);
      c.state = State::kLingering;
      c.in.clear();
      return true;
    }
    c.state = State::kReadingHead;
    c.has_bytes = !c.in.empty();
    // A pipelined request already here is answered now.
    return c.has_bytes ? Dispatch(c, now) : true;
  }

  bool Linger(Connection& c, Nanos now) {
    if (Expired(c, now)) return false;  // a trickle of bytes does not keep it
    char buf[kReadChunk];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.lingered += static_cast<size_t>(n);
      if (c.lingered > kLingerBytes) return false;
    }
  }

  const int listen_fd_;
  const std::shared_ptr<Waker> waker_;
  const HttpHandler handler_;
  const HttpServerOptions options_;
  const HttpLimits& limits_;
  std::string allow_;                  // "GET, HEAD"
  std::list<Connection> connections_;  // the loop thread's only
  Nanos accept_again_at_ = 0;          // likewise
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> open_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> rejected_{0};
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                      HttpHandler handler,
                                                      HttpServerOptions options,
                                                      const std::string& what) {
  Result<ListeningSocket> socket = ListenOn(listen, what);
  if (!socket.ok()) return socket.status();
  const int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    close(socket->fd);
    return Internal("eventfd for the " + what + " server failed");
  }
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->port_ = socket->port;
  server->loop_ = std::make_unique<Loop>(socket->fd, std::make_shared<Waker>(wake),
                                         std::move(handler), std::move(options));
  server->thread_ = std::thread([loop = server->loop_.get()] { loop->Run(); });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (loop_ != nullptr) loop_->Stop();
  if (thread_.joinable()) thread_.join();
}

HttpServer::Stats HttpServer::stats() const { return loop_ != nullptr ? loop_->stats() : Stats{}; }

}  // namespace strata

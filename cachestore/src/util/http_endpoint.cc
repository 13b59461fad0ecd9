#include "strata/http_endpoint.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/listen_socket.h"

namespace strata {
namespace {

// After an error reply the connection is half-closed and what the client
// still sends is read and dropped for this long (at most this many bytes),
// so the close does not reset the connection before the reply is read.
constexpr Nanos kLingerTime = Seconds(1);
constexpr size_t kLingerBytes = 64 << 10;
constexpr size_t kReadChunk = 4096;

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

struct Reply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  bool close = false;
  bool head_only = false;  // HEAD: headers, no body
  std::string allow;       // 405
};

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

std::string Serialize(const Reply& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (!r.allow.empty()) out += "Allow: " + r.allow + "\r\n";
  out += r.close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  if (!r.head_only) out += r.body;
  return out;
}

Reply Error(int status, std::string text) {
  Reply r;
  r.status = status;
  r.body = std::move(text) + "\n";
  r.close = true;
  return r;
}

// A complete request head: the request line and its header lines.
struct Head {
  std::string_view method;
  std::string_view target;
  std::string_view version;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
};

// Parses `text` (without the blank line that ends it); a reply to send
// instead when it is not a request this endpoint serves.
Result<Head> ParseHead(std::string_view text, const HttpLimits& limits, Reply* refusal) {
  Head head;
  size_t line_end = text.find("\r\n");
  std::string_view line = text.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      line.find(' ', sp2 + 1) != std::string_view::npos) {
    *refusal = Error(400, "malformed request line");
    return InvalidArgument("malformed request line");
  }
  head.method = line.substr(0, sp1);
  head.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  head.version = line.substr(sp2 + 1);
  if (head.version != "HTTP/1.1" && head.version != "HTTP/1.0") {
    *refusal = Error(400, "only HTTP/1.0 and HTTP/1.1 are served");
    return InvalidArgument("bad version");
  }
  if (head.method != "GET" && head.method != "HEAD") {
    *refusal = Error(405, "only GET and HEAD are served");
    refusal->allow = "GET, HEAD";
    return InvalidArgument("method");
  }
  while (line_end != std::string_view::npos) {
    const size_t start = line_end + 2;
    line_end = text.find("\r\n", start);
    line = text.substr(start, line_end == std::string_view::npos ? line_end : line_end - start);
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos ||
        line.substr(0, colon).find_first_of(" \t") != std::string_view::npos) {
      *refusal = Error(400, "malformed header line");
      return InvalidArgument("header");
    }
    if (head.headers.size() == limits.max_header_lines) {
      *refusal = Error(431, "too many header lines");
      return InvalidArgument("headers");
    }
    head.headers.emplace_back(line.substr(0, colon), Trim(line.substr(colon + 1)));
  }
  for (const auto& [name, value] : head.headers) {
    // A body is never read: one that is announced ends the connection, so
    // its bytes can never be taken for the next request.
    if (EqualsIgnoreCase(name, "Transfer-Encoding") ||
        (EqualsIgnoreCase(name, "Content-Length") && value != "0")) {
      *refusal = Error(413, "GET and HEAD requests carry no body here");
      return InvalidArgument("body");
    }
  }
  return head;
}

bool WantsClose(const Head& head) {
  bool close = head.version == "HTTP/1.0";
  for (const auto& [name, value] : head.headers) {
    if (!EqualsIgnoreCase(name, "Connection")) continue;
    if (EqualsIgnoreCase(value, "close")) close = true;
    if (EqualsIgnoreCase(value, "keep-alive")) close = false;
  }
  return close;
}

}  // namespace

class HttpEndpoint::Loop {
 public:
  Loop(int listen_fd, int wake_fd, std::function<std::string()> render_metrics,
       std::function<bool()> healthy, HttpLimits limits)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        render_metrics_(std::move(render_metrics)),
        healthy_(std::move(healthy)),
        limits_(limits) {}
  ~Loop() {
    for (Connection& c : connections_) close(c.fd);
    close(listen_fd_);
    close(wake_fd_);
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  void Run() {
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      fds.clear();
      // Out of descriptors, the listener stays readable: rest it a moment.
      fds.push_back({Now() >= accept_again_at_ ? listen_fd_ : -1, POLLIN, 0});
      fds.push_back({wake_fd_, POLLIN, 0});
      for (const Connection& c : connections_) {
        fds.push_back(
            {c.fd, static_cast<int16_t>(c.state == State::kWriting ? POLLOUT : POLLIN), 0});
      }
      (void)poll(fds.data(), fds.size(), PollTimeoutMs());
      const Nanos now = Now();
      size_t i = 2;
      for (auto it = connections_.begin(); it != connections_.end(); ++i) {
        const bool ready = fds[i].revents != 0;
        const bool keep = ready ? Serve(*it, now) : !Expired(*it, now);
        if (keep) {
          ++it;
        } else {
          // A client that closed, or a lingering close that ended, is a
          // clean end; a timeout is not.
          Drop(it, /*forced=*/!ready && it->state != State::kLingering);
        }
      }
      if ((fds[0].revents & POLLIN) != 0) Accept(now);
    }
  }

  void Stop() {
    stop_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  HttpEndpoint::Stats stats() const {
    return {open_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed),
            requests_.load(std::memory_order_relaxed), rejected_.load(std::memory_order_relaxed)};
  }

 private:
  enum class State : uint8_t { kReadingHead, kWriting, kLingering };
  struct Connection {
    int fd = -1;
    State state = State::kReadingHead;
    std::string in;   // the head being read (and what was pipelined after it)
    std::string out;  // the reply not yet written
    size_t written = 0;
    Nanos since = 0;         // when the current state began
    bool has_bytes = false;  // the head being read has begun
    bool close_after = false;
    size_t requests = 0;
    size_t lingered = 0;
  };
  using Iter = std::list<Connection>::iterator;

  Nanos Deadline(const Connection& c) const {
    switch (c.state) {
      case State::kReadingHead:
        return c.since +
               (c.has_bytes || c.requests == 0 ? limits_.head_timeout : limits_.keep_alive_timeout);
      case State::kWriting:
        return c.since + limits_.write_timeout;
      case State::kLingering:
        return c.since + kLingerTime;
    }
    return c.since;
  }
  bool Expired(const Connection& c, Nanos now) const { return now >= Deadline(c); }

  int PollTimeoutMs() const {
    Nanos next = Now() + Seconds(1);
    if (accept_again_at_ > Now()) next = std::min(next, accept_again_at_);
    for (const Connection& c : connections_) next = std::min(next, Deadline(c));
    return static_cast<int>(std::max<Nanos>(0, next - Now()) / kNanosPerMilli + 1);
  }

  // Counted before the close: a client that sees its connection end then
  // sees it in stats() too.
  void Drop(Iter& it, bool forced) {
    if (forced) dropped_.fetch_add(1, std::memory_order_relaxed);
    open_.fetch_sub(1, std::memory_order_relaxed);
    close(it->fd);
    it = connections_.erase(it);
  }

  void Accept(Nanos now) {
    for (int n = 0; n < 64; ++n) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) accept_again_at_ = now + 100 * kNanosPerMilli;
        return;
      }
      if (connections_.size() >= limits_.max_connections) MakeRoom();
      Connection c;
      c.fd = fd;
      c.since = now;
      connections_.push_back(std::move(c));
      open_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Drops the connection that has waited longest for a head (a stalled
  // or slow client); with none, the oldest of any.
  void MakeRoom() {
    auto victim = connections_.end();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (it->state == State::kWriting) continue;
      if (victim == connections_.end() || it->since < victim->since) victim = it;
    }
    if (victim == connections_.end()) victim = connections_.begin();
    Drop(victim, /*forced=*/true);
  }

  // Handles readiness of `c`; false when it is to be closed.
  bool Serve(Connection& c, Nanos now) {
    switch (c.state) {
      case State::kReadingHead:
        return ReadHead(c, now);
      case State::kWriting:
        return Write(c, now);
      case State::kLingering:
        return Linger(c, now);
    }
    return false;
  }

  bool ReadHead(Connection& c, Nanos now) {
    char buf[kReadChunk];
    while (c.in.size() <= limits_.max_head_bytes) {
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

  // Answers the head in c.in once it is complete (or too large).
  bool Dispatch(Connection& c, Nanos now) {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos || end > limits_.max_head_bytes) {
      if (c.in.size() <= limits_.max_head_bytes) return !Expired(c, now);  // wait for more
      return Respond(c, Error(431, "request head too large"), now);
    }
    requests_.fetch_add(1, std::memory_order_relaxed);
    Reply refusal;
    Result<Head> head = ParseHead(std::string_view(c.in).substr(0, end), limits_, &refusal);
    if (!head.ok()) return Respond(c, refusal, now);
    Reply reply = Route(*head);
    reply.close =
        reply.close || WantsClose(*head) || c.requests + 1 >= limits_.max_requests_per_connection;
    c.in.erase(0, end + 4);
    return Respond(c, reply, now);
  }

  Reply Route(const Head& head) const {
    const std::string_view path = head.target.substr(0, head.target.find('?'));
    Reply r;
    r.head_only = head.method == "HEAD";
    if (path == "/metrics") {
      r.body = render_metrics_();
      r.content_type = "text/plain; version=0.0.4";
    } else if (path == "/healthz") {
      const bool ok = healthy_();
      r.status = ok ? 200 : 503;
      r.body = ok ? "ok\n" : "draining\n";
    } else {
      r.status = 404;
      r.body = "not found; try /metrics or /healthz\n";
    }
    return r;
  }

  bool Respond(Connection& c, const Reply& reply, Nanos now) {
    if (reply.status >= 400 && reply.status < 500 && reply.status != 404) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
    }
    c.out = Serialize(reply);
    c.written = 0;
    c.close_after = reply.close;
    c.state = State::kWriting;
    c.since = now;
    ++c.requests;
    return Write(c, now);
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
    }
    c.out.clear();
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
  const int wake_fd_;
  const std::function<std::string()> render_metrics_;
  const std::function<bool()> healthy_;
  const HttpLimits limits_;
  std::list<Connection> connections_;  // the loop thread's only
  Nanos accept_again_at_ = 0;          // likewise
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> open_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> rejected_{0};
};

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, std::function<std::string()> render_metrics,
    std::function<bool()> healthy, HttpLimits limits) {
  Result<ListeningSocket> socket = ListenOn(listen, "HTTP");
  if (!socket.ok()) return socket.status();
  const int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    close(socket->fd);
    return Internal("eventfd for the HTTP endpoint failed");
  }
  std::unique_ptr<HttpEndpoint> ep(new HttpEndpoint());
  ep->port_ = socket->port;
  ep->loop_ = std::make_unique<Loop>(socket->fd, wake, std::move(render_metrics),
                                     std::move(healthy), limits);
  ep->thread_ = std::thread([loop = ep->loop_.get()] { loop->Run(); });
  return ep;
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

void HttpEndpoint::Stop() {
  if (loop_ != nullptr) loop_->Stop();
  if (thread_.joinable()) thread_.join();
}

HttpEndpoint::Stats HttpEndpoint::stats() const {
  return loop_ != nullptr ? loop_->stats() : Stats{};
}

}  // namespace strata

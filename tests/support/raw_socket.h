// Raw TCP on loopback for tests that talk to a server as an attacker would:
// bytes of their choosing, at the pace of their choosing.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace strata::testing {

// A blocking connection to 127.0.0.1:`port` whose reads give up after
// `recv_timeout_s`; -1 on failure.
inline int ConnectLoopback(int port, int recv_timeout_s = 10) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{.tv_sec = recv_timeout_s, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends on `fd` until it closes (or the read timeout).
inline std::string ReadAll(int fd) {
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, n);
  return reply;
}

// Sends `request` on a fresh connection and returns what comes back before
// the server closes or 10 s pass.
inline std::string RawExchange(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string reply;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    reply = ReadAll(fd);
  }
  close(fd);
  return reply;
}

// Sends up to `limit` bytes of a request head that never ends (header
// lines of 4 KB) and returns how many the server took before it closed.
inline size_t SendEndlessHead(int fd, size_t limit) {
  const std::string line = "X-Endless: " + std::string(4000, 'a') + "\r\n";
  const std::string first = "GET /metrics HTTP/1.1\r\n" + line;
  size_t sent = 0;
  while (sent < limit) {
    const std::string& piece = sent == 0 ? first : line;
    const ssize_t n = send(fd, piece.data(), piece.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return sent;
}

// Resident memory of process `pid` (VmRSS), 0 if unknown.
inline uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace strata::testing

#include "util/listen_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>

namespace strata {

std::string BareHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

Result<ListeningSocket> ListenOn(const std::string& listen, const std::string& what) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    auto [p, ec] = std::from_chars(listen.data() + colon + 1, listen.data() + listen.size(), port);
    if (ec != std::errc() || p != listen.data() + listen.size()) port = -1;
  }
  if (colon == std::string::npos || port < 0 || port > 65535) {
    return InvalidArgument("the " + what + " listen address must be host:port, got '" + listen +
                           "'");
  }
  // getaddrinfo wants the bare address.
  const std::string host = BareHost(listen.substr(0, colon));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &found) != 0) {
    return Unavailable("cannot resolve the " + what + " listen address " + listen);
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return Unavailable("cannot listen for " + what + " on " + listen + " (in use?)");
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return ListeningSocket{fd, bound_port};
}

}  // namespace strata

// A listening TCP socket for "host:port" (host a name, an address, an IPv6
// address in brackets, or empty for every interface; port 0 picks a free
// one), shared by the node's HTTP endpoint and its gRPC front door.
#pragma once

#include <string>

#include "strata/status.h"

namespace strata {

struct ListeningSocket {
  int fd = -1;  // non-blocking, close-on-exec; the caller owns it
  int port = 0;
};

// "::1" for "[::1]", as gRPC's listen writes an IPv6 host; any other host
// as it is.
std::string BareHost(std::string host);

// SO_REUSEADDR (a restart binds past TIME_WAIT) and no SO_REUSEPORT, so a
// port another process listens on is UNAVAILABLE, never a shared port.
// `what` names the listener in errors ("HTTP", "gRPC").
Result<ListeningSocket> ListenOn(const std::string& listen, const std::string& what);

}  // namespace strata

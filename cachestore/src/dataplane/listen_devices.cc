#include "dataplane/listen_devices.h"

#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "util/listen_socket.h"

namespace strata::dataplane::internal {
namespace {

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a == nullptr || b == nullptr || a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// "mlx5_0:1", ... : every port of every verbs device.
std::vector<std::string> RdmaPorts() {
  std::vector<std::string> out;
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) return out;
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(devices[i]);
    if (name == nullptr) continue;
    ibv_context* ctx = ibv_open_device(devices[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      for (int port = 1; port <= attr.phys_port_cnt; ++port) {
        out.push_back(std::string(name) + ":" + std::to_string(port));
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(devices);
  return out;
}

}  // namespace

Result<std::vector<std::string>> NetDevicesForListenHost(std::string host) {
  host = BareHost(std::move(host));
  if (IsWildcard(host) || std::getenv("UCX_NET_DEVICES") != nullptr)
    return std::vector<std::string>{};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &resolved); rc != 0) {
    return InvalidArgument("data plane: cannot resolve listen host '" + host +
                           "': " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> resolved_owner(resolved, &freeaddrinfo);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Internal("data plane: getifaddrs failed");
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> ifs_owner(ifs, &freeifaddrs);
  std::vector<std::string> devices;
  for (const ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    for (const addrinfo* a = resolved; a != nullptr; a = a->ai_next) {
      if (SameAddress(i->ifa_addr, a->ai_addr) &&
          std::find(devices.begin(), devices.end(), i->ifa_name) == devices.end()) {
        devices.emplace_back(i->ifa_name);
      }
    }
  }
  if (devices.empty()) {
    return InvalidArgument(
        "data plane: no network interface of this host has the listen address '" + host + "'");
  }
  for (std::string& port : RdmaPorts()) devices.push_back(std::move(port));
  return devices;
}

}  // namespace strata::dataplane::internal

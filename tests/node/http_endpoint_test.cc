// The node's HTTP endpoint (/metrics, /healthz): serves, and stops at any
// moment, even right after it started.
#include "strata/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace strata {
namespace {

TEST(HttpEndpointTest, ServesHealthAndMetricsAndStopsRightAfterStarting) {
  bool healthy = true;
  auto ep = HttpEndpoint::Start(
      "127.0.0.1:0", [] { return std::string("strata_up 1\n"); }, [&] { return healthy; });
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  httplib::Client client("127.0.0.1", (*ep)->port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body, "strata_up 1\n");
  healthy = false;
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  (*ep)->Stop();
  // A stop that comes before the listener thread got going must not wait
  // forever for it.
  for (int i = 0; i < 50; ++i) {
    auto quick = HttpEndpoint::Start(
        "127.0.0.1:0", [] { return std::string(); }, [] { return true; });
    ASSERT_TRUE(quick.ok()) << quick.status().ToString();
    (*quick)->Stop();
  }
  EXPECT_EQ(HttpEndpoint::Start(
                "no-port", [] { return std::string(); }, [] { return true; })
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// Sends `request` on a fresh connection to 127.0.0.1:`port` and returns
// what comes back before the server closes or 10 s pass.
std::string RawExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, n);
  }
  close(fd);
  return reply;
}

// An IPv6 address is written as gRPC's listen takes it: "[::1]:port".
TEST(HttpEndpointTest, ListensOnABracketedIpv6Address) {
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
  if (probe >= 0) close(probe);
  if (!has_ipv6) GTEST_SKIP() << "no IPv6 loopback on this machine";
  auto ep = HttpEndpoint::Start(
      "[::1]:0", [] { return std::string("strata_up 1\n"); }, [] { return true; });
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  httplib::Client client("::1", (*ep)->port());
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  (*ep)->Stop();
}

TEST(HttpEndpointTest, RefusesOtherMethodsBeforeReadingTheirBody) {
  auto ep = HttpEndpoint::Start(
      "127.0.0.1:0", [] { return std::string("strata_up 1\n"); }, [] { return true; });
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  // A body claimed at 10 GB (gzip, too) and never sent: the answer comes
  // at once, without the server waiting for it or buffering it.
  const std::string reply =
      RawExchange((*ep)->port(),
                  "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                  "Content-Length: 10000000000\r\n\r\npartial");
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_NE(reply.find("Allow: GET, HEAD"), std::string::npos) << reply;
  // GET still serves.
  httplib::Client client("127.0.0.1", (*ep)->port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body, "strata_up 1\n");
}

}  // namespace
}  // namespace strata

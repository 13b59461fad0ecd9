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

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "raw_socket.h"

namespace strata {
namespace {

using testing::ConnectLoopback;
using testing::RawExchange;
using testing::ReadAll;
using testing::SendEndlessHead;

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

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::unique_ptr<HttpEndpoint> StartTestEndpoint(HttpLimits limits = {}) {
  auto ep = HttpEndpoint::Start(
      "127.0.0.1:0", [] { return std::string("strata_up 1\n"); }, [] { return true; }, limits);
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  return ep.ok() ? std::move(ep).value() : nullptr;
}

// Issue #38: a head that never ends grew the server one byte for one; now
// it is answered 431 at the limit and the connection closed.
TEST(HttpEndpointTest, AHeadWithoutEndIsCutOffAtItsLimit) {
  auto ep = StartTestEndpoint();
  ASSERT_NE(ep, nullptr);
  const int fd = ConnectLoopback(ep->port());
  ASSERT_GE(fd, 0);
  // Up to 64 MiB; the server stops taking it long before.
  EXPECT_LT(SendEndlessHead(fd, 64u << 20), 64u << 20) << "the server kept taking an endless head";
  const std::string reply = ReadAll(fd);
  close(fd);
  // The 431 may be lost to the reset the client's unread bytes cause; the
  // close is what matters.
  if (!reply.empty()) {
    EXPECT_EQ(reply.rfind("HTTP/1.1 431", 0), 0u) << reply;
  }
  // So is a head of too many short lines.
  std::string many = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(RawExchange(ep->port(), many + "\r\n").rfind("HTTP/1.1 431", 0), 0u);
  EXPECT_GE(ep->stats().rejected, 1u);
}

// Issue #38: a POST's body was read as the next request after its 405.
// Now the connection ends with the refusal: one reply, nothing else.
TEST(HttpEndpointTest, TheBodyOfARefusedRequestIsNeverReadAsARequest) {
  auto ep = StartTestEndpoint();
  ASSERT_NE(ep, nullptr);
  const std::string smuggled = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string reply =
      RawExchange(ep->port(), "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                                  std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_EQ(Count(reply, "HTTP/1.1 "), 1u) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("strata_up"), std::string::npos) << reply;
  // A GET that announces a body is refused the same way, and so are
  // malformed heads.
  const std::string with_body = RawExchange(
      ep->port(),
      "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled);
  EXPECT_EQ(with_body.rfind("HTTP/1.1 413", 0), 0u) << with_body;
  EXPECT_EQ(Count(with_body, "HTTP/1.1 "), 1u) << with_body;
  EXPECT_EQ(RawExchange(ep->port(), "GET /metrics\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(RawExchange(ep->port(), "GET /metrics HTTP/2.0\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(
      RawExchange(ep->port(), "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n").rfind("HTTP/1.1 400", 0),
      0u);
}

// Keep-alive and pipelining still work for clients that play by the rules;
// HEAD has no body; unknown paths are 404 and keep the connection.
TEST(HttpEndpointTest, PipelinedRequestsAreAnsweredInOrder) {
  auto ep = StartTestEndpoint();
  ASSERT_NE(ep, nullptr);
  const std::string reply =
      RawExchange(ep->port(),
                  "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                  "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                  "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
                  "GET /healthz?verbose=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(Count(reply, "HTTP/1.1 200"), 3u) << reply;
  EXPECT_EQ(Count(reply, "HTTP/1.1 404"), 1u) << reply;
  EXPECT_EQ(Count(reply, "strata_up 1"), 1u) << reply;
  EXPECT_EQ(Count(reply, "ok\n"), 1u) << reply;  // the HEAD sent none
}

// Issue #38: 8 slow-header connections blocked /metrics and /healthz for
// everyone. Here 16 hold a head open: a scrape is still answered, and each
// stalled head is closed at its deadline. Then a flood of idle connections
// past the connection limit: the scrape is still answered, and the server
// holds no more than its limit.
TEST(HttpEndpointTest, SlowAndIdleClientsDoNotHoldOthersUp) {
  HttpLimits limits;
  limits.max_connections = 32;
  limits.head_timeout = Seconds(1);
  auto ep = StartTestEndpoint(limits);
  ASSERT_NE(ep, nullptr);
  auto scrape = [&] {
    httplib::Client client("127.0.0.1", ep->port());
    auto metrics = client.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->body, "strata_up 1\n");
    auto health = client.Get("/healthz");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  };
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectLoopback(ep->port(), /*recv_timeout_s=*/10);
    ASSERT_GE(fd, 0);
    const std::string partial = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    ASSERT_EQ(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(partial.size()));
    slow.push_back(fd);
  }
  scrape();
  for (int fd : slow) {
    char c;
    EXPECT_EQ(recv(fd, &c, 1, 0), 0) << "a stalled head was not closed at its deadline";
    close(fd);
  }
  EXPECT_GE(ep->stats().connections_dropped, slow.size());

  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectLoopback(ep->port());
    if (fd >= 0) idle.push_back(fd);
  }
  scrape();
  EXPECT_LE(ep->stats().connections_open, limits.max_connections);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace strata

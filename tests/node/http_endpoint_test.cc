// The node's HTTP endpoint (/metrics, /healthz): serves, and stops at any
// moment, even right after it started.
#include "strata/http_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

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

}  // namespace
}  // namespace strata

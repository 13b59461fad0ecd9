#include "strata/status.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

Status FailsWhen(bool fail) {
  STRATA_RETURN_IF_ERROR(fail ? InvalidArgument("boom") : Status::Ok());
  return NotFound("reached the end");
}

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = ChecksumMismatch("group 2");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(s.ToString(), "CHECKSUM_MISMATCH: group 2");
  EXPECT_EQ(StatusCodeName(StatusCode::kLeaseExpired), "LEASE_EXPIRED");
}

TEST(StatusTest, ReturnIfError) {
  EXPECT_EQ(FailsWhen(true).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FailsWhen(false).code(), StatusCode::kNotFound);
}

TEST(StatusTest, ResultHoldsValueOrError) {
  Result<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  EXPECT_TRUE(v.status().ok());
  Result<int> e = ResourceExhausted("full");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata

// FetchPrefix: the one place a fetch's usable prefix is cut and its SWA
// state voided (every Store's fetch goes through it; the store contract
// suite checks the stores, this the rules themselves).
#include "format/fetch_prefix.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(FetchPrefixTest, NothingCutServesEverythingAsked) {
  FetchPrefix prefix(4, 4);
  FetchOutcome out;
  prefix.Finish(/*swa_verified=*/true, out);
  EXPECT_EQ(out.blocks_ready, 4u);
  EXPECT_TRUE(out.swa_ready);
  EXPECT_TRUE(out.status.ok());
}

TEST(FetchPrefixTest, TheFirstBlockToFailSaysWhy) {
  FetchPrefix prefix(8, std::nullopt);
  prefix.CutBlock(5, ChecksumMismatch("layer group 2 fails its checksum"));
  prefix.CutMissing(3);
  prefix.CutBlock(6, Internal("later, and past the end: ignored"));
  EXPECT_EQ(prefix.usable(), 3u);
  EXPECT_EQ(prefix.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(prefix.status().message(), "block 3 is no longer stored");
  prefix.CutMissing(1, "evicted");
  EXPECT_EQ(prefix.status().message(), "block 1 is no longer stored: evicted");
  prefix.CutBlock(0, ChecksumMismatch("header fails the entry checksum"));
  EXPECT_EQ(prefix.status().code(), StatusCode::kChecksumMismatch);
  EXPECT_EQ(prefix.status().message(), "block 0: header fails the entry checksum");
}

TEST(FetchPrefixTest, ABlockShortOfTheBoundaryVoidsTheSwaState) {
  FetchPrefix prefix(6, 4);
  EXPECT_TRUE(prefix.SwaCovered());
  prefix.CutMissing(4);  // the boundary itself still stands
  EXPECT_TRUE(prefix.SwaCovered());
  prefix.CutMissing(3);
  EXPECT_FALSE(prefix.SwaCovered());
  FetchOutcome out;
  prefix.Finish(/*swa_verified=*/true, out);
  EXPECT_EQ(out.blocks_ready, 3u);
  EXPECT_FALSE(out.swa_ready);
  EXPECT_EQ(out.status.message(), "block 3 is no longer stored");
}

TEST(FetchPrefixTest, TheSwaStateIsNeverReadyWhenNotAskedForOrNotVerified) {
  FetchPrefix not_asked(2, std::nullopt);
  EXPECT_FALSE(not_asked.SwaCovered());
  FetchOutcome out;
  not_asked.Finish(/*swa_verified=*/true, out);
  EXPECT_FALSE(out.swa_ready);
  FetchPrefix unverified(2, 2);
  unverified.Finish(/*swa_verified=*/false, out);
  EXPECT_FALSE(out.swa_ready);
  EXPECT_EQ(out.blocks_ready, 2u);
}

TEST(FetchPrefixTest, AReportedFailureCutsNothingAndKeepsTheFirstReason) {
  FetchPrefix prefix(3, 3);
  prefix.SwaMissing();
  prefix.Report(Internal("a later failure"));
  EXPECT_EQ(prefix.usable(), 3u);
  EXPECT_EQ(prefix.status().message(), "SWA state is no longer stored");
  // A block's cut still takes over: it is the earlier part of the answer.
  prefix.CutMissing(2);
  EXPECT_EQ(prefix.status().message(), "block 2 is no longer stored");
}

TEST(FetchPrefixTest, TruncateShortensWithoutAReasonOfItsOwn) {
  FetchPrefix prefix(5, std::nullopt);
  prefix.Report(DeadlineExceeded("transfer timed out"));
  prefix.Truncate(2);
  prefix.Truncate(4);  // never lengthens
  EXPECT_EQ(prefix.usable(), 2u);
  EXPECT_EQ(prefix.status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace strata

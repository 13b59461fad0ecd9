// The engine's back-off from a store out of reach (StoreHealth): doubling
// while probes fail, what ends it, and outcomes of calls that outlived a
// failure.
#include "store_health.h"

#include <gtest/gtest.h>

namespace strata::worker {
namespace {

using Path = StoreHealth::Path;

const Status kDown = Unavailable("node down");

TEST(StoreHealthTest, BackOffDoublesWhileProbesFailUpToItsLimit) {
  ManualClock clock;
  StoreHealth h(clock, Seconds(1), Seconds(4));
  EXPECT_TRUE(h.Usable());
  h.Record(kDown, Path::kControl);
  EXPECT_FALSE(h.Usable());
  clock.Advance(Seconds(1));
  EXPECT_TRUE(h.Usable());
  h.Record(kDown, Path::kControl);
  clock.Advance(Seconds(1));
  EXPECT_FALSE(h.Usable());  // 2 s now
  clock.Advance(Seconds(1));
  h.Record(kDown, Path::kControl);
  clock.Advance(Seconds(4));
  h.Record(kDown, Path::kControl);
  clock.Advance(Seconds(4));  // capped at 4 s
  EXPECT_TRUE(h.Usable());
}

// A match answered ends the back-off but keeps its length; a fetch or a
// commit answered, even with an error, resets it.
TEST(StoreHealthTest, OnlyADataPathAnswerResetsTheLength) {
  ManualClock clock;
  StoreHealth h(clock, Seconds(1), Seconds(60));
  h.Record(kDown, Path::kData);
  clock.Advance(Seconds(1));
  h.Record(Status::Ok(), Path::kControl);
  EXPECT_TRUE(h.Usable());
  h.Record(kDown, Path::kData);
  clock.Advance(Seconds(1));
  EXPECT_FALSE(h.Usable());  // doubled: 2 s
  clock.Advance(Seconds(1));
  h.Record(NotFound("evicted meanwhile"), Path::kData);  // an answer all the same
  h.Record(kDown, Path::kData);
  clock.Advance(Seconds(1));
  EXPECT_TRUE(h.Usable());  // back to 1 s
}

// A fetch that started before a failure was recorded is part of it, or
// ends after the back-off it caused: its outcome is no probe either way.
TEST(StoreHealthTest, ACallThatStartedBeforeAFailureIsNoProbe) {
  ManualClock clock;
  StoreHealth h(clock, Seconds(1), Seconds(60));
  const uint64_t slow_fetch = h.epoch();
  const uint64_t other_fetch = h.epoch();
  h.Record(kDown, Path::kData);               // a commit times out meanwhile
  h.Record(kDown, Path::kData, other_fetch);  // fails with it: one failure
  clock.Advance(Seconds(1));
  EXPECT_TRUE(h.Usable());
  h.Record(Status::Ok(), Path::kData, slow_fetch);  // late: no reset
  h.Record(kDown, Path::kData);
  clock.Advance(Seconds(1));
  EXPECT_FALSE(h.Usable());  // doubled: the late success reset nothing
  clock.Advance(Seconds(1));
  EXPECT_TRUE(h.Usable());
  const uint64_t probe = h.epoch();
  h.Record(Status::Ok(), Path::kData, probe);  // a fetch started after: counts
  h.Record(kDown, Path::kData);
  clock.Advance(Seconds(1));
  EXPECT_TRUE(h.Usable());
}

}  // namespace
}  // namespace strata::worker

// CopyPool and the parallel verified copy: split across threads, a fetch's
// verified copy delivers the same bytes, events, byte counts and failures
// as one thread does, corrupt groups included.
#include "util/copy_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <tuple>

#include "strata/layout.h"
#include "strata/store_types.h"
#include "test_util.h"

namespace strata {
namespace {

using EventList = std::vector<std::tuple<int, uint32_t, uint32_t>>;

struct CopyRun {
  size_t arrived = 0;
  uint64_t bytes = 0;
  std::optional<CopyFailure> failure;
  EventList events;
  std::vector<size_t> after_group;
  std::vector<std::vector<std::byte>> dst;
};

class ParallelCopyTest : public ::testing::Test {
 protected:
  static constexpr size_t kBlocks = 16;  // 3.6 MB of bodies: above the parallel threshold

  void SetUp() override {
    const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
    for (size_t b = 0; b < kBlocks; ++b) {
      payloads_.push_back(testing::MakePayload(layout, 100 + b));
      auto h = ParsePayloadHeader(payloads_.back().bytes);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      headers_.push_back(*h);
    }
  }

  // Flips one byte of block b's group g in the source.
  void Corrupt(size_t b, size_t g) {
    payloads_[b].bytes[headers_[b].groups[g].offset + 17] ^= std::byte{0x40};
  }

  CopyRun Copy(CopyPool* pool) const {
    CopyRun run;
    run.dst.assign(kBlocks, std::vector<std::byte>(payloads_[0].bytes.size()));
    std::vector<VerifiedCopy> copies;
    for (size_t b = 0; b < kBlocks; ++b) {
      copies.push_back({payloads_[b].bytes.data(), run.dst[b].data(), &headers_[b]});
    }
    run.arrived = CopyVerifiedBodies(
        copies,
        [&](const FetchEvent& e) {
          run.events.emplace_back(static_cast<int>(e.type), e.block, e.group);
        },
        &run.bytes, &run.failure, [&](size_t g) { run.after_group.push_back(g); }, pool);
    return run;
  }

  void ExpectSame(const CopyRun& got, const CopyRun& want) const {
    EXPECT_EQ(got.arrived, want.arrived);
    EXPECT_EQ(got.bytes, want.bytes);
    ASSERT_EQ(got.failure.has_value(), want.failure.has_value());
    if (want.failure) {
      EXPECT_EQ(got.failure->block, want.failure->block);
      EXPECT_EQ(got.failure->group, want.failure->group);
    }
    EXPECT_EQ(got.events, want.events);
    EXPECT_EQ(got.after_group, want.after_group);
    for (size_t b = 0; b < got.arrived; ++b) {
      const GroupExtent& first = headers_[b].groups.front();
      const size_t body_end = headers_[b].groups.back().offset + headers_[b].groups.back().length;
      EXPECT_TRUE(std::equal(got.dst[b].begin() + first.offset, got.dst[b].begin() + body_end,
                             payloads_[b].bytes.begin() + first.offset))
          << "block " << b;
    }
  }

  std::vector<testing::Payload> payloads_;
  std::vector<PayloadHeader> headers_;
};

TEST_F(ParallelCopyTest, SameResultAsOneThread) {
  const CopyRun want = Copy(nullptr);
  EXPECT_EQ(want.arrived, kBlocks);
  EXPECT_FALSE(want.failure.has_value());
  // Group-major: every group of every block, then a kBlockReady per block.
  EXPECT_EQ(want.events.size(), kBlocks * 3 + 3 + kBlocks);
  for (uint32_t threads : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(threads);
    CopyPool pool(threads);
    for (int rep = 0; rep < 3; ++rep) ExpectSame(Copy(&pool), want);
  }
}

TEST_F(ParallelCopyTest, CorruptGroupCutsThePrefixWhereOneThreadWould) {
  // One corrupt group in each half: group 1 cuts the prefix to 11 blocks,
  // then group 2 cuts it to 4; the failure names the last cut.
  Corrupt(4, 2);
  Corrupt(11, 1);
  const CopyRun want = Copy(nullptr);
  ASSERT_TRUE(want.failure.has_value());
  EXPECT_EQ(want.failure->block, 4u);
  EXPECT_EQ(want.failure->group, 2u);
  EXPECT_EQ(want.arrived, 4u);
  for (uint32_t threads : {2u, 4u}) {
    SCOPED_TRACE(threads);
    CopyPool pool(threads);
    ExpectSame(Copy(&pool), want);
  }
}

TEST_F(ParallelCopyTest, CorruptFirstBlockLeavesNothing) {
  Corrupt(0, 0);
  CopyPool pool(2);
  const CopyRun got = Copy(&pool);
  EXPECT_EQ(got.arrived, 0u);
  ASSERT_TRUE(got.failure.has_value());
  EXPECT_EQ(got.failure->block, 0u);
  EXPECT_TRUE(got.events.empty());
  ExpectSame(got, Copy(nullptr));
}

TEST_F(ParallelCopyTest, ConcurrentCallersShareOnePool) {
  const CopyRun want = Copy(nullptr);
  CopyPool pool(2);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        const CopyRun got = Copy(&pool);
        if (got.arrived != want.arrived || got.events != want.events || got.bytes != want.bytes ||
            got.dst != Copy(nullptr).dst) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(CopyPoolTest, RunsEveryWorkerOnceAndFallsBackWhenBusy) {
  CopyPool pool(3);
  EXPECT_EQ(pool.threads(), 3u);
  std::vector<std::atomic<int>> ran(3);
  size_t seen_workers = 0;
  pool.Run(8, [&](size_t w, size_t workers) {
    if (w == 0) seen_workers = workers;
    ++ran[w];
  });
  EXPECT_EQ(seen_workers, 3u);
  for (auto& r : ran) EXPECT_EQ(r.load(), 1);

  // While one job runs, another caller gets a one-worker job on its own thread.
  std::atomic<bool> inside{false}, release{false};
  std::thread first([&] {
    pool.Run(2, [&](size_t w, size_t) {
      if (w != 0) return;
      inside = true;
      while (!release) std::this_thread::yield();
    });
  });
  while (!inside) std::this_thread::yield();
  size_t second_workers = 0;
  pool.Run(3, [&](size_t, size_t workers) { second_workers = workers; });
  release = true;
  first.join();
  EXPECT_EQ(second_workers, 1u);

  CopyPool single(1);
  size_t single_workers = 0;
  single.Run(4, [&](size_t, size_t workers) { single_workers = workers; });
  EXPECT_EQ(single_workers, 1u);
}

}  // namespace
}  // namespace strata

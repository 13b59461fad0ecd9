// UringRing, the io_uring ring under the SSD tier: refused submissions,
// failed waits and completions, and EAGAIN reissues, on a real O_DIRECT file.
#include "ssd/uring_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "strata/ssd_options.h"
#include "temp_dir.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::RandomBytes;
using testing::ScopedTempDir;

// A ring of depth 2 over one 16-block O_DIRECT file, and batches of six
// one-block ops whose writes fill `block` and whose reads count the blocks
// that came back equal to it.
class UringRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = dir_.path() + "/data";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(::ftruncate(fd_, 16 * kSsdBlockBytes), 0);
    auto created = UringRing::Create(std::span(&fd_, 1), /*depth=*/2, kSsdBlockBytes);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ring_ = std::move(created).value();
  }
  void TearDown() override {
    ring_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  static std::vector<IoOp> Batch(bool write) {
    std::vector<IoOp> ops(6);
    for (uint32_t i = 0; i < ops.size(); ++i) {
      ops[i].write = write;
      ops[i].offset = uint64_t{i} * kSsdBlockBytes;
      ops[i].length = kSsdBlockBytes;
    }
    return ops;
  }
  void Run(std::vector<IoOp>& ops) {
    ring_->Run(
        ops,
        [&](size_t, std::span<std::byte> buf) {
          std::memcpy(buf.data(), block_.data(), buf.size());
        },
        [&](size_t, std::span<std::byte> buf) {
          drained_ += std::equal(buf.begin(), buf.end(), block_.begin()) ? 1 : 0;
        },
        [&](size_t) { ++done_; });
  }

  ScopedTempDir dir_{"strata-ssd-test"};
  int fd_ = -1;
  std::unique_ptr<UringRing> ring_;
  const std::vector<std::byte> block_ = RandomBytes(kSsdBlockBytes, 21);
  size_t drained_ = 0;
  size_t done_ = 0;
};

// The ring under the SSD tier: a submission the kernel cannot take now is
// retried (never a wait on nothing), and a ring that fails outright waits
// for what the kernel holds, fails the rest, and runs no later batch (a
// stale completion would land in it).
TEST_F(UringRingTest, RetriesRefusedSubmitsAndBreaksOnFailure) {
  ring_->FailSubmitsForTesting(-EAGAIN, 3);  // nothing in the kernel meanwhile
  std::vector<IoOp> writes = Batch(true);
  Run(writes);
  for (const IoOp& op : writes) EXPECT_EQ(op.result, static_cast<int>(kSsdBlockBytes));
  EXPECT_EQ(done_, 6u);

  ring_->FailSubmitsForTesting(-EIO, 1, /*after=*/1);  // two reads already in the kernel
  std::vector<IoOp> reads = Batch(false);
  Run(reads);
  EXPECT_TRUE(ring_->broken());
  EXPECT_EQ(reads[0].result, static_cast<int>(kSsdBlockBytes));  // waited for
  EXPECT_EQ(reads[1].result, static_cast<int>(kSsdBlockBytes));
  EXPECT_EQ(drained_, 2u);
  for (size_t i = 2; i < reads.size(); ++i) EXPECT_EQ(reads[i].result, -EIO) << i;

  std::vector<IoOp> again = Batch(false);
  Run(again);
  for (const IoOp& op : again) EXPECT_EQ(op.result, -EIO);
  EXPECT_EQ(drained_, 2u);
}

// A kernel that refuses every submission (it cannot allocate requests)
// fails the batch after a while instead of holding its caller forever.
TEST_F(UringRingTest, ASubmissionRefusedForeverFailsTheBatch) {
  ring_->FailSubmitsForTesting(-EAGAIN, UINT32_MAX);
  std::vector<IoOp> writes = Batch(true);
  auto run = std::async(std::launch::async, [&] { Run(writes); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the batch never returned";
  for (const IoOp& op : writes) EXPECT_EQ(op.result, -EAGAIN);
  EXPECT_EQ(done_, 0u);
  EXPECT_TRUE(ring_->broken());
}

// An op the kernel completes with -EAGAIN (a split O_DIRECT request on a
// kernel before 6.3) is issued again, so the batch goes through and the
// ring stays whole; an op that keeps failing so fails alone, with -EAGAIN.
TEST_F(UringRingTest, AnOpCompletedWithEagainIsIssuedAgain) {
  ring_->FailCompletionsForTesting(-EAGAIN, 3);
  std::vector<IoOp> writes = Batch(true);
  Run(writes);
  for (const IoOp& op : writes) EXPECT_EQ(op.result, static_cast<int>(kSsdBlockBytes));
  EXPECT_EQ(done_, 6u);

  ring_->FailCompletionsForTesting(-EAGAIN, 2);
  std::vector<IoOp> reads = Batch(false);
  Run(reads);
  for (const IoOp& op : reads) EXPECT_EQ(op.result, static_cast<int>(kSsdBlockBytes));
  EXPECT_EQ(drained_, 6u);  // each read's bytes handed over once, all of them right
  EXPECT_EQ(done_, 12u);
  EXPECT_FALSE(ring_->broken());

  ring_->FailCompletionsForTesting(-EAGAIN, 1000);
  std::vector<IoOp> stuck = Batch(false);
  Run(stuck);
  for (const IoOp& op : stuck) {
    EXPECT_EQ(op.result, -EAGAIN);
    EXPECT_TRUE(op.completed);
  }
  EXPECT_EQ(done_, 18u);
  EXPECT_EQ(drained_, 6u);
  EXPECT_FALSE(ring_->broken());

  ring_->FailCompletionsForTesting(0, 0);
  std::vector<IoOp> after = Batch(false);
  Run(after);
  for (const IoOp& op : after) EXPECT_EQ(op.result, static_cast<int>(kSsdBlockBytes));
}

// A ring whose wait for completions fails outright still never returns
// while the kernel holds its I/O: the caller reuses that memory at once.
TEST_F(UringRingTest, AFailedWaitStillWaitsForTheKernelsIo) {
  std::vector<IoOp> writes = Batch(true);
  Run(writes);
  for (const IoOp& op : writes) ASSERT_EQ(op.result, static_cast<int>(kSsdBlockBytes));

  ring_->FailWaitsForTesting(-EFAULT, 1000);  // no wait succeeds: two reads in the kernel
  done_ = 0;
  std::vector<IoOp> reads = Batch(false);
  Run(reads);
  EXPECT_TRUE(ring_->broken());
  for (size_t i = 0; i < 2; ++i) {  // waited for, however long it took
    EXPECT_EQ(reads[i].result, static_cast<int>(kSsdBlockBytes)) << i;
    EXPECT_TRUE(reads[i].completed) << i;
  }
  EXPECT_EQ(drained_, 2u);
  EXPECT_EQ(done_, 2u);
  for (size_t i = 2; i < reads.size(); ++i) {
    EXPECT_EQ(reads[i].result, -EFAULT) << i;
    EXPECT_FALSE(reads[i].completed) << i;
  }
}

}  // namespace
}  // namespace strata

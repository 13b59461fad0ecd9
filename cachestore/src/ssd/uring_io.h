// One io_uring instance with the data files and a pool of aligned bounce
// buffers registered, running batches of O_DIRECT reads and writes with a
// bounded number in flight. Not thread-safe: SsdTier hands each ring to one
// batch at a time.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "strata/status.h"

namespace strata {

struct IoOp {
  bool write = false;
  uint32_t file = 0;            // index into the registered files
  uint64_t offset = 0;          // 4 KiB aligned
  uint32_t length = 0;          // 4 KiB multiple; at most the buffer size unless `direct`
  std::byte* direct = nullptr;  // aligned caller memory; nullptr: a bounce buffer
  int result = 0;               // bytes transferred, or -errno
  // The kernel completed it: `result` is the device's answer, not a
  // ring-level failure (the op then never ran, or its outcome is unknown).
  bool completed = false;
};

class UringRing {
 public:
  // fill(i, buffer): a bounce write's bytes go into `buffer` before submit.
  // drain(i, buffer): a bounce read's bytes, after it completed in full.
  using BufferFn = std::function<void(size_t, std::span<std::byte>)>;

  static Result<std::unique_ptr<UringRing>> Create(std::span<const int> fds, uint32_t depth,
                                                   uint64_t buffer_bytes);
  ~UringRing();
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;

  // Called as each op completes (after `drain`), while later ops are still
  // in flight: where per-entry CPU work (checksums) overlaps the I/O.
  using DoneFn = std::function<void(size_t)>;

  // Runs every op; each op's `result` says how it went. A submission the
  // kernel cannot take now (EAGAIN, EBUSY) is retried, for about a second
  // when the kernel holds nothing (then it is a failure); an op that
  // completes with -EAGAIN is issued again, a few times. A ring-level failure
  // fails the ops not yet completed with its -errno, after waiting for those
  // the kernel holds; the ring is then broken and fails every later batch.
  // Never returns while the kernel holds an op, even if waiting fails: the
  // caller reuses the ops' memory at once, and a late O_DIRECT read landing
  // in it would corrupt whatever lives there then.
  void Run(std::span<IoOp> ops, const BufferFn& fill, const BufferFn& drain, const DoneFn& done);

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  bool broken() const { return broken_ != 0; }

  // Test hook: after `after` real submissions, the next `times` return `rc`
  // without submitting anything.
  void FailSubmitsForTesting(int rc, uint32_t times, uint32_t after = 0);
  // Test hook: the next `times` waits for a completion return `rc` without
  // waiting.
  void FailWaitsForTesting(int rc, uint32_t times);
  // Test hook: the next `times` completions report `res` whatever the
  // kernel did (a read's bytes still land in its buffer).
  void FailCompletionsForTesting(int res, uint32_t times);

 private:
  UringRing() = default;
  int Submit();
  int Wait(io_uring_cqe** cqe);
  // Waits for `left` completions after the ring failed, polling the
  // completion queue if even waiting fails.
  void Drain(size_t left, const std::function<void(io_uring_cqe*)>& reap);

  // Run's state: its ops' bounce slots, completions and reissues
  // (uring_io.cc).
  struct Batch;

  int broken_ = 0;  // -errno of the failure that broke the ring
  int fail_submit_rc_ = 0;
  uint32_t fail_submits_ = 0;
  uint32_t pass_submits_ = 0;
  int fail_wait_rc_ = 0;
  uint32_t fail_waits_ = 0;
  int fail_completion_res_ = 0;
  uint32_t fail_completions_ = 0;
  io_uring ring_{};
  bool ring_ready_ = false;
  uint32_t depth_ = 0;
  uint64_t buffer_bytes_ = 0;
  std::byte* buffers_ = nullptr;  // depth_ x buffer_bytes_, 4 KiB aligned
};

}  // namespace strata

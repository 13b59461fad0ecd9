#include "ssd/uring_io.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace strata {
namespace {

constexpr uint64_t kAlign = 4096;
// user_data: op index in the low 40 bits, bounce slot + 1 above (0: direct).
constexpr int kSlotShift = 40;
constexpr uint64_t kOpMask = (uint64_t{1} << kSlotShift) - 1;
// Refused submissions with nothing in the kernel, 100 us apart, before the
// refusal counts as a ring failure (about a second: the kernel has been
// unable to allocate requests all along).
constexpr uint32_t kMaxIdleSubmitRetries = 10000;
// Times one op is issued again after completing with -EAGAIN. Kernels
// before 6.3 may complete a large O_DIRECT request that way when the block
// layer split it and ran out of tags for a part (the application is to
// reissue it); past this the op fails with -EAGAIN.
constexpr uint8_t kMaxReissues = 8;

}  // namespace

Result<std::unique_ptr<UringRing>> UringRing::Create(std::span<const int> fds, uint32_t depth,
                                                     uint64_t buffer_bytes) {
  if (depth == 0 || depth > 4096) return InvalidArgument("queue depth must be in 1..4096");
  if (buffer_bytes == 0 || buffer_bytes % kAlign != 0 || buffer_bytes > (1u << 30)) {
    return InvalidArgument("io buffer bytes must be a positive multiple of 4096, at most 1 GiB");
  }
  std::unique_ptr<UringRing> r(new UringRing());
  r->depth_ = depth;
  r->buffer_bytes_ = buffer_bytes;
  if (int rc = io_uring_queue_init(depth, &r->ring_, 0); rc < 0) {
    return Unavailable("io_uring_queue_init: " + std::string(std::strerror(-rc)));
  }
  r->ring_ready_ = true;
  void* mem = nullptr;
  if (posix_memalign(&mem, kAlign, depth * buffer_bytes) != 0) {
    return ResourceExhausted("cannot allocate io_uring bounce buffers");
  }
  r->buffers_ = static_cast<std::byte*>(mem);
  std::memset(r->buffers_, 0, depth * buffer_bytes);
  std::vector<iovec> iovs(depth);
  for (uint32_t i = 0; i < depth; ++i) iovs[i] = {r->buffers_ + i * buffer_bytes, buffer_bytes};
  if (int rc = io_uring_register_buffers(&r->ring_, iovs.data(), depth); rc < 0) {
    return Unavailable("io_uring_register_buffers: " + std::string(std::strerror(-rc)));
  }
  if (int rc = io_uring_register_files(&r->ring_, fds.data(), static_cast<unsigned>(fds.size()));
      rc < 0) {
    return Unavailable("io_uring_register_files: " + std::string(std::strerror(-rc)));
  }
  return r;
}

UringRing::~UringRing() {
  if (ring_ready_) io_uring_queue_exit(&ring_);  // also unregisters files and buffers
  std::free(buffers_);
}

// One Run's ops and where each stands: the bounce slots free, the ops reaped
// but not yet passed to done_fn, those to issue again.
struct UringRing::Batch {
  Batch(UringRing& ring, std::span<IoOp> ops, const BufferFn& fill, const BufferFn& drain,
        const DoneFn& done_fn)
      : ring(ring),
        ops(ops),
        fill(fill),
        drain(drain),
        done_fn(done_fn),
        free_slots(ring.depth_),
        reissues(ops.size(), 0) {
    for (uint32_t i = 0; i < ring.depth_; ++i) free_slots[i] = ring.depth_ - 1 - i;
  }

  std::span<std::byte> Buffer(uint32_t slot) const {
    return std::span<std::byte>(ring.buffers_ + uint64_t{slot} * ring.buffer_bytes_,
                                ring.buffer_bytes_);
  }

  // Queues ops while fewer than depth are in flight: those to issue again
  // first, then the next ones.
  void Queue() {
    while ((!again.empty() || next < ops.size()) && inflight < ring.depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring_);
      if (sqe == nullptr) break;
      size_t i = next;
      if (again.empty()) {
        ++next;
      } else {
        i = again.back();
        again.pop_back();
      }
      Prep(sqe, i);
      ++inflight;
    }
  }

  // Op i into `sqe`: on the caller's memory, or on a free bounce buffer
  // (filled first for a write).
  void Prep(io_uring_sqe* sqe, size_t i) {
    IoOp& op = ops[i];
    uint64_t slot_tag = 0;
    if (op.direct != nullptr) {
      if (op.write) {
        io_uring_prep_write(sqe, static_cast<int>(op.file), op.direct, op.length, op.offset);
      } else {
        io_uring_prep_read(sqe, static_cast<int>(op.file), op.direct, op.length, op.offset);
      }
    } else {
      const uint32_t slot = free_slots.back();
      free_slots.pop_back();
      std::span<std::byte> buf = Buffer(slot).first(op.length);
      if (op.write) {
        fill(i, buf);
        io_uring_prep_write_fixed(sqe, static_cast<int>(op.file), buf.data(), op.length, op.offset,
                                  static_cast<int>(slot));
      } else {
        io_uring_prep_read_fixed(sqe, static_cast<int>(op.file), buf.data(), op.length, op.offset,
                                 static_cast<int>(slot));
      }
      slot_tag = uint64_t{slot} + 1;
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, i | (slot_tag << kSlotShift));
  }

  // Runs done_fn for the ops reaped since it last ran.
  void RunDone() {
    for (size_t i : completed) done_fn(i);
    completed.clear();
  }

  // Submit took nothing this time (EINTR, EAGAIN, EBUSY). With nothing in
  // the kernel to wait for, waiting would never return: true to pause, then
  // submit again, for a while. Past that the ring fails (its refused entries
  // are still queued: it must never submit again). With the kernel holding
  // some, `*rc` becomes 0: wait for those.
  bool PauseAfterRefusal(size_t in_kernel, int* rc) {
    if (in_kernel == 0 && io_uring_cq_ready(&ring.ring_) == 0) {
      if (++idle_retries < kMaxIdleSubmitRetries) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        return true;
      }
    } else {
      *rc = 0;
    }
    return false;
  }

  // Waits for a completion; 0, or the -errno that breaks the ring.
  int WaitForCompletion() {
    idle_retries = 0;
    io_uring_cqe* first = nullptr;
    int rc = ring.Wait(&first);
    if (rc == -EINTR || rc == -EAGAIN) rc = 0;  // reap what is there, if anything
    return rc;
  }

  // Takes one completion; false when its op is to be issued again.
  bool Reap(io_uring_cqe* cqe, bool may_reissue) {
    const uint64_t data = io_uring_cqe_get_data64(cqe);
    const size_t i = data & kOpMask;
    const uint64_t slot_tag = data >> kSlotShift;
    IoOp& op = ops[i];
    const int res = ring.fail_completions_ > 0
                        ? (--ring.fail_completions_, ring.fail_completion_res_)
                        : cqe->res;
    const bool reissue = res == -EAGAIN && may_reissue && reissues[i] < kMaxReissues;
    if (!reissue) {
      op.result = res;
      op.completed = true;
    }
    if (slot_tag != 0) {
      const auto slot = static_cast<uint32_t>(slot_tag - 1);
      if (!op.write && res == static_cast<int>(op.length)) {
        drain(i, Buffer(slot).first(op.length));
      }
      free_slots.push_back(slot);  // a bounce write issued again is filled again
    }
    if (reissue) {
      ++reissues[i];
      again.push_back(i);
      return false;
    }
    completed.push_back(i);
    return true;
  }

  // Takes every completion in the queue.
  void ReapReady() {
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring.ring_, head, cqe) {
      if (Reap(cqe, /*may_reissue=*/true)) ++reaped;
      ++seen;
    }
    io_uring_cq_advance(&ring.ring_, seen);
    inflight -= seen;
  }

  // The ring is unusable. The kernel may still be reading into caller
  // memory: wait for what it holds before the caller frees anything, fail
  // the rest, and never run another batch on this ring (a stale completion
  // would land in the next one).
  void Fail(int rc, size_t in_kernel) {
    ring.broken_ = rc;
    ring.Drain(in_kernel, [&](io_uring_cqe* c) { Reap(c, /*may_reissue=*/false); });
    RunDone();
    for (IoOp& op : ops) {
      if (op.result == 0) op.result = rc;  // lengths are never 0: not completed
    }
  }

  UringRing& ring;
  const std::span<IoOp> ops;
  const BufferFn& fill;
  const BufferFn& drain;
  const DoneFn& done_fn;
  std::vector<uint32_t> free_slots;
  std::vector<size_t> completed;  // reaped, their done_fn not yet run
  std::vector<size_t> again;      // completed with -EAGAIN, to be issued again
  std::vector<uint8_t> reissues;
  size_t next = 0, inflight = 0, reaped = 0;
  uint32_t idle_retries = 0;
};

void UringRing::Run(std::span<IoOp> ops, const BufferFn& fill, const BufferFn& drain,
                    const DoneFn& done_fn) {
  for (IoOp& op : ops) op.completed = false;
  if (broken_ != 0) {
    for (IoOp& op : ops) op.result = broken_;
    return;
  }
  Batch batch(*this, ops, fill, drain, done_fn);
  while (batch.reaped < ops.size()) {
    batch.Queue();
    // Queue full again: now the CPU work of what completed overlaps the I/O.
    int rc = Submit();
    batch.RunDone();
    // What the kernel holds; the rest is still queued in the ring.
    const size_t in_kernel = batch.inflight - io_uring_sq_ready(&ring_);
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
      if (batch.PauseAfterRefusal(in_kernel, &rc)) continue;
    }
    if (rc >= 0) rc = batch.WaitForCompletion();
    if (rc < 0) {
      batch.Fail(rc, in_kernel);
      return;
    }
    batch.ReapReady();
  }
  batch.RunDone();
}

void UringRing::Drain(size_t left, const std::function<void(io_uring_cqe*)>& reap) {
  bool polling = false;
  while (left > 0) {
    io_uring_cqe* cqe = nullptr;
    const int w = polling ? io_uring_peek_cqe(&ring_, &cqe) : Wait(&cqe);
    if (w == 0 && cqe != nullptr) {
      reap(cqe);
      io_uring_cqe_seen(&ring_, cqe);
      --left;
    } else if (polling) {
      // The sleep also returns to user space, which runs the task work
      // that posts completions.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else if (w != -EINTR && w != -EAGAIN) {
      // Cannot wait in the kernel, yet it still owns the I/Os and will
      // complete them into the completion queue: poll that instead. Never
      // return before: the caller would reuse memory a late read can still
      // land in. If the kernel never completes them this thread stays here,
      // a visible hang rather than silent corruption.
      spdlog::error("ssd: io_uring wait failed ({}) with {} I/Os in the kernel; polling for them",
                    std::strerror(-w), left);
      polling = true;
    }
  }
}

int UringRing::Wait(io_uring_cqe** cqe) {
  if (fail_waits_ > 0) {
    --fail_waits_;
    return fail_wait_rc_;
  }
  return io_uring_wait_cqe(&ring_, cqe);
}

void UringRing::FailCompletionsForTesting(int res, uint32_t times) {
  fail_completion_res_ = res;
  fail_completions_ = times;
}

void UringRing::FailWaitsForTesting(int rc, uint32_t times) {
  fail_wait_rc_ = rc;
  fail_waits_ = times;
}

int UringRing::Submit() {
  if (fail_submits_ > 0) {
    if (pass_submits_ > 0) {
      --pass_submits_;
    } else {
      --fail_submits_;
      return fail_submit_rc_;
    }
  }
  return io_uring_submit(&ring_);
}

void UringRing::FailSubmitsForTesting(int rc, uint32_t times, uint32_t after) {
  fail_submit_rc_ = rc;
  fail_submits_ = times;
  pass_submits_ = after;
}

}  // namespace strata

#include "util/copy_pool.h"

#include <algorithm>

namespace strata {

CopyPool::CopyPool(uint32_t threads)
    : threads_(threads != 0 ? threads
                            : std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 2)) {}

CopyPool::~CopyPool() {
  MutexLock run(run_mu_);
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void CopyPool::Run(size_t max_workers, const std::function<void(size_t w, size_t workers)>& fn) {
  const size_t workers = std::min<size_t>(max_workers, threads_);
  if (workers <= 1 || !run_mu_.try_lock()) {
    fn(0, 1);
    return;
  }
  MutexLock run(run_mu_, std::adopt_lock);
  while (helpers_.size() + 1 < threads_) helpers_.emplace_back([this] { HelperLoop(); });
  {
    MutexLock lock(mu_);
    job_ = &fn;
    job_workers_ = workers;
    next_worker_ = 1;
    helpers_running_ = workers - 1;
    ++job_generation_;
  }
  wake_cv_.notify_all();
  fn(0, workers);
  MutexLock lock(mu_);
  done_cv_.wait(lock.native(),
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return helpers_running_ == 0; });
  job_ = nullptr;
}

void CopyPool::HelperLoop() {
  uint64_t seen = 0;
  MutexLock lock(mu_);
  while (true) {
    wake_cv_.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || job_generation_ != seen;
    });
    if (stopping_) return;
    seen = job_generation_;
    if (next_worker_ >= job_workers_) continue;  // the job has all its workers
    const size_t w = next_worker_++;
    const size_t workers = job_workers_;
    const auto* job = job_;
    lock.Unlock();
    (*job)(w, workers);
    lock.Lock();
    if (--helpers_running_ == 0) done_cv_.notify_all();
  }
}

void SpinWait::Once() {
  if (++spins_ < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return;
  }
  std::this_thread::yield();
}

}  // namespace strata

// CopyPool: a few threads that share one large verified copy.
//
// One thread copying and hashing runs at about two thirds of the memory
// bandwidth that a plain streaming copy reaches (the hash pass and the
// copy do not overlap), so a fetch of many blocks splits its blocks across
// the caller and up to `threads - 1` helper threads. Helpers start on the
// first parallel job and are joined by the destructor.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "util/mutex.h"

namespace strata {

class CopyPool {
 public:
  // threads: the most workers one job may use, the caller included;
  // 0 takes min(2, hardware threads). 1 never starts a thread.
  explicit CopyPool(uint32_t threads = 0);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // Runs fn(w, workers) for every w in [0, workers) at once, fn(0, ...) on
  // the calling thread, and returns when all have returned. workers is at
  // most `max_workers`; it is 1 when the pool has no helpers or another
  // caller's job is running (a job never waits for another one), so fn must
  // be correct for any worker count and must not block on a worker that is
  // not part of the job.
  void Run(size_t max_workers, const std::function<void(size_t w, size_t workers)>& fn);

  uint32_t threads() const { return threads_; }

 private:
  void HelperLoop();

  const uint32_t threads_;
  Mutex run_mu_;  // one job at a time
  std::vector<std::thread> helpers_ ABSL_GUARDED_BY(run_mu_);

  Mutex mu_;
  std::condition_variable wake_cv_;  // helpers wait for a job
  std::condition_variable done_cv_;  // the caller waits for its helpers
  const std::function<void(size_t, size_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t job_generation_ ABSL_GUARDED_BY(mu_) = 0;
  size_t job_workers_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_worker_ ABSL_GUARDED_BY(mu_) = 0;
  size_t helpers_running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// Waits for another thread without sleeping through a short wait: a few
// pause instructions, then yields the core (these machines may have two).
class SpinWait {
 public:
  void Once();

 private:
  uint32_t spins_ = 0;
};

}  // namespace strata

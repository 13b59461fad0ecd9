#include "strata/task_pool.h"

#include <memory>

namespace strata {

TaskPool::TaskPool(size_t threads) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TaskPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void TaskPool::RunAll(std::vector<std::function<void()>> tasks) {
  if (tasks.empty()) return;
  struct Batch {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
  };
  auto batch = std::make_shared<Batch>();
  batch->left = tasks.size() - 1;
  if (!threads_.empty()) {
    {
      std::lock_guard lock(mu_);
      for (size_t i = 1; i < tasks.size(); ++i) {
        queue_.emplace_back([batch, task = std::move(tasks[i])] {
          task();
          std::lock_guard done(batch->mu);
          if (--batch->left == 0) batch->cv.notify_all();
        });
      }
    }
    cv_.notify_all();
  } else {
    for (size_t i = 1; i < tasks.size(); ++i) tasks[i]();
    batch->left = 0;
  }
  tasks[0]();
  std::unique_lock lock(batch->mu);
  batch->cv.wait(lock, [&] { return batch->left == 0; });
}

}  // namespace strata

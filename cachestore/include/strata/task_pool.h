// A fixed set of threads that runs a batch of tasks in parallel: how the
// cluster client sends one request per node at once (DESIGN §6) without
// starting a thread per request, and how the worker splits a long-context
// indexer scan across cores.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class TaskPool {
 public:
  explicit TaskPool(size_t threads);
  // Waits for queued tasks, then joins the threads.
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Runs every task and returns when all have finished. The first runs on
  // the calling thread, so a batch of one costs no hand-off, and a batch
  // makes progress even when every pool thread is busy.
  void RunAll(std::vector<std::function<void()>> tasks);

  size_t threads() const { return threads_.size(); }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata

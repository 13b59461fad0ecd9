// One request's fetch from the store, run on its own thread so the model
// can start layer l as soon as the layer group it reads has arrived
// (DESIGN §9 step 1). The engine waits per layer group; events come from
// whichever thread performs the transfer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "strata/store.h"

namespace strata::worker {

class FetchJob {
 public:
  // Fetches `match` (the job keeps its own copy; `request.match` is
  // ignored). The buffers must outlive the job; it installs its own
  // on_event.
  FetchJob(Store& store, MatchResult match, FetchRequest request, uint32_t groups);
  ~FetchJob();  // joins
  FetchJob(const FetchJob&) = delete;
  FetchJob& operator=(const FetchJob&) = delete;

  // Blocks verified in layer group g once it is done everywhere (0 when
  // the fetch ended without it).
  uint32_t WaitGroup(uint32_t g);
  bool WaitSwa();
  FetchOutcome Finish();  // waits for the transfer and joins
  bool Done();            // the transfer has ended: Finish would not wait

  // Seconds from the start to the first layer group done everywhere, and
  // to the end of the transfer (after Finish); nullopt if it never came.
  std::optional<double> FirstGroupSeconds();
  std::optional<double> Seconds();

 private:
  using SteadyClock = std::chrono::steady_clock;
  double Since(SteadyClock::time_point t) const {
    return std::chrono::duration<double>(t - started_).count();
  }

  void OnEvent(const FetchEvent& e);
  void End(FetchOutcome outcome);

  const MatchResult match_;
  FetchRequest request_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<uint32_t>> group_done_;
  bool swa_ready_ = false;
  bool finished_ = false;
  FetchOutcome outcome_;
  const SteadyClock::time_point started_ = SteadyClock::now();
  std::optional<SteadyClock::time_point> first_group_at_;
  std::optional<SteadyClock::time_point> finished_at_;
  std::thread thread_;
};

}  // namespace strata::worker

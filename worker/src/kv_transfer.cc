#include "kv_transfer.h"

#include <string>
#include <system_error>

namespace strata::worker {

FetchJob::FetchJob(Store& store, MatchResult match, FetchRequest request, uint32_t groups)
    : match_(std::move(match)), request_(std::move(request)), group_done_(groups) {
  request_.match = &match_;
  request_.on_event = [this](const FetchEvent& e) { OnEvent(e); };
  auto run = [this, &store] { End(store.Fetch(request_).Wait()); };
  try {
    thread_ = std::thread(run);
  } catch (const std::system_error& e) {
    // No thread to be had (the process is at its limit): a failed fetch,
    // which the engine recomputes, rather than an exception out of Step.
    End({.status = ResourceExhausted(std::string("no thread for the fetch: ") + e.what())});
  }
}

void FetchJob::End(FetchOutcome outcome) {
  std::lock_guard lock(mu_);
  outcome_ = std::move(outcome);
  finished_ = true;
  finished_at_ = SteadyClock::now();
  cv_.notify_all();
}

FetchJob::~FetchJob() {
  if (thread_.joinable()) thread_.join();
}

void FetchJob::OnEvent(const FetchEvent& e) {
  std::lock_guard lock(mu_);
  if (e.type == FetchEvent::Type::kLayerGroupDone && e.group < group_done_.size()) {
    group_done_[e.group] = e.block;  // the usable prefix at that point
    if (!first_group_at_.has_value()) first_group_at_ = SteadyClock::now();
  } else if (e.type == FetchEvent::Type::kSwaReady) {
    swa_ready_ = true;
  }
  cv_.notify_all();
}

uint32_t FetchJob::WaitGroup(uint32_t g) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return finished_ || group_done_[g].has_value(); });
  if (!group_done_[g].has_value()) return 0;
  // A later failure may still cut the prefix below what this group saw.
  if (finished_) return std::min(*group_done_[g], outcome_.blocks_ready);
  return *group_done_[g];
}

bool FetchJob::WaitSwa() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return finished_ || swa_ready_; });
  return swa_ready_ && (!finished_ || outcome_.swa_ready);
}

FetchOutcome FetchJob::Finish() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  return outcome_;
}

bool FetchJob::Done() {
  std::lock_guard lock(mu_);
  return finished_;
}

std::optional<double> FetchJob::FirstGroupSeconds() {
  std::lock_guard lock(mu_);
  if (!first_group_at_.has_value()) return std::nullopt;
  return Since(*first_group_at_);
}

std::optional<double> FetchJob::Seconds() {
  std::lock_guard lock(mu_);
  if (!finished_at_.has_value()) return std::nullopt;
  return Since(*finished_at_);
}

}  // namespace strata::worker

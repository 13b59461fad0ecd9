#include "strata/store_types.h"

namespace strata {

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "HBM";
    case Tier::kDram:
      return "DRAM";
    case Tier::kSsd:
      return "SSD";
  }
  return "UNKNOWN";
}

FetchFuture FetchFuture::Ready(FetchOutcome outcome) {
  FetchFuture f;
  f.Complete(std::move(outcome));
  return f;
}

FetchOutcome FetchFuture::Wait() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->outcome;
}

bool FetchFuture::IsReady() const {
  std::lock_guard lock(state_->mu);
  return state_->done;
}

void FetchFuture::Complete(FetchOutcome outcome) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->done) return;
    state_->outcome = std::move(outcome);
    state_->done = true;
  }
  state_->cv.notify_all();
}

}  // namespace strata

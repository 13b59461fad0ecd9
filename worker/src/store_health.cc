#include "store_health.h"

#include <algorithm>

namespace strata::worker {

void StoreHealth::Record(const Status& status, Path path, uint64_t started) {
  if (started != failures_) return;
  if (!Unreachable(status)) {
    if (path == Path::kData) backoff_ = 0;
    retry_at_ = 0;
    return;
  }
  ++failures_;
  backoff_ = backoff_ == 0 ? initial_ : std::min(max_, 2 * backoff_);
  retry_at_ = clock_.Now() + backoff_;
}

}  // namespace strata::worker

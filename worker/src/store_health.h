// Whether the store is worth asking now. A store that cannot be reached, or
// does not answer in time, would otherwise cost every match and every
// commit a full client timeout on the engine thread, stalling the whole
// batch. After such a failure the engine leaves the store alone (no match:
// every token computed; no commit) for a back-off that doubles while the
// store stays unreachable; the first call after it is the probe. Any
// answer, even an error, ends the back-off. A match answered by a node
// whose data path is down (a fetch or commit then times out) ends it but
// keeps its length, so the next data-path failure still doubles it: only
// a fetch or commit that gets an answer resets it. A fetch runs on while
// other calls go on: one that started before the last failure recorded
// ends as part of it (calls failing together are one failure), or after
// the back-off it caused, and is then no probe: its outcome is ignored.
#pragma once

#include <cstdint>

#include "strata/clock.h"
#include "strata/status.h"

namespace strata::worker {

class StoreHealth {
 public:
  StoreHealth(const Clock& clock, Nanos initial_backoff, Nanos max_backoff)
      : clock_(clock), initial_(initial_backoff), max_(max_backoff) {}

  // False while backing off.
  bool Usable() const { return clock_.Now() >= retry_at_; }
  // What a store call needed: the control plane only (a match), or the
  // bytes too (a fetch, a commit).
  enum class Path { kControl, kData };
  // Failures recorded so far: what a call that outlives others (a fetch)
  // notes when it starts, for Record.
  uint64_t epoch() const { return failures_; }
  // The outcome of a store call made while usable, which started when
  // epoch() was `started`; ignored if a failure was recorded since.
  void Record(const Status& status, Path path, uint64_t started);
  // The same, for a call that just started and ended (a match, a commit).
  void Record(const Status& status, Path path) { Record(status, path, failures_); }

  // A failure that says the store is out of reach rather than that it
  // refused this one call.
  static bool Unreachable(const Status& status) {
    return status.code() == StatusCode::kUnavailable ||
           status.code() == StatusCode::kDeadlineExceeded;
  }

 private:
  const Clock& clock_;
  const Nanos initial_;
  const Nanos max_;
  Nanos backoff_ = 0;  // the current one; 0: healthy
  Nanos retry_at_ = 0;
  uint64_t failures_ = 0;
};

}  // namespace strata::worker

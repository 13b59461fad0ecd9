// What a fetch can still hand over (DESIGN §3): the usable prefix, blocks
// [0, usable), and the SWA state while the prefix under it stands. Every
// Store's fetch (in-process, remote, cluster) cuts the prefix, voids the
// SWA state and words its failures through this one class, so the rules
// and the messages are the same whichever store answers.
//
//   FetchPrefix prefix(n, swa_boundary);
//   if (!stored(b)) prefix.CutMissing(b);           // "block b is no longer stored"
//   for (b = 0; b < prefix.usable(); ++b) ...        // verify, copy
//   if (bad) prefix.CutBlock(b, st);                 // "block b: <why>"
//   if (swa asked && prefix.SwaCovered()) ...        // copy and verify the state
//   prefix.Finish(swa_verified, out);
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "strata/status.h"
#include "strata/store.h"
#include "strata/store_types.h"

namespace strata {

class FetchPrefix {
 public:
  // `blocks`: the block buffers asked for. `swa_boundary`: the match's SWA
  // boundary when its state was asked for; nullopt when it was not.
  FetchPrefix(size_t blocks, std::optional<uint32_t> swa_boundary);

  size_t usable() const { return usable_; }
  const Status& status() const { return status_; }

  // Blocks [b, ...) are not served. The first block to fail says why: a cut
  // past the current end changes nothing.
  void Cut(size_t b, Status why);
  // Cut, the reason prefixed with the block: "block b: <why>".
  void CutBlock(size_t b, const Status& why);
  // Block b is gone from the store: NOT_FOUND "block b is no longer stored"
  // (": detail" when the store knows more).
  void CutMissing(size_t b, std::string_view detail = {});
  // Shortens the prefix without a reason of its own: the caller reported
  // (or reports) the failure that did it.
  void Truncate(size_t b);
  // A failure that cuts nothing by itself (the SWA state's, a transfer's):
  // reported unless an earlier one is.
  void Report(Status why);
  // The SWA state is not (or no longer) in the store.
  void SwaMissing() { Report(NotFound("SWA state is no longer stored")); }

  // Whether the SWA state was asked for and its prefix still stands: the
  // state is only good on top of the blocks up to its boundary, so a block
  // that fails short of it voids the state.
  bool SwaCovered() const;

  // The outcome: blocks_ready, swa_ready (verified and still covered) and
  // the status. Bytes are the caller's to count.
  void Finish(bool swa_verified, FetchOutcome& out) const;

 private:
  size_t usable_;
  std::optional<uint32_t> swa_boundary_;
  Status status_;
};

// A fetch of a match that took no lease (locations and replicas are only
// good under one): the first `blocks` of it, and its SWA state when
// `want_swa`, matched again by key with a lease, through `store` itself.
Result<MatchResult> MatchAgainWithLease(Store& store, const MatchResult& match, size_t blocks,
                                        bool want_swa);

}  // namespace strata

#include "strata/store_types.h"

#include <algorithm>
#include <atomic>

#include "util/copy_pool.h"

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

Result<std::vector<CommitBlock>> CommitBlocksOf(std::span<const CommitPayload> payloads) {
  std::vector<CommitBlock> blocks;
  blocks.reserve(payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (payloads[i].bytes.size() != payloads[i].block.payload_bytes) {
      return InvalidArgument("block " + std::to_string(i) + ": carries " +
                             std::to_string(payloads[i].bytes.size()) + " bytes, declares " +
                             std::to_string(payloads[i].block.payload_bytes));
    }
    blocks.push_back(payloads[i].block);
  }
  return blocks;
}

Status CheckMatchOptions(uint32_t block_tokens, Nanos lease_ttl, size_t blocks) {
  if (block_tokens < kMinBlockTokens || block_tokens > kMaxBlockTokens) {
    return InvalidArgument("block_tokens must be in " + std::to_string(kMinBlockTokens) + ".." +
                           std::to_string(kMaxBlockTokens) + ", got " +
                           std::to_string(block_tokens));
  }
  if (lease_ttl < 0 || lease_ttl > kMaxLeaseTtl) {
    return InvalidArgument("lease ttl outside 0.." + std::to_string(kMaxLeaseTtl) + " ns");
  }
  if (blocks > kMaxBlocksPerCall) {
    return InvalidArgument("prompt spans more than " + std::to_string(kMaxBlocksPerCall) +
                           " blocks");
  }
  return Status::Ok();
}

Status CheckFetchRequest(const FetchRequest& req, bool* want_swa) {
  *want_swa = false;
  if (req.match == nullptr) return InvalidArgument("fetch needs a match result");
  const MatchResult& match = *req.match;
  const size_t n = req.block_buffers.size();
  if (n > match.blocks.size()) {
    return InvalidArgument("fetch of " + std::to_string(n) + " blocks, match has " +
                           std::to_string(match.blocks.size()));
  }
  for (size_t b = 0; b < n; ++b) {
    if (req.block_buffers[b].size() < match.blocks[b].payload_bytes) {
      return InvalidArgument("buffer for block " + std::to_string(b) + " is too small");
    }
  }
  *want_swa = !req.swa_buffer.empty() && match.swa.has_value();
  if (*want_swa && req.swa_buffer.size() < match.swa->entry.payload_bytes) {
    return InvalidArgument("SWA buffer is too small");
  }
  // The state is only good with the prefix under it (DESIGN §3), so it
  // comes with that prefix or not at all.
  if (*want_swa && n < match.swa->boundary_blocks) {
    return InvalidArgument(
        "the SWA state after block " + std::to_string(match.swa->boundary_blocks) +
        " needs those " + std::to_string(match.swa->boundary_blocks) + " blocks fetched with it (" +
        std::to_string(n) + " asked for); pass no SWA buffer to skip it");
  }
  return Status::Ok();
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

namespace {

// One CopyVerifiedBodies call. Each worker copies a contiguous slice of the
// blocks, layer group by layer group, and publishes how many groups it has
// finished. Worker 0 (the caller) reports group g once every slice has
// finished it, so the events come in the same order as from one thread.
class BodyCopy {
 public:
  static constexpr size_t kNoFailure = SIZE_MAX;

  BodyCopy(std::span<const VerifiedCopy> blocks,
           const std::function<void(const FetchEvent&)>& on_event, uint64_t* bytes,
           std::optional<CopyFailure>* failure,
           const std::function<void(size_t group)>& after_group, size_t threads)
      : blocks_(blocks),
        on_event_(on_event),
        bytes_(bytes),
        failure_(failure),
        after_group_(after_group),
        progress_(threads),
        failed_group_(blocks.size()),
        limit_(blocks.size()),
        usable_(blocks.size()) {
    for (const VerifiedCopy& b : blocks_) {
      max_groups_ = std::max(max_groups_, b.header->groups.size());
      for (const GroupExtent& ge : b.header->groups) body_bytes_ += ge.length;
    }
    for (auto& f : failed_group_) f.store(kNoFailure, std::memory_order_relaxed);
  }

  uint64_t body_bytes() const { return body_bytes_; }
  // How many leading blocks arrived whole (all of them, until a failure).
  size_t usable() const { return usable_; }

  // Worker w of `workers`: copies and hashes its slice, group by group;
  // worker 0 also reports each group.
  void Work(size_t w, size_t workers) {
    const size_t lo = blocks_.size() * w / workers;
    const size_t hi = blocks_.size() * (w + 1) / workers;
    for (size_t g = 0; g < max_groups_; ++g) {
      for (size_t b = lo; b < hi && b < limit_.load(std::memory_order_relaxed); ++b) {
        const auto& groups = blocks_[b].header->groups;
        if (g >= groups.size() || failed_group_[b].load(std::memory_order_relaxed) != kNoFailure) {
          continue;
        }
        const GroupExtent& ge = groups[g];
        if (CopyAndChecksum(blocks_[b].dst + ge.offset, blocks_[b].src + ge.offset, ge.length) !=
            ge.checksum) {
          failed_group_[b].store(g, std::memory_order_relaxed);
        }
      }
      progress_[w].groups_done.store(g + 1, std::memory_order_release);
      if (w == 0) {
        ReportGroup(g, workers);
        if (usable_ == 0) break;
      }
    }
  }

  // kBlockReady for each block that arrived whole.
  void ReportBlocks() {
    if (!on_event_) return;
    for (size_t b = 0; b < usable_; ++b) {
      on_event_({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(b), 0});
    }
  }

 private:
  // Once every worker has finished group g: kGroupReady for each usable
  // block's group g, up to the first that failed it, then kLayerGroupDone.
  void ReportGroup(size_t g, size_t workers) {
    for (size_t w = 1; w < workers; ++w) {
      SpinWait wait;
      while (progress_[w].groups_done.load(std::memory_order_acquire) <= g) wait.Once();
    }
    for (size_t b = 0; b < usable_; ++b) {
      const auto& groups = blocks_[b].header->groups;
      if (g >= groups.size()) continue;
      if (failed_group_[b].load(std::memory_order_relaxed) <= g) {
        *failure_ = CopyFailure{b, g};
        usable_ = b;
        limit_.store(b, std::memory_order_relaxed);
        break;
      }
      *bytes_ += groups[g].length;
      if (on_event_) {
        on_event_(
            {FetchEvent::Type::kGroupReady, static_cast<uint32_t>(b), static_cast<uint32_t>(g)});
      }
    }
    if (after_group_) after_group_(g);
    if (on_event_ && usable_ > 0) {
      on_event_({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(usable_),
                 static_cast<uint32_t>(g)});
    }
  }

  struct alignas(64) Progress {
    std::atomic<size_t> groups_done{0};
  };

  const std::span<const VerifiedCopy> blocks_;
  const std::function<void(const FetchEvent&)>& on_event_;
  uint64_t* const bytes_;
  std::optional<CopyFailure>* const failure_;
  const std::function<void(size_t group)>& after_group_;
  size_t max_groups_ = 0;
  uint64_t body_bytes_ = 0;
  std::vector<Progress> progress_;  // one per worker
  // Written by the block's worker, read by worker 0 while that worker may
  // already be on the next group: atomic.
  std::vector<std::atomic<size_t>> failed_group_;
  std::atomic<size_t> limit_;  // blocks from here on are past a failure
  size_t usable_;              // worker 0's only
};

}  // namespace

size_t CopyVerifiedBodies(std::span<const VerifiedCopy> blocks,
                          const std::function<void(const FetchEvent&)>& on_event, uint64_t* bytes,
                          std::optional<CopyFailure>* failure,
                          const std::function<void(size_t group)>& after_group, CopyPool* pool) {
  constexpr uint64_t kParallelFromBytes = 1 << 20;  // below: not worth waking a helper
  BodyCopy copy(blocks, on_event, bytes, failure, after_group,
                pool != nullptr ? pool->threads() : 1);
  const size_t max_workers = copy.body_bytes() >= kParallelFromBytes ? blocks.size() : 1;
  if (pool != nullptr) {
    pool->Run(max_workers, [&copy](size_t w, size_t workers) { copy.Work(w, workers); });
  } else {
    copy.Work(0, 1);
  }
  copy.ReportBlocks();
  return copy.usable();
}

}  // namespace strata

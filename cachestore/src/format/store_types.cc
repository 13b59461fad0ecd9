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

size_t CopyVerifiedBodies(std::span<const VerifiedCopy> blocks,
                          const std::function<void(const FetchEvent&)>& on_event, uint64_t* bytes,
                          std::optional<CopyFailure>* failure,
                          const std::function<void(size_t group)>& after_group, CopyPool* pool) {
  constexpr size_t kNoFailure = SIZE_MAX;
  constexpr uint64_t kParallelFromBytes = 1 << 20;  // below: not worth waking a helper
  size_t max_groups = 0;
  uint64_t body_bytes = 0;
  for (const VerifiedCopy& b : blocks) {
    max_groups = std::max(max_groups, b.header->groups.size());
    for (const GroupExtent& ge : b.header->groups) body_bytes += ge.length;
  }
  // Each worker copies a contiguous slice of the blocks, layer group by
  // layer group, and publishes how many groups it has finished. Worker 0
  // (the caller) reports group g once every slice has finished it, so the
  // events come in the same order as from one thread.
  struct alignas(64) Progress {
    std::atomic<size_t> groups_done{0};
  };
  std::vector<Progress> progress(pool != nullptr ? pool->threads() : 1);
  // Written by the block's worker, read by worker 0 while that worker may
  // already be on the next group: atomic.
  std::vector<std::atomic<size_t>> failed_group(blocks.size());
  for (auto& f : failed_group) f.store(kNoFailure, std::memory_order_relaxed);
  std::atomic<size_t> limit{blocks.size()};  // blocks from here on are past a failure
  size_t usable = blocks.size();

  auto report_group = [&](size_t g, size_t workers) {
    for (size_t w = 1; w < workers; ++w) {
      SpinWait wait;
      while (progress[w].groups_done.load(std::memory_order_acquire) <= g) wait.Once();
    }
    for (size_t b = 0; b < usable; ++b) {
      const auto& groups = blocks[b].header->groups;
      if (g >= groups.size()) continue;
      if (failed_group[b].load(std::memory_order_relaxed) <= g) {
        *failure = CopyFailure{b, g};
        usable = b;
        limit.store(b, std::memory_order_relaxed);
        break;
      }
      *bytes += groups[g].length;
      if (on_event) {
        on_event(
            {FetchEvent::Type::kGroupReady, static_cast<uint32_t>(b), static_cast<uint32_t>(g)});
      }
    }
    if (after_group) after_group(g);
    if (on_event && usable > 0) {
      on_event({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(usable),
                static_cast<uint32_t>(g)});
    }
  };
  auto work = [&](size_t w, size_t workers) {
    const size_t lo = blocks.size() * w / workers;
    const size_t hi = blocks.size() * (w + 1) / workers;
    for (size_t g = 0; g < max_groups; ++g) {
      for (size_t b = lo; b < hi && b < limit.load(std::memory_order_relaxed); ++b) {
        const auto& groups = blocks[b].header->groups;
        if (g >= groups.size() || failed_group[b].load(std::memory_order_relaxed) != kNoFailure) {
          continue;
        }
        const GroupExtent& ge = groups[g];
        if (CopyAndChecksum(blocks[b].dst + ge.offset, blocks[b].src + ge.offset, ge.length) !=
            ge.checksum) {
          failed_group[b].store(g, std::memory_order_relaxed);
        }
      }
      progress[w].groups_done.store(g + 1, std::memory_order_release);
      if (w == 0) {
        report_group(g, workers);
        if (usable == 0) break;
      }
    }
  };
  const size_t max_workers = body_bytes >= kParallelFromBytes ? blocks.size() : 1;
  if (pool != nullptr) {
    pool->Run(max_workers, work);
  } else {
    work(0, 1);
  }
  if (on_event) {
    for (size_t b = 0; b < usable; ++b) {
      on_event({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(b), 0});
    }
  }
  return usable;
}

}  // namespace strata

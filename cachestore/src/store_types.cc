#include "strata/store_types.h"

#include <algorithm>

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
                          const std::function<void(size_t group)>& after_group) {
  size_t usable = blocks.size();
  size_t max_groups = 0;
  for (const VerifiedCopy& b : blocks) max_groups = std::max(max_groups, b.header->groups.size());
  for (size_t g = 0; g < max_groups && usable > 0; ++g) {
    for (size_t b = 0; b < usable; ++b) {
      const std::vector<GroupExtent>& groups = blocks[b].header->groups;
      if (g >= groups.size()) continue;
      const GroupExtent& ge = groups[g];
      if (CopyAndChecksum(blocks[b].dst + ge.offset, blocks[b].src + ge.offset, ge.length) !=
          ge.checksum) {
        *failure = CopyFailure{b, g};
        usable = b;
        break;
      }
      *bytes += ge.length;
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
  }
  if (on_event) {
    for (size_t b = 0; b < usable; ++b) {
      on_event({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(b), 0});
    }
  }
  return usable;
}

}  // namespace strata

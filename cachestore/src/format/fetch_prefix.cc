#include "format/fetch_prefix.h"

#include <string>
#include <utility>
#include <vector>

namespace strata {

FetchPrefix::FetchPrefix(size_t blocks, std::optional<uint32_t> swa_boundary)
    : usable_(blocks), swa_boundary_(swa_boundary) {}

void FetchPrefix::Cut(size_t b, Status why) {
  if (b >= usable_) return;
  usable_ = b;
  status_ = std::move(why);
}

void FetchPrefix::CutBlock(size_t b, const Status& why) {
  Cut(b, Status(why.code(), "block " + std::to_string(b) + ": " + why.message()));
}

void FetchPrefix::CutMissing(size_t b, std::string_view detail) {
  std::string message = "block " + std::to_string(b) + " is no longer stored";
  if (!detail.empty()) message += ": " + std::string(detail);
  Cut(b, NotFound(std::move(message)));
}

void FetchPrefix::Truncate(size_t b) {
  if (b < usable_) usable_ = b;
}

void FetchPrefix::Report(Status why) {
  if (status_.ok()) status_ = std::move(why);
}

bool FetchPrefix::SwaCovered() const {
  return swa_boundary_.has_value() && usable_ >= *swa_boundary_;
}

void FetchPrefix::Finish(bool swa_verified, FetchOutcome& out) const {
  out.blocks_ready = static_cast<uint32_t>(usable_);
  out.swa_ready = swa_verified && SwaCovered();
  out.status = status_;
}

Result<MatchResult> MatchAgainWithLease(Store& store, const MatchResult& match, size_t blocks,
                                        bool want_swa) {
  std::vector<ChainKey> keys;
  for (size_t b = 0; b < blocks; ++b) keys.push_back(match.blocks[b].key);
  MatchKeysRequest again;
  again.model_id = match.model_id;
  again.root = match.prefix_key;
  again.keys = keys;
  again.block_tokens = match.block_tokens == 0 ? 1 : match.block_tokens;
  again.want_swa = want_swa;
  again.take_lease = true;
  return store.MatchKeys(again);
}

}  // namespace strata

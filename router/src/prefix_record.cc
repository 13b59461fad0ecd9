#include "strata/router/prefix_record.h"

#include <ranges>

namespace strata::router {

PrefixRecord::PrefixRecord(uint32_t block_tokens, size_t capacity)
    : block_tokens_(block_tokens), capacity_(capacity) {}

std::vector<uint64_t> PrefixRecord::BlockHashes(std::span<const uint32_t> prompt) const {
  std::vector<uint64_t> hashes;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the tokens, chained block to block
  for (size_t i = 0; i < prompt.size(); ++i) {
    for (int b = 0; b < 4; ++b) {
      h ^= (prompt[i] >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
    if ((i + 1) % block_tokens_ == 0) hashes.push_back(h);
  }
  return hashes;
}

uint64_t PrefixRecord::CachedTokens(const std::vector<uint64_t>& hashes, size_t worker) const {
  uint64_t blocks = 0;
  for (uint64_t h : hashes) {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || (it->second.workers & (uint64_t{1} << worker)) == 0) break;
    ++blocks;
  }
  return blocks * block_tokens_;
}

void PrefixRecord::Record(const std::vector<uint64_t>& hashes, size_t worker) {
  // Deepest first, so a prefix's ancestors are younger and go after it.
  for (uint64_t h : std::ranges::reverse_view(hashes)) {
    auto [it, inserted] = blocks_.try_emplace(h);
    if (!inserted) ages_.erase(it->second.age);
    ages_.push_front(h);
    it->second.age = ages_.begin();
    it->second.workers |= uint64_t{1} << worker;
  }
  while (blocks_.size() > capacity_) {
    blocks_.erase(ages_.back());
    ages_.pop_back();
  }
}

}  // namespace strata::router

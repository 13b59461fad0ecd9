// The router's record of which prompt prefixes it sent to which worker, at
// the store's block size: a worker that computed a prefix holds it in its
// HBM tier until it evicts it. Bounded: the least recently sent blocks are
// forgotten first. Not thread-safe (the router locks around it).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata::router {

class PrefixRecord {
 public:
  explicit PrefixRecord(uint32_t block_tokens = 256, size_t capacity = size_t{1} << 20);

  // One hash per full block of `prompt`, each covering the whole prefix up
  // to its block's end.
  std::vector<uint64_t> BlockHashes(std::span<const uint32_t> prompt) const;
  // Tokens of the leading blocks of `hashes` that were sent to `worker`
  // (< 64).
  uint64_t CachedTokens(const std::vector<uint64_t>& hashes, size_t worker) const;
  void Record(const std::vector<uint64_t>& hashes, size_t worker);
  size_t size() const { return blocks_.size(); }

 private:
  struct Block {
    uint64_t workers = 0;  // bit per worker
    std::list<uint64_t>::iterator age;
  };
  const uint32_t block_tokens_;
  const size_t capacity_;
  std::unordered_map<uint64_t, Block> blocks_;
  std::list<uint64_t> ages_;  // most recent first
};

}  // namespace strata::router

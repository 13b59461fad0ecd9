// V4.1 global-KV blocks for the benchmarks that go through a Store (node,
// cluster): sealed random payloads, random prompts, and a commit helper.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "strata/layout.h"
#include "strata/store.h"

namespace strata::bench {

const ModelId& BenchModel();

struct SealedBlock {
  std::vector<std::byte> bytes;
  uint64_t checksum = 0;
};
// A payload of `layout` with random bodies, sealed (header and checksum).
SealedBlock MakeBlock(const Layout& layout, uint64_t seed);
std::vector<uint32_t> RandomTokens(size_t n, uint64_t seed);

// Commits every full block of `tokens` for BenchModel() (blocks already
// stored are no-ops), `bytes_of(b)` giving block b's bytes.
Status CommitPrompt(Store& store, std::span<const uint32_t> tokens,
                    const std::function<const SealedBlock&(size_t)>& bytes_of);

}  // namespace strata::bench

// Token sampling: greedy (argmax, ties to the lower id) or seeded
// temperature sampling whose randomness depends only on (seed, position),
// so a request samples the same tokens whatever it is batched with.
#pragma once

#include <cstdint>
#include <span>

namespace strata::worker {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
};

uint32_t Sample(std::span<const float> logits, const SamplingParams& params, int64_t position);

}  // namespace strata::worker

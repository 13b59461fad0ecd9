#include "strata/worker/sampler.h"

#include <cmath>

namespace strata::worker {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

uint32_t Sample(std::span<const float> logits, const SamplingParams& params, int64_t position) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (params.temperature <= 0.0f) return best;
  // Inverse-CDF sampling over exp((l - max) / T), summed in id order.
  double total = 0;
  for (float l : logits)
    total += std::exp((static_cast<double>(l) - logits[best]) / params.temperature);
  const double u =
      static_cast<double>(Mix(params.seed ^ Mix(static_cast<uint64_t>(position))) >> 11) *
      0x1.0p-53 * total;
  double acc = 0;
  for (uint32_t i = 0; i < logits.size(); ++i) {
    acc += std::exp((static_cast<double>(logits[i]) - logits[best]) / params.temperature);
    if (u < acc) return i;
  }
  return best;
}

}  // namespace strata::worker

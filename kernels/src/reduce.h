// The one dot product every CPU kernel uses. Its summation order is fixed
// (eight interleaved partial sums, then a fixed pairwise tree), so a row's
// result depends only on that row's data: never on batch size, chunking or
// threads. Sources are built with -ffp-contract=off so no a * b + c is fused
// differently in different call sites.
#pragma once

#include <cstddef>

namespace strata::kernels::detail {

inline float Dot(const float* a, const float* b, size_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t body = n - n % 8;
  for (size_t i = 0; i < body; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (size_t j = 0; j < n % 8; ++j) acc[j] += a[body + j] * b[body + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace strata::kernels::detail

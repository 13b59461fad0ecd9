// Row-wise dense ops with a fixed summation order (the same eight-way
// partial sums as the kernels), built with -ffp-contract=off: a row's result
// depends only on that row, never on batch size or chunking.
#pragma once

#include <cmath>
#include <cstddef>

namespace strata::worker {

inline float Dot(const float* a, const float* b, size_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t body = n - n % 8;
  for (size_t i = 0; i < body; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (size_t j = 0; j < n % 8; ++j) acc[j] += a[body + j] * b[body + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y[r][o] = x[r] . w[o]; x is rows x in, w is out x in (row-major).
inline void Linear(const float* x, size_t rows, size_t in, const float* w, size_t out, float* y) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) y[r * out + o] = Dot(x + r * in, w + o * in, in);
  }
}

// y = x / sqrt(mean(x^2) + eps) * g, per row.
inline void RmsNorm(const float* x, size_t rows, size_t d, const float* g, float eps, float* y) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    const float inv = 1.0f / std::sqrt(Dot(xr, xr, d) / static_cast<float>(d) + eps);
    for (size_t k = 0; k < d; ++k) y[r * d + k] = xr[k] * inv * g[k];
  }
}

}  // namespace strata::worker

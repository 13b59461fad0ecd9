// The one dot product every CPU kernel uses. Its summation order is fixed
// (eight interleaved partial sums, then a fixed pairwise tree), so a row's
// result depends only on that row's data: never on batch size, chunking or
// threads. Sources are built with -ffp-contract=off so no a * b + c is fused
// differently in different call sites.
#pragma once

#include <cstddef>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// Dot4: Dot(a, b + r * stride, n) for r = 0..3, bit for bit. Each result
// gets the same per-lane multiply-then-add sequence and the same reduction
// tree as Dot; the four share the loads of `a`, and their independent
// dependency chains keep the adders busy. A body (all but n % 8 values)
// fills acc[r][lane] = Dot's acc[lane]; FinishDot adds the tail and
// reduces, as Dot does.

// Any CPU: Dot's loop, four rows of b at a time.
inline void Dot4BodyPortable(const float* a, const float* b, size_t stride, size_t body,
                             float (*acc)[8]) {
  for (int r = 0; r < 4; ++r) {
    for (size_t j = 0; j < 8; ++j) acc[r][j] = 0;
  }
  for (size_t i = 0; i < body; i += 8) {
    for (int r = 0; r < 4; ++r) {
      for (size_t j = 0; j < 8; ++j) acc[r][j] += a[i + j] * b[r * stride + i + j];
    }
  }
}

#if defined(__x86_64__)
// AVX: Dot's eight partial sums are exactly one register's lanes. One or
// (kTwoRows) two rows of `a` against four rows of b: each loaded b vector
// feeds both. Written out per row: arrays of vectors stay on the stack.
template <bool kTwoRows>
__attribute__((target("avx"))) inline void DotBodyAvx(const float* a0, const float* a1,
                                                      const float* b, size_t stride, size_t body,
                                                      float (*acc0)[8], float (*acc1)[8]) {
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00;
  __m256 s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  for (size_t i = 0; i < body; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(a0 + i);
    const __m256 k0 = _mm256_loadu_ps(b0 + i), k1 = _mm256_loadu_ps(b1 + i),
                 k2 = _mm256_loadu_ps(b2 + i), k3 = _mm256_loadu_ps(b3 + i);
    s00 = _mm256_add_ps(s00, _mm256_mul_ps(x0, k0));
    s01 = _mm256_add_ps(s01, _mm256_mul_ps(x0, k1));
    s02 = _mm256_add_ps(s02, _mm256_mul_ps(x0, k2));
    s03 = _mm256_add_ps(s03, _mm256_mul_ps(x0, k3));
    if constexpr (kTwoRows) {
      const __m256 x1 = _mm256_loadu_ps(a1 + i);
      s10 = _mm256_add_ps(s10, _mm256_mul_ps(x1, k0));
      s11 = _mm256_add_ps(s11, _mm256_mul_ps(x1, k1));
      s12 = _mm256_add_ps(s12, _mm256_mul_ps(x1, k2));
      s13 = _mm256_add_ps(s13, _mm256_mul_ps(x1, k3));
    }
  }
  _mm256_storeu_ps(acc0[0], s00);
  _mm256_storeu_ps(acc0[1], s01);
  _mm256_storeu_ps(acc0[2], s02);
  _mm256_storeu_ps(acc0[3], s03);
  if constexpr (kTwoRows) {
    _mm256_storeu_ps(acc1[0], s10);
    _mm256_storeu_ps(acc1[1], s11);
    _mm256_storeu_ps(acc1[2], s12);
    _mm256_storeu_ps(acc1[3], s13);
  }
}

inline bool CpuHasAvx() {
  static const bool has = __builtin_cpu_supports("avx");
  return has;
}
#endif

// The tail and the reduction tree of Dot, for four rows of b.
inline void FinishDot(const float* a, const float* b, size_t stride, size_t n, float (*acc)[8],
                      float* out) {
  const size_t body = n - n % 8;
  for (int r = 0; r < 4; ++r) {
    const float* br = b + r * stride;
    for (size_t j = 0; j < n % 8; ++j) acc[r][j] += a[body + j] * br[body + j];
    out[r] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) +
             ((acc[r][4] + acc[r][5]) + (acc[r][6] + acc[r][7]));
  }
}

inline void Dot4(const float* a, const float* b, size_t stride, size_t n, float* out) {
  float acc[4][8];
  const size_t body = n - n % 8;
#if defined(__x86_64__)
  if (CpuHasAvx()) {
    DotBodyAvx<false>(a, nullptr, b, stride, body, acc, nullptr);
  } else {
    Dot4BodyPortable(a, b, stride, body, acc);
  }
#else
  Dot4BodyPortable(a, b, stride, body, acc);
#endif
  FinishDot(a, b, stride, n, acc, out);
}

// Dot4 of two rows a0 and a1 against the same four rows of b.
inline void Dot2x4(const float* a0, const float* a1, const float* b, size_t stride, size_t n,
                   float* out0, float* out1) {
#if defined(__x86_64__)
  if (CpuHasAvx()) {
    float acc0[4][8], acc1[4][8];
    DotBodyAvx<true>(a0, a1, b, stride, n - n % 8, acc0, acc1);
    FinishDot(a0, b, stride, n, acc0, out0);
    FinishDot(a1, b, stride, n, acc1, out1);
    return;
  }
#endif
  Dot4(a0, b, stride, n, out0);
  Dot4(a1, b, stride, n, out1);
}

}  // namespace strata::kernels::detail

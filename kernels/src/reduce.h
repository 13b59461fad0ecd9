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
// dependency chains keep the adders busy. The body (all but n % 8 values)
// fills acc[r][lane] = Dot's acc[lane]; one variant per instruction set.

// Any CPU: Dot's loop, four keys at a time.
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
// AVX: Dot's eight partial sums are exactly one register's lanes.
// Written out per key: arrays of vectors indexed in a loop stay on the stack.
__attribute__((target("avx"))) inline void Dot4BodyAvx(const float* a, const float* b,
                                                       size_t stride, size_t body,
                                                       float (*acc)[8]) {
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < body; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(x, _mm256_loadu_ps(b0 + i)));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(x, _mm256_loadu_ps(b1 + i)));
    s2 = _mm256_add_ps(s2, _mm256_mul_ps(x, _mm256_loadu_ps(b2 + i)));
    s3 = _mm256_add_ps(s3, _mm256_mul_ps(x, _mm256_loadu_ps(b3 + i)));
  }
  _mm256_storeu_ps(acc[0], s0);
  _mm256_storeu_ps(acc[1], s1);
  _mm256_storeu_ps(acc[2], s2);
  _mm256_storeu_ps(acc[3], s3);
}

// The whole of Dot4 for n % 8 == 0, reduced in registers: two rounds of
// horizontal adds form each key's (l0+l1)+(l2+l3) and (l4+l5)+(l6+l7), and
// the halves' sum is the last node of Dot's tree.
__attribute__((target("avx"))) inline void Dot4Avx(const float* a, const float* b, size_t stride,
                                                   size_t n, float* out) {
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(x, _mm256_loadu_ps(b0 + i)));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(x, _mm256_loadu_ps(b1 + i)));
    s2 = _mm256_add_ps(s2, _mm256_mul_ps(x, _mm256_loadu_ps(b2 + i)));
    s3 = _mm256_add_ps(s3, _mm256_mul_ps(x, _mm256_loadu_ps(b3 + i)));
  }
  const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1)));
}

// Dot4Avx for two rows of `a` at once: each key vector loaded feeds both.
__attribute__((target("avx"))) inline void Dot2x4Avx(const float* a0, const float* a1,
                                                     const float* b, size_t stride, size_t n,
                                                     float* out0, float* out1) {
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00;
  __m256 s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  for (size_t i = 0; i < n; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(a0 + i), x1 = _mm256_loadu_ps(a1 + i);
    __m256 k = _mm256_loadu_ps(b0 + i);
    s00 = _mm256_add_ps(s00, _mm256_mul_ps(x0, k));
    s10 = _mm256_add_ps(s10, _mm256_mul_ps(x1, k));
    k = _mm256_loadu_ps(b1 + i);
    s01 = _mm256_add_ps(s01, _mm256_mul_ps(x0, k));
    s11 = _mm256_add_ps(s11, _mm256_mul_ps(x1, k));
    k = _mm256_loadu_ps(b2 + i);
    s02 = _mm256_add_ps(s02, _mm256_mul_ps(x0, k));
    s12 = _mm256_add_ps(s12, _mm256_mul_ps(x1, k));
    k = _mm256_loadu_ps(b3 + i);
    s03 = _mm256_add_ps(s03, _mm256_mul_ps(x0, k));
    s13 = _mm256_add_ps(s13, _mm256_mul_ps(x1, k));
  }
  const __m256 p0 = _mm256_hadd_ps(_mm256_hadd_ps(s00, s01), _mm256_hadd_ps(s02, s03));
  const __m256 p1 = _mm256_hadd_ps(_mm256_hadd_ps(s10, s11), _mm256_hadd_ps(s12, s13));
  _mm_storeu_ps(out0, _mm_add_ps(_mm256_castps256_ps128(p0), _mm256_extractf128_ps(p0, 1)));
  _mm_storeu_ps(out1, _mm_add_ps(_mm256_castps256_ps128(p1), _mm256_extractf128_ps(p1, 1)));
}

inline bool CpuHasAvx() {
  static const bool has = __builtin_cpu_supports("avx");
  return has;
}
#endif

inline void Dot4(const float* a, const float* b, size_t stride, size_t n, float* out) {
  float acc[4][8];
  const size_t body = n - n % 8;
#if defined(__x86_64__)
  if (body == n && CpuHasAvx()) {
    Dot4Avx(a, b, stride, n, out);
    return;
  }
  if (CpuHasAvx()) {
    Dot4BodyAvx(a, b, stride, body, acc);
  } else {
    Dot4BodyPortable(a, b, stride, body, acc);
  }
#else
  Dot4BodyPortable(a, b, stride, body, acc);
#endif
  for (int r = 0; r < 4; ++r) {
    const float* br = b + r * stride;
    for (size_t j = 0; j < n % 8; ++j) acc[r][j] += a[body + j] * br[body + j];
    out[r] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) +
             ((acc[r][4] + acc[r][5]) + (acc[r][6] + acc[r][7]));
  }
}

// Dot4 of two rows a0 and a1 against the same four rows of b.
inline void Dot2x4(const float* a0, const float* a1, const float* b, size_t stride, size_t n,
                   float* out0, float* out1) {
#if defined(__x86_64__)
  if (n % 8 == 0 && CpuHasAvx()) {
    Dot2x4Avx(a0, a1, b, stride, n, out0, out1);
    return;
  }
#endif
  Dot4(a0, b, stride, n, out0);
  Dot4(a1, b, stride, n, out1);
}

}  // namespace strata::kernels::detail

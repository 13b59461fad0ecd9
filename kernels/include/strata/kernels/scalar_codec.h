// Scalar encoders and decoders for the element and scale types, shared by
// the CPU kernels and the CUDA kernels (the functions are __host__
// __device__ under nvcc) so both sides quantize bit-identically.
//
// Element types:
//   e2m1 (FP4): sign, 2 exponent bits (bias 1), 1 mantissa bit. Magnitudes
//     0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0..7; bit 3 is the sign. No Inf,
//     no NaN.
//   e4m3 (FP8, OCP "e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa
//     bits. Largest finite 448; subnormals down to 2^-9; no Inf; 0x7f and
//     0xff are NaN.
// Scale type:
//   E8M0: an unsigned byte e meaning 2^(e - 127); 0xff is NaN.
//
// Rounding is round-to-nearest, ties to even. Values are pre-divided by the
// block scale, which is chosen so no finite value exceeds the format's
// largest magnitude (see formats.h); a scaled value above it saturates.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata::kernels::codec {

constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3Max = 448.0f;
constexpr uint8_t kE8m0Nan = 0xff;
constexpr uint8_t kE4m3Nan = 0x7f;
// Every NaN a decoder produces is this one (positive quiet NaN), so CPU and
// CUDA dequantize to the same bits (CUDA arithmetic yields 0x7fffffff).
constexpr uint32_t kCanonicalNanBits = 0x7fc00000u;

// Float <-> bits, on host and device.
STRATA_HD float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}
STRATA_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}
STRATA_HD bool IsNan(float x) { return (FloatToBits(x) & 0x7fffffffu) > 0x7f800000u; }

// 2^k for k in [-127, 127], exact (2^-127 is a float subnormal).
STRATA_HD float Pow2(int k) {
  return k == -127 ? BitsToFloat(0x00400000u) : BitsToFloat(static_cast<uint32_t>(k + 127) << 23);
}

// e with x in [2^(e-1), 2^e), for finite x > 0 (frexp's exponent).
STRATA_HD int BinaryExponent(float x) {
  const int biased = static_cast<int>(FloatToBits(x) >> 23) & 0xff;
  if (biased != 0) return biased - 126;
  int e = 0;  // subnormal: rare, so the library call is fine
#if defined(__CUDA_ARCH__)
  (void)frexpf(x, &e);
#else
  (void)std::frexp(x, &e);
#endif
  return e;
}

// 2^(e-127); NaN for 0xff.
STRATA_HD float DecodeE8m0(uint8_t e) {
  if (e == kE8m0Nan) return BitsToFloat(kCanonicalNanBits);
  return Pow2(static_cast<int>(e) - 127);
}

// The E8M0 byte of the smallest power of two 2^k with amax <= fmt_max * 2^k,
// i.e. k = ceil(log2(amax / fmt_max)), clamped to [-127, 127]. amax must be
// finite and >= 0; amax == 0 gives 2^0.
STRATA_HD uint8_t ScaleForAmax(float amax, float fmt_max) {
  if (!(amax > 0.0f)) return 127;
  // With amax in [2^(a-1), 2^a) and fmt_max in [2^(m-1), 2^m), k = a - m or
  // a - m + 1: fmt_max * 2^(a-m-1) < 2^(a-1) <= amax rules out anything lower.
  int k = BinaryExponent(amax) - BinaryExponent(fmt_max);
  if (k + 1 <= -127) return 0;  // clamped either way
  if (k <= 127 && amax > fmt_max * Pow2(k)) ++k;
  if (k > 127) k = 127;
  return static_cast<uint8_t>(k + 127);
}

STRATA_HD float DecodeE2m1(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 8) << 28;
  const uint32_t exp = (code >> 1) & 3, man = code & 1;
  if (exp == 0) return BitsToFloat(sign | (man ? 0x3f000000u : 0u));  // 0 or 0.5
  // (1 + man / 2) * 2^(exp - 1)
  return BitsToFloat(sign | ((exp - 1 + 127) << 23) | (man << 22));
}

// Nearest e2m1 code, ties to the even code (mantissa bit 0); |v| > 6
// saturates to 6. v must not be NaN.
STRATA_HD uint8_t EncodeE2m1(float v) {
  const uint8_t sign = (FloatToBits(v) >> 31) ? 8 : 0;
  const float a = BitsToFloat(FloatToBits(v) & 0x7fffffffu);
  // The code is the number of midpoints at or below a: '>' where the lower
  // neighbour is even (a tie stays down), '>=' where it is odd (a tie goes
  // up). Branch-free: random data would mispredict a chain of ifs.
  const uint8_t code = static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) +
                                            (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
  return sign | code;
}

STRATA_HD float DecodeE4m3(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80) << 24;
  const uint32_t exp = (bits >> 3) & 15, man = bits & 7;
  if (exp == 15 && man == 7) return BitsToFloat(kCanonicalNanBits);  // either sign
  if (exp == 0)
    return BitsToFloat(sign | FloatToBits(static_cast<float>(man) * 0.001953125f));  // man * 2^-9
  return BitsToFloat(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

// Nearest e4m3 value, ties to even; |v| >= 448 (and +-Inf) saturates to
// 448; NaN encodes as NaN (0x7f, sign kept).
STRATA_HD uint8_t EncodeE4m3(float v) {
  const uint32_t bits = FloatToBits(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | kE4m3Nan;
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448
  if (a < 0x3c800000u) {                     // below 2^-6: the subnormal grid, step 2^-9
    // Adding 2^23 rounds a value in [0, 2^22) to an integer, ties to even.
    const float scaled = BitsToFloat(a) * 512.0f;  // exact
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint8_t>(rounded);  // 8 (= 2^-6) is the first normal code
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding half to even; a carry
  // moves into the exponent as it should. Re-bias the exponent 127 -> 7.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1)) >> 20;
  return sign | static_cast<uint8_t>(r - ((127 - 7) << 3));  // < 448 before, <= 448 after
}

// EncodeE2m1(v * inv); a NaN stores code 0 (e2m1 has no NaN: its group's
// scale byte says NaN instead).
STRATA_HD uint8_t EncodeE2m1Scaled(float v, float inv) {
  return IsNan(v) ? uint8_t{0} : EncodeE2m1(v * inv);
}

// EncodeE4m3(v * inv) for a finite inv, with a NaN encoded from v itself: the
// product's NaN sign is the hardware's choice (x86 keeps it, CUDA does not).
STRATA_HD uint8_t EncodeE4m3Scaled(float v, float inv) {
  return EncodeE4m3(IsNan(v) ? v : v * inv);
}

}  // namespace strata::kernels::codec

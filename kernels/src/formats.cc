#include "strata/kernels/formats.h"

#include <cassert>
#include <cmath>

#include "strata/kernels/scalar_codec.h"

namespace strata::kernels {
namespace {

using namespace codec;

void QuantizeEntry(const BlockFormat& fmt, const float* x, uint8_t* out) {
  const bool fp4 = fmt.element == Element::kE2m1;
  const float fmt_max = fp4 ? kE2m1Max : kE4m3Max;
  uint8_t* scales = out + fmt.CodeBytes();
  for (uint32_t g = 0; g < fmt.ScaleBytes(); ++g) {
    const float* xg = x + g * fmt.group;
    // amax over the finite values (NaN and Inf are rare: the branches predict well).
    float amax = 0.0f;
    bool has_nan = false;
    for (uint32_t i = 0; i < fmt.group; ++i) {
      const float a = std::fabs(xg[i]);
      if (std::isnan(a)) {
        has_nan = true;
      } else if (std::isfinite(a) && a > amax) {
        amax = a;
      }
    }
    const uint8_t scale = ScaleForAmax(amax, fmt_max);
    const float inv = DecodeE8m0(static_cast<uint8_t>(254 - scale));  // 2^-k, exact
    if (fp4) {
      scales[g] = has_nan ? kE8m0Nan : scale;
      uint8_t* codes = out + g * fmt.group / 2;
      // A NaN group decodes as NaN through its scale; its NaNs store code 0.
      for (uint32_t i = 0; i < fmt.group; i += 2) {
        codes[i / 2] = static_cast<uint8_t>(EncodeE2m1Scaled(xg[i], inv) |
                                            (EncodeE2m1Scaled(xg[i + 1], inv) << 4));
      }
    } else {
      scales[g] = scale;
      for (uint32_t i = 0; i < fmt.group; ++i)
        out[g * fmt.group + i] = EncodeE4m3Scaled(xg[i], inv);
    }
  }
}

// Decoded element values, built once from the codec (so they cannot drift
// from it): table lookups keep dequantization off the critical path of the
// attention and indexer kernels.
struct DecodeTables {
  float e2m1[16];
  float e4m3[256];
  DecodeTables() {
    for (int c = 0; c < 16; ++c) e2m1[c] = DecodeE2m1(static_cast<uint8_t>(c));
    for (int b = 0; b < 256; ++b) e4m3[b] = DecodeE4m3(static_cast<uint8_t>(b));
  }
};
const DecodeTables kTables;

}  // namespace

void DequantizeEntry(const BlockFormat& fmt, const uint8_t* in, float* x) {
  const uint8_t* scales = in + fmt.CodeBytes();
  for (uint32_t g = 0; g < fmt.ScaleBytes(); ++g) {
    const float s = DecodeE8m0(scales[g]);
    const uint32_t first = g * fmt.group;
    if (scales[g] == kE8m0Nan) {
      // Written, not computed: the hardware's NaN propagation must not choose the bits.
      for (uint32_t v = first; v < first + fmt.group; ++v) x[v] = BitsToFloat(kCanonicalNanBits);
    } else if (fmt.element == Element::kE2m1) {
      for (uint32_t v = first; v < first + fmt.group; v += 2) {
        x[v] = kTables.e2m1[in[v / 2] & 15] * s;
        x[v + 1] = kTables.e2m1[in[v / 2] >> 4] * s;
      }
    } else {
      // A NaN code's table value is the canonical NaN; times a finite scale it stays that NaN.
      for (uint32_t v = first; v < first + fmt.group; ++v) x[v] = kTables.e4m3[in[v]] * s;
    }
  }
}

void Quantize(const BlockFormat& fmt, const float* x, size_t rows, uint8_t* out) {
  assert(fmt.values % fmt.group == 0 && fmt.group % 2 == 0);
  for (size_t r = 0; r < rows; ++r) QuantizeEntry(fmt, x + r * fmt.values, out + r * fmt.Bytes());
}

void Dequantize(const BlockFormat& fmt, const uint8_t* in, size_t rows, float* x) {
  for (size_t r = 0; r < rows; ++r) DequantizeEntry(fmt, in + r * fmt.Bytes(), x + r * fmt.values);
}

}  // namespace strata::kernels

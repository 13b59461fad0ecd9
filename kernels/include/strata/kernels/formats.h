// Block-scaled low-precision formats of the V4.1-style state (DESIGN §8).
//
// An entry is `values` elements split into groups of `group` consecutive
// values; each group shares one E8M0 scale byte (a power of two).
//
//   format       element  values  group  bytes = codes + scales
//   kMainKv      e2m1     512     16     256 + 32 = 288   (global KV entry)
//   kIndexerKey  e2m1     128     32      64 +  4 =  68   (indexer key)
//   kSwaFp8      e4m3     512     32     512 + 16 = 528   (SWA ring position)
//
// Byte layout of an entry: all element codes first, then the scale bytes in
// group order. e2m1 packs two codes per byte, value 2i in the low nibble and
// value 2i+1 in the high nibble; e4m3 uses one byte per value.
//
// Quantization of one group:
//   - amax = the largest |x| over the group's finite values.
//   - scale = 2^k with k = ceil(log2(amax / fmt_max)) (fmt_max = 6 for e2m1,
//     448 for e4m3), clamped to [-127, 127]; 2^0 for an all-zero group. The
//     scale never clips a finite value: |x| / scale <= fmt_max.
//   - each value is x / scale (exact) rounded to the nearest element value,
//     ties to even (see scalar_codec.h).
//   - +-Inf saturates to +-fmt_max * scale.
//   - NaN: e4m3 stores NaN for that element (0x7f); e2m1 has no NaN, so the
//     whole group's scale byte becomes 0xff (E8M0 NaN) and all its values
//     decode as NaN (the NaN's own code is stored as 0) — a NaN is never
//     silently turned into a number.
// Dequantization is exact: element value times 2^k, both representable.
// Every NaN dequantizes to the one quiet NaN 0x7fc00000 (CPU and CUDA alike),
// so dequantized buffers compare bit for bit.
//
// Error bound (tested): for every finite x in a group with scale s,
//   e2m1: |x - q| <= max(|x| / 4, s / 4)     (1 mantissa bit, quantum s/2)
//   e4m3: |x - q| <= max(|x| / 16, s / 1024) (3 mantissa bits, quantum s/512)
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels {

enum class Element : uint8_t { kE2m1, kE4m3 };

struct BlockFormat {
  Element element;
  uint32_t values;  // per entry; a multiple of `group`
  uint32_t group;   // values per scale byte

  constexpr uint32_t CodeBytes() const { return element == Element::kE2m1 ? values / 2 : values; }
  constexpr uint32_t ScaleBytes() const { return values / group; }
  constexpr uint32_t Bytes() const { return CodeBytes() + ScaleBytes(); }
};

constexpr BlockFormat kMainKv{Element::kE2m1, 512, 16};
constexpr BlockFormat kIndexerKey{Element::kE2m1, 128, 32};
constexpr BlockFormat kSwaFp8{Element::kE4m3, 512, 32};
static_assert(kMainKv.Bytes() == 288 && kIndexerKey.Bytes() == 68 && kSwaFp8.Bytes() == 528);

// Quantizes `rows` entries: x is rows x fmt.values floats, out is
// rows x fmt.Bytes() bytes. Rows are independent.
void Quantize(const BlockFormat& fmt, const float* x, size_t rows, uint8_t* out);

// Dequantizes `rows` entries of fmt.Bytes() bytes into rows x fmt.values floats.
void Dequantize(const BlockFormat& fmt, const uint8_t* in, size_t rows, float* x);

// Dequantizes one entry; the building block of the attention and indexer
// kernels.
void DequantizeEntry(const BlockFormat& fmt, const uint8_t* in, float* x);

}  // namespace strata::kernels

// CUDA formats: Quantize and Dequantize between floats and the FP4 e2m1 /
// MXFP8 e4m3 block formats (formats.h; the CPU reference is
// kernels/src/formats.cc).
//
// Fast path: four consecutive values per thread, group/4 neighbouring lanes
// per group (a power of two <= 32, so a group never straddles a warp). Loads
// and stores are vectorized and coalesced, and a group's amax and NaN flag
// are reduced by shuffles. All three formats take it (QuadPathFits); any
// other shape takes the one-thread-per-group / per-value kernels below it.

#include <algorithm>
#include <cstdint>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"
#include "strata/kernels/scalar_codec.h"

namespace strata::kernels::cuda {
namespace {

using namespace codec;

bool QuadPathFits(const BlockFormat& fmt, const void* floats, const void* bytes) {
  const uint32_t lanes = fmt.group / 4;
  return fmt.group % 4 == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0 && fmt.Bytes() % 4 == 0 &&
         reinterpret_cast<uintptr_t>(floats) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(bytes) % 4 == 0;
}

// The quad kernels index in 32 bits: larger inputs go in several launches.
size_t QuadRowsPerLaunch(const BlockFormat& fmt) { return (size_t{1} << 31) / (fmt.values / 4); }

__global__ void QuantizeQuadKernel(BlockFormat fmt, const float* x, uint32_t quads, uint8_t* out) {
  const uint32_t q = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = q < quads;  // inactive lanes still take part in the shuffles
  const float4 v4 = active ? reinterpret_cast<const float4*>(x)[q] : make_float4(0, 0, 0, 0);
  const float v[4] = {v4.x, v4.y, v4.z, v4.w};
  float amax = 0.0f;  // over the finite values, as on the CPU
  int has_nan = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float a = fabsf(v[j]);
    if (a != a)
      has_nan = 1;
    else if (a <= 3.402823466e38f && a > amax)
      amax = a;
  }
  for (uint32_t o = fmt.group / 8; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // max: any order is exact
    has_nan |= __shfl_xor_sync(0xffffffffu, has_nan, o);
  }
  if (!active) return;
  const uint32_t quads_per_row = fmt.values / 4;
  const uint32_t row = q / quads_per_row, first = (q % quads_per_row) * 4;
  uint8_t* e = out + size_t{row} * fmt.Bytes();
  const bool fp4 = fmt.element == Element::kE2m1;
  const uint8_t scale = ScaleForAmax(amax, fp4 ? kE2m1Max : kE4m3Max);
  const float inv = DecodeE8m0(static_cast<uint8_t>(254 - scale));
  if (fp4) {
    uint32_t codes = 0;  // a NaN group decodes as NaN through its scale; its NaNs store 0
#pragma unroll
    for (int j = 0; j < 4; ++j) codes |= uint32_t{EncodeE2m1Scaled(v[j], inv)} << (4 * j);
    *reinterpret_cast<uint16_t*>(e + first / 2) = static_cast<uint16_t>(codes);
    if (first % fmt.group == 0) e[fmt.CodeBytes() + first / fmt.group] = has_nan ? kE8m0Nan : scale;
  } else {
    uint32_t codes = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) codes |= uint32_t{EncodeE4m3Scaled(v[j], inv)} << (8 * j);
    *reinterpret_cast<uint32_t*>(e + first) = codes;
    if (first % fmt.group == 0) e[fmt.CodeBytes() + first / fmt.group] = scale;
  }
}

__global__ void DequantizeQuadKernel(BlockFormat fmt, const uint8_t* in, uint32_t quads, float* x) {
  const uint32_t q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= quads) return;
  const uint32_t quads_per_row = fmt.values / 4;
  const uint32_t row = q / quads_per_row, first = (q % quads_per_row) * 4;
  const uint8_t* e = in + size_t{row} * fmt.Bytes();
  const float s = DecodeE8m0(e[fmt.CodeBytes() + first / fmt.group]);
  float r[4];
  if (fmt.element == Element::kE2m1) {
    const uint32_t codes = *reinterpret_cast<const uint16_t*>(e + first / 2);
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = DecodeE2m1((codes >> (4 * j)) & 15) * s;
  } else {
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(e + first);
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = DecodeE4m3((codes >> (8 * j)) & 255) * s;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = IsNan(r[j]) ? BitsToFloat(kCanonicalNanBits) : r[j];
  reinterpret_cast<float4*>(x)[q] = make_float4(r[0], r[1], r[2], r[3]);
}

// Generic path: one thread per group.
__global__ void QuantizeKernel(BlockFormat fmt, const float* x, size_t total_groups, uint8_t* out) {
  const size_t gi = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (gi >= total_groups) return;
  const uint32_t per_row = fmt.values / fmt.group;
  const size_t row = gi / per_row;
  const uint32_t g = static_cast<uint32_t>(gi % per_row);
  const float* xg = x + row * fmt.values + size_t{g} * fmt.group;
  uint8_t* e = out + row * fmt.Bytes();
  const bool fp4 = fmt.element == Element::kE2m1;
  float amax = 0.0f;
  bool has_nan = false;
  for (uint32_t i = 0; i < fmt.group; ++i) {
    const float a = fabsf(xg[i]);
    if (a != a)
      has_nan = true;
    else if (a <= 3.402823466e38f && a > amax)
      amax = a;
  }
  const uint8_t scale = ScaleForAmax(amax, fp4 ? kE2m1Max : kE4m3Max);
  e[fmt.CodeBytes() + g] = (fp4 && has_nan) ? kE8m0Nan : scale;
  const float inv = DecodeE8m0(static_cast<uint8_t>(254 - scale));
  for (uint32_t i = 0; i < fmt.group; ++i) {
    const uint32_t v = g * fmt.group + i;
    if (fp4) {
      if (i % 2) continue;
      const uint8_t lo = EncodeE2m1Scaled(xg[i], inv);
      const uint8_t hi = EncodeE2m1Scaled(xg[i + 1], inv);
      e[v / 2] = static_cast<uint8_t>(lo | (hi << 4));
    } else {
      e[v] = EncodeE4m3Scaled(xg[i], inv);
    }
  }
}

__global__ void DequantizeKernel(BlockFormat fmt, const uint8_t* in, size_t total, float* x) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const size_t row = i / fmt.values;
  const float v = EntryValue(fmt.element, fmt.values, fmt.group, in + row * fmt.Bytes(),
                             static_cast<uint32_t>(i % fmt.values));
  x[i] = IsNan(v) ? BitsToFloat(kCanonicalNanBits) : v;  // CUDA's own NaN is 0x7fffffff
}

}  // namespace

// ---- Host API ----------------------------------------------------------------

void Quantize(const BlockFormat& fmt, const float* x, size_t rows, uint8_t* out, Stream s) {
  if (rows == 0) return;
  if (QuadPathFits(fmt, x, out)) {
    for (size_t r = 0; r < rows; r += QuadRowsPerLaunch(fmt)) {
      const auto quads =
          static_cast<uint32_t>(std::min(rows - r, QuadRowsPerLaunch(fmt)) * (fmt.values / 4));
      QuantizeQuadKernel<<<Blocks(quads, 256), 256, 0, s>>>(fmt, x + r * fmt.values, quads,
                                                            out + r * fmt.Bytes());
      CheckLaunch("QuantizeQuadKernel");
    }
    return;
  }
  const size_t groups = rows * (fmt.values / fmt.group);
  QuantizeKernel<<<Blocks(groups, 128), 128, 0, s>>>(fmt, x, groups, out);
  CheckLaunch("QuantizeKernel");
}

void Dequantize(const BlockFormat& fmt, const uint8_t* in, size_t rows, float* x, Stream s) {
  if (rows == 0) return;
  if (QuadPathFits(fmt, x, in)) {
    for (size_t r = 0; r < rows; r += QuadRowsPerLaunch(fmt)) {
      const auto quads =
          static_cast<uint32_t>(std::min(rows - r, QuadRowsPerLaunch(fmt)) * (fmt.values / 4));
      DequantizeQuadKernel<<<Blocks(quads, 256), 256, 0, s>>>(fmt, in + r * fmt.Bytes(), quads,
                                                              x + r * fmt.values);
      CheckLaunch("DequantizeQuadKernel");
    }
    return;
  }
  const size_t n = rows * fmt.values;
  DequantizeKernel<<<Blocks(n, 256), 256, 0, s>>>(fmt, in, n, x);
  CheckLaunch("DequantizeKernel");
}

}  // namespace strata::kernels::cuda

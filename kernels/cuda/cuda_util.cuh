// Internal to the CUDA kernels (kernels/cuda/*.cu, one file per op, as the
// CPU side in kernels/src/): error checking, launch sizing and the device
// helpers several ops share.
//
// CUDA kernels: one thread block per output row, fixed reduction orders, no
// atomics, so every result is deterministic and independent of the batch.
// Shapes are small (the mini V4.1 model), so the kernels favour being easy
// to check against the CPU reference over peak throughput.
//
// Everything here has internal linkage and is inline (the device helpers
// __forceinline__), so each .cu gets its own copy and the library needs no
// relocatable device code (-rdc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "strata/kernels/formats.h"
#include "strata/kernels/scalar_codec.h"

namespace strata::kernels::cuda {

static inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "strata kernels (CUDA): %s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
#define STRATA_CUDA(call) Check((call), #call)
static inline void CheckLaunch(const char* kernel) { Check(cudaGetLastError(), kernel); }

static __device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }

static inline uint32_t Blocks(size_t n, uint32_t threads) {
  return static_cast<uint32_t>((n + threads - 1) / threads);
}

// Butterfly sum across a warp: the same tree for every warp and launch.
static __device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Value v of a block-scaled entry.
static __device__ __forceinline__ float EntryValue(Element el, uint32_t values, uint32_t group,
                                                   const uint8_t* e, uint32_t v) {
  if (el == Element::kE2m1) {
    const float s = codec::DecodeE8m0(e[values / 2 + v / group]);
    return codec::DecodeE2m1((e[v / 2] >> ((v & 1) * 4)) & 15) * s;
  }
  return codec::DecodeE4m3(e[v]) * codec::DecodeE8m0(e[values + v / group]);
}

}  // namespace strata::kernels::cuda

// CUDA attention: SparseSwaAttention, the compact form of top-k global
// entries + sliding window in one softmax (attention.h; the CPU reference
// is kernels/src/attention.cc).

#include <cstdint>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"

namespace strata::kernels::cuda {
namespace {

constexpr uint32_t kAttnThreads = 128;  // 4 warps; thread d owns dims 4d .. 4d+3
static_assert(kAttnThreads * 4 == kHeadDim);

// One block per (token, head). Shared memory: q, the key pointers, scores.
__global__ void AttentionKernel(AttentionArgs a) {
  extern __shared__ unsigned char smem[];
  float* q = reinterpret_cast<float*>(smem);
  const uint8_t** keys = reinterpret_cast<const uint8_t**>(q + kHeadDim);
  float* scores = reinterpret_cast<float*>(keys + a.topk + a.window);
  __shared__ uint32_t n_global_shared;

  const uint32_t t = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const SequenceKv kv = a.seqs.data()[a.seq ? a.seq[t] : 0];
  const int64_t i = a.positions[t];
  const int64_t window_lo = i - a.window + 1 > 0 ? i - a.window + 1 : 0;
  const int64_t lo = kv.replay_start > window_lo ? kv.replay_start : window_lo;
  // A position before the replay start sees no local key (the CPU asserts
  // this away; here it must not wrap into a huge count).
  const uint32_t n_local = i >= lo ? static_cast<uint32_t>(i - lo + 1) : 0;

  const float* qg = a.q + (size_t{t} * a.heads + h) * kHeadDim;
  for (uint32_t d = tid; d < kHeadDim; d += kAttnThreads) q[d] = qg[d];
  if (tid == 0) {  // the valid global indices, in order
    uint32_t n = 0;
    const int32_t* idx = a.topk_idx + size_t{t} * a.topk;
    for (uint32_t j = 0; j < a.topk; ++j) {
      if (idx[j] >= 0) keys[n++] = kv.global + size_t(idx[j]) * kMainKv.Bytes();
    }
    n_global_shared = n;
  }
  __syncthreads();
  const uint32_t n_global = n_global_shared, n = n_global + n_local;
  for (uint32_t j = tid; j < n_local; j += kAttnThreads) {
    keys[n_global + j] = kv.ring + ((lo + j) % kv.ring_slots) * kSwaFp8.Bytes();
  }
  __syncthreads();

  // Scores: a warp per key; lane l covers dims 16l .. 16l+15.
  for (uint32_t j = warp; j < n; j += kAttnThreads / 32) {
    const bool fp4 = j < n_global;
    float s = 0;
#pragma unroll 4
    for (uint32_t d = lane * 16; d < lane * 16 + 16; ++d) {
      s += q[d] * (fp4 ? EntryValue(Element::kE2m1, 512, 16, keys[j], d)
                       : EntryValue(Element::kE4m3, 512, 32, keys[j], d));
    }
    s = WarpSum(s);
    if (lane == 0) scores[j] = s * a.softmax_scale;
  }
  __syncthreads();

  // Two-pass softmax per part; every thread recomputes max and sum (cheap,
  // and identical in every thread), and accumulates its own 4 dims.
  float mg = NegInf(), ml = NegInf(), lg = 0, ll = 0;
  for (uint32_t j = 0; j < n_global; ++j) mg = fmaxf(mg, scores[j]);
  for (uint32_t j = n_global; j < n; ++j) ml = fmaxf(ml, scores[j]);
  float og[4] = {0, 0, 0, 0}, ol[4] = {0, 0, 0, 0};
  const uint32_t d0 = tid * 4;
  for (uint32_t j = 0; j < n; ++j) {
    const bool fp4 = j < n_global;
    const float w = expf(scores[j] - (fp4 ? mg : ml));
    float* o = fp4 ? og : ol;
    if (fp4)
      lg += w;
    else
      ll += w;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k] += w * (fp4 ? EntryValue(Element::kE2m1, 512, 16, keys[j], d0 + k)
                       : EntryValue(Element::kE4m3, 512, 32, keys[j], d0 + k));
    }
  }
  const float m = fmaxf(mg, ml);
  const float ag = n_global == 0 ? 0.0f : expf(mg - m);
  const float al = expf(ml - m);
  const float denom = ag * lg + al * ll;
  float* out = a.out + (size_t{t} * a.heads + h) * kHeadDim;
#pragma unroll
  for (int k = 0; k < 4; ++k) out[d0 + k] = (ag * og[k] + al * ol[k]) / denom;
  if (a.lse && tid == 0) a.lse[size_t{t} * a.heads + h] = m + logf(denom);
}

}  // namespace

// ---- Host API ----------------------------------------------------------------

void SparseSwaAttention(const AttentionArgs& args, Stream s) {
  if (args.tokens == 0 || args.heads == 0) return;
  const size_t smem =
      kHeadDim * sizeof(float) + (args.topk + args.window) * (sizeof(void*) + sizeof(float));
  if (smem > 48 * 1024) {
    STRATA_CUDA(cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  }
  AttentionKernel<<<args.tokens * args.heads, kAttnThreads, smem, s>>>(args);
  CheckLaunch("AttentionKernel");
}

}  // namespace strata::kernels::cuda

// CUDA kernels: one thread block per output row, fixed reduction orders, no
// atomics, so every result is deterministic and independent of the batch.
// Shapes are small (the mini V4.1 model), so the kernels favour being easy
// to check against the CPU reference over peak throughput.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "strata/kernels/cuda.h"
#include "strata/kernels/scalar_codec.h"

namespace strata::kernels::cuda {
namespace {

using namespace codec;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "strata kernels (CUDA): %s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
#define STRATA_CUDA(call) Check((call), #call)
void CheckLaunch(const char* kernel) { Check(cudaGetLastError(), kernel); }

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }

uint32_t Blocks(size_t n, uint32_t threads) {
  return static_cast<uint32_t>((n + threads - 1) / threads);
}

// The CPU's Dot, in the same order (8 interleaved sums, fixed tree).
__device__ float SerialDot(const float* a, const float* b, uint32_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint32_t body = n - n % 8;
  for (uint32_t i = 0; i < body; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (uint32_t j = 0; j < n % 8; ++j) acc[j] += a[body + j] * b[body + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Butterfly sum across a warp: the same tree for every warp and launch.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Value v of a block-scaled entry.
__device__ __forceinline__ float EntryValue(Element el, uint32_t values, uint32_t group,
                                            const uint8_t* e, uint32_t v) {
  if (el == Element::kE2m1) {
    const float s = DecodeE8m0(e[values / 2 + v / group]);
    return DecodeE2m1((e[v / 2] >> ((v & 1) * 4)) & 15) * s;
  }
  return DecodeE4m3(e[v]) * DecodeE8m0(e[values + v / group]);
}

// ---- Formats ---------------------------------------------------------------
//
// Fast path: four consecutive values per thread, group/4 neighbouring lanes
// per group (a power of two <= 32, so a group never straddles a warp). Loads
// and stores are vectorized and coalesced, and a group's amax and NaN flag
// are reduced by shuffles. All three formats take it (QuadPathFits); any
// other shape takes the one-thread-per-group / per-value kernels below it.

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

// ---- Attention -------------------------------------------------------------

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

// ---- Indexer ---------------------------------------------------------------

constexpr uint32_t kIdxThreads = 256;  // 8 warps
constexpr uint32_t kIdxKeysPerBlock = 64;

// Where slot j of a token's score row points. Plain mode: key j. Pool mode
// (candidates != null): slot j is key cand[j / block] * block + j % block of
// the token's candidate blocks; -1 when that block is absent.
struct ScoreSlots {
  const int32_t* candidates = nullptr;  // tokens x n_candidates, ascending, -1 padded
  uint32_t n_candidates = 0;
  uint32_t block = 0;
};

// grid (tokens, slot tiles). A warp per slot; lane l covers dims 4l .. 4l+3.
// Slots past the visible keys score -inf.
__global__ void IndexerScoresKernel(IndexerArgs a, ScoreSlots slots, float* scores,
                                    uint64_t row_stride) {
  extern __shared__ float qs[];  // heads x kIndexerDim, then heads weights
  const uint32_t t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (uint32_t v = tid; v < a.heads * kIndexerDim; v += kIdxThreads)
    qs[v] = a.q[size_t{t} * a.heads * kIndexerDim + v];
  for (uint32_t v = tid; v < a.heads; v += kIdxThreads)
    qs[a.heads * kIndexerDim + v] = a.weights[size_t{t} * a.heads + v];
  __syncthreads();
  const IndexerKeys keys = a.seqs.data()[a.seq ? a.seq[t] : 0];
  const uint64_t vis = a.visible[t];
  const uint64_t first = uint64_t{blockIdx.y} * kIdxKeysPerBlock;
  for (uint64_t j = first + warp; j < first + kIdxKeysPerBlock && j < row_stride;
       j += kIdxThreads / 32) {
    int64_t key = static_cast<int64_t>(j);
    if (slots.candidates) {
      const int32_t b = slots.candidates[size_t{t} * slots.n_candidates + j / slots.block];
      key = b < 0 ? -1 : int64_t{b} * slots.block + static_cast<int64_t>(j % slots.block);
    }
    float s = NegInf();
    if (key >= 0 && static_cast<uint64_t>(key) < vis) {
      const uint8_t* e = keys.keys + key * kIndexerKey.Bytes();
      float k[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) k[c] = EntryValue(Element::kE2m1, 128, 32, e, lane * 4 + c);
      s = 0;
      for (uint32_t h = 0; h < a.heads; ++h) {
        const float* qh = qs + h * kIndexerDim + lane * 4;
        const float dot = WarpSum(((qh[0] * k[0] + qh[1] * k[1]) + (qh[2] * k[2] + qh[3] * k[3])));
        s += qs[a.heads * kIndexerDim + h] * fmaxf(0.0f, dot);
      }
    }
    if (lane == 0) scores[t * row_stride + j] = s;
  }
}

// Per token: how many pooled blocks exist (ceil(visible / block)), and how
// many pool slots are real: candidate blocks are ascending and -1 padded,
// and only the block holding key visible-1 can be partial, so the real slots
// are a prefix of the row.
__global__ void IndexerCountsKernel(const uint64_t* visible, uint32_t tokens, uint32_t block,
                                    const int32_t* candidates, uint32_t n_candidates,
                                    uint64_t* block_counts, uint64_t* pool_counts) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const uint64_t vis = visible[t];
  if (block_counts) block_counts[t] = (vis + block - 1) / block;
  if (!pool_counts) return;
  uint64_t n = 0;
  for (uint32_t c = 0; c < n_candidates; ++c) {
    const int32_t b = candidates[size_t{t} * n_candidates + c];
    if (b < 0) break;
    const uint64_t end = (uint64_t(b) + 1) * block;
    // A candidate starting at or past `vis` holds no visible key (and must
    // not wrap the subtraction): the CPU drops such keys too.
    const uint64_t start = uint64_t(b) * block;
    n = uint64_t{c} * block + (end <= vis ? block : (vis > start ? vis - start : 0));
  }
  pool_counts[t] = n;
}

// Pool slot -> key index.
__global__ void MapPoolSlotsKernel(uint32_t tokens, uint32_t k, const int32_t* candidates,
                                   uint32_t n_candidates, uint32_t block, int32_t* topk) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= size_t{tokens} * k) return;
  const int32_t slot = topk[i];
  if (slot < 0) return;
  const int32_t b = candidates[(i / k) * n_candidates + static_cast<uint32_t>(slot) / block];
  topk[i] =
      b * static_cast<int32_t>(block) + static_cast<int32_t>(static_cast<uint32_t>(slot) % block);
}

__global__ void BlockMaxPoolKernel(const float* scores, uint32_t rows, uint64_t n,
                                   uint64_t row_stride, uint32_t block, float* pooled,
                                   uint64_t pooled_stride) {
  const uint64_t nb = (n + block - 1) / block;
  const uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= nb * rows) return;
  const uint64_t r = i / nb, b = i % nb;
  float m = NegInf();
  for (uint64_t j = b * block; j < n && j < (b + 1) * block; ++j) {
    const float v = scores[r * row_stride + j];
    if (m < v) m = v;  // exactly std::max's choice, -0 vs +0 included (fmaxf differs)
  }
  pooled[r * pooled_stride + b] = m;
}

// Scores as unsigned keys in the selection order: larger key ranks first;
// NaN gets 0, below -inf; -0 and +0 share a key (the CPU sees them equal).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  if (f != f) return 0;
  const uint32_t b = f == 0.0f ? 0u : __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

constexpr uint32_t kTopKThreads = 256;

// One block per row. Finds the k-th largest key T bit by bit (32 counting
// passes), then walks the row in index order: keys above T are taken, and
// keys equal to T are taken lowest index first until k are chosen. The walk
// writes in index order, so the output is ascending with no sort.
__global__ void TopKRowsKernel(const float* scores, uint64_t n_all, const uint64_t* counts,
                               uint64_t row_stride, uint32_t k, int32_t* out) {
  using Reduce = cub::BlockReduce<uint32_t, kTopKThreads>;
  using Scan = cub::BlockScan<uint32_t, kTopKThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ uint32_t broadcast;
  const uint32_t r = blockIdx.x, tid = threadIdx.x;
  const float* row = scores + r * row_stride;
  int32_t* o = out + size_t{r} * k;
  const uint64_t n = counts ? (counts[r] < n_all ? counts[r] : n_all) : n_all;
  if (n <= k) {
    for (uint64_t j = tid; j < k; j += kTopKThreads) o[j] = j < n ? static_cast<int32_t>(j) : -1;
    return;
  }
  auto count_at_least = [&](uint32_t threshold) {
    uint32_t c = 0;
    for (uint64_t j = tid; j < n; j += kTopKThreads) c += OrderKey(row[j]) >= threshold;
    const uint32_t total = Reduce(tmp.reduce).Sum(c);
    if (tid == 0) broadcast = total;
    __syncthreads();
    const uint32_t result = broadcast;
    __syncthreads();
    return result;
  };
  uint32_t kth = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = kth | (1u << bit);
    if (count_at_least(cand) >= k) kth = cand;
  }
  const uint32_t above = kth == 0xffffffffu ? 0 : count_at_least(kth + 1);
  const uint32_t ties_needed = k - above;
  uint32_t taken = 0, ties_seen = 0;
  for (uint64_t base = 0; base < n; base += kTopKThreads) {
    const uint64_t j = base + tid;
    const uint32_t key = j < n ? OrderKey(row[j]) : 0;
    const uint32_t tie = j < n && key == kth;
    uint32_t tie_rank, tie_total;
    Scan(tmp.scan).ExclusiveSum(tie, tie_rank, tie_total);
    __syncthreads();
    const uint32_t take = j < n && (key > kth || (tie && ties_seen + tie_rank < ties_needed));
    uint32_t slot, take_total;
    Scan(tmp.scan).ExclusiveSum(take, slot, take_total);
    __syncthreads();
    if (take) o[taken + slot] = static_cast<int32_t>(j);
    taken += take_total;
    ties_seen += tie_total;
  }
}

// ---- MoE -------------------------------------------------------------------

constexpr uint32_t kMaxExperts = 256;

// One thread per token: scores, then top-k by repeated argmax (ties to the
// lower id), then ascending ids, then gates.
__global__ void RouteKernel(RouterConfig cfg, const float* x, uint32_t tokens, uint32_t d_model,
                            const float* w_router, const float* bias, int32_t* ids, float* gates) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float score[kMaxExperts];
  bool taken[kMaxExperts];
  const float* xt = x + size_t{t} * d_model;
  for (uint32_t e = 0; e < cfg.experts; ++e) {
    score[e] = SerialDot(xt, w_router + size_t{e} * d_model, d_model);
    taken[e] = false;
  }
  if (cfg.score == RouterScore::kSoftmax) {
    float m = score[0];
    for (uint32_t e = 1; e < cfg.experts; ++e) m = fmaxf(m, score[e]);
    float sum = 0;
    for (uint32_t e = 0; e < cfg.experts; ++e) sum += (score[e] = expf(score[e] - m));
    for (uint32_t e = 0; e < cfg.experts; ++e) score[e] /= sum;
  } else {
    for (uint32_t e = 0; e < cfg.experts; ++e) score[e] = 1.0f / (1.0f + expf(-score[e]));
  }
  int32_t* id = ids + size_t{t} * cfg.topk;
  for (uint32_t j = 0; j < cfg.topk; ++j) {
    int32_t best = -1;
    float best_rank = 0;
    for (uint32_t e = 0; e < cfg.experts; ++e) {
      if (taken[e]) continue;
      float r = bias ? score[e] + bias[e] : score[e];
      if (r != r) r = NegInf();
      if (best < 0 || r > best_rank) best = static_cast<int32_t>(e), best_rank = r;
    }
    taken[best] = true;
  }
  uint32_t j = 0;
  for (uint32_t e = 0; e < cfg.experts; ++e) {
    if (taken[e]) id[j++] = static_cast<int32_t>(e);
  }
  float* g = gates + size_t{t} * cfg.topk;
  float total = 0;
  for (j = 0; j < cfg.topk; ++j) total += (g[j] = score[id[j]]);
  for (j = 0; j < cfg.topk; ++j) {
    if (cfg.renormalize && total > 0) g[j] /= total;
    g[j] *= cfg.scaling;
  }
}

// A single thread: counting sort of (token, slot) by expert, stable. The
// slot count is small (tokens x top-k), and one thread keeps it trivially
// deterministic.
__global__ void GroupByExpertKernel(const int32_t* ids, uint32_t slots, uint32_t experts,
                                    int32_t* begin, int32_t* group) {
  for (uint32_t e = 0; e <= experts; ++e) begin[e] = 0;
  for (uint32_t s = 0; s < slots; ++s) ++begin[ids[s] + 1];
  for (uint32_t e = 0; e < experts; ++e) begin[e + 1] += begin[e];
  for (uint32_t s = 0; s < slots; ++s) group[begin[ids[s]]++] = static_cast<int32_t>(s);
}

constexpr uint32_t kFfnThreads = 256;

// One block per row. rows_in_order[i] names the row (a (token, slot) pair
// for routed experts, a token for the shared expert); consecutive blocks run
// the same expert, so its weights stay in L2.
__global__ void SwigluKernel(const ExpertWeights* experts, const int32_t* expert_ids,
                             const int32_t* rows_in_order, uint32_t topk, const float* x,
                             uint32_t d_model, float* y) {
  extern __shared__ float buf[];  // x row, then hidden activations
  const uint32_t tid = threadIdx.x;
  const uint32_t row =
      rows_in_order ? static_cast<uint32_t>(rows_in_order[blockIdx.x]) : blockIdx.x;
  const ExpertWeights w = experts[expert_ids ? expert_ids[row] : 0];
  const uint32_t token = expert_ids ? row / topk : row;
  float* xs = buf;
  float* hs = buf + d_model;
  for (uint32_t d = tid; d < d_model; d += kFfnThreads) xs[d] = x[size_t{token} * d_model + d];
  __syncthreads();
  for (uint32_t f = tid; f < w.hidden; f += kFfnThreads) {
    const float g = SerialDot(xs, w.w_gate + size_t{f} * d_model, d_model);
    const float u = SerialDot(xs, w.w_up + size_t{f} * d_model, d_model);
    hs[f] = g / (1.0f + expf(-g)) * u;
  }
  __syncthreads();
  for (uint32_t d = tid; d < d_model; d += kFfnThreads) {
    y[size_t{row} * d_model + d] = SerialDot(hs, w.w_down + size_t{d} * w.hidden, w.hidden);
  }
}

// out[t, d] (holding the shared expert's output, or 0) += gate * y, slots
// in order: the CPU's combine.
__global__ void CombineKernel(uint32_t tokens, uint32_t d_model, uint32_t topk, const float* gates,
                              const float* y, float* out) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= size_t{tokens} * d_model) return;
  const size_t t = i / d_model, d = i % d_model;
  float acc = out[i];
  for (uint32_t j = 0; j < topk; ++j) acc += gates[t * topk + j] * y[(t * topk + j) * d_model + d];
  out[i] = acc;
}

// ---- Block copy ------------------------------------------------------------

// grid (blocks, tiles): copies one group of one block between a page and a
// payload. Vec: 16-byte words when everything is 16-byte aligned.
template <typename Word>
__global__ void CopyGroupKernel(uint8_t* pool_base, uint64_t page_bytes, const uint32_t* pages,
                                uint8_t* payloads, uint64_t stride, uint64_t offset,
                                bool to_payload) {
  const uint64_t b = blockIdx.x;
  uint8_t* page = pool_base + pages[b] * page_bytes;
  uint8_t* pay = payloads + b * stride + offset;
  const Word* src = reinterpret_cast<const Word*>(to_payload ? page : pay);
  Word* dst = reinterpret_cast<Word*>(to_payload ? pay : page);
  const uint64_t words = page_bytes / sizeof(Word);
  for (uint64_t w = uint64_t{blockIdx.y} * blockDim.x + threadIdx.x; w < words;
       w += uint64_t{gridDim.y} * blockDim.x) {
    dst[w] = src[w];
  }
}

void CopyGroups(const PagedPool& pool, const uint32_t* pages, uint32_t blocks, uint8_t* payloads,
                uint64_t stride, uint64_t body_offset, bool to_payload, Stream s) {
  if (blocks == 0) return;
  uint64_t off = body_offset;
  for (size_t g = 0; g < pool.group_base.size(); ++g) {
    const uint64_t pb = pool.group_page_bytes[g];
    const bool vec = (reinterpret_cast<uintptr_t>(pool.group_base[g]) |
                      reinterpret_cast<uintptr_t>(payloads) | pb | stride | off) %
                         16 ==
                     0;
    const dim3 grid(blocks, 8);
    if (vec) {
      CopyGroupKernel<uint4>
          <<<grid, 256, 0, s>>>(pool.group_base[g], pb, pages, payloads, stride, off, to_payload);
    } else {
      CopyGroupKernel<uint8_t>
          <<<grid, 256, 0, s>>>(pool.group_base[g], pb, pages, payloads, stride, off, to_payload);
    }
    CheckLaunch("CopyGroupKernel");
    off += pb;
  }
}

}  // namespace

// ---- Host API ----------------------------------------------------------------

bool DeviceAvailable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device present";
    return false;
  }
  return true;
}

std::string DeviceName() {
  cudaDeviceProp p{};
  STRATA_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

double PeakFp32Gflops() {
  int sms = 0, khz = 0, major = 0, minor = 0;
  STRATA_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  // FP32 lanes per multiprocessor: 64 on sm_60/70/80, 128 on sm_86 and later.
  const int lanes = (major > 8 || (major == 8 && minor > 0)) ? 128 : 64;
  return 2.0 * sms * lanes * (khz * 1e3) / 1e9;  // one FMA = 2 FLOPs per lane per clock
}

void* Malloc(size_t bytes) {
  void* p = nullptr;
  STRATA_CUDA(cudaMalloc(&p, bytes));
  return p;
}
void Free(void* p) { STRATA_CUDA(cudaFree(p)); }
void CopyToDevice(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void CopyToHost(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void CopyOnDevice(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void Synchronize() { STRATA_CUDA(cudaDeviceSynchronize()); }

double TimeLaunchesMs(void (*launch)(void*), void* ctx, int iters) {
  cudaEvent_t start, stop;
  STRATA_CUDA(cudaEventCreate(&start));
  STRATA_CUDA(cudaEventCreate(&stop));
  launch(ctx);  // warm-up
  STRATA_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) launch(ctx);
  STRATA_CUDA(cudaEventRecord(stop));
  STRATA_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  STRATA_CUDA(cudaEventElapsedTime(&ms, start, stop));
  STRATA_CUDA(cudaEventDestroy(start));
  STRATA_CUDA(cudaEventDestroy(stop));
  return ms / iters;
}

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

namespace {
void LaunchScores(const IndexerArgs& args, ScoreSlots slots, float* scores, uint64_t row_stride,
                  Stream s) {
  if (args.tokens == 0 || row_stride == 0) return;
  const dim3 grid(args.tokens, Blocks(row_stride, kIdxKeysPerBlock));
  const size_t smem = (args.heads * kIndexerDim + args.heads) * sizeof(float);
  IndexerScoresKernel<<<grid, kIdxThreads, smem, s>>>(args, slots, scores, row_stride);
  CheckLaunch("IndexerScoresKernel");
}

// Scores the candidate pool with args' query and selects top-k keys; the
// shared tail of Full and Reindex. Scratch: pool scores, pool counts.
void SelectFromPool(const IndexerArgs& args, const IndexerConfig& cfg, const int32_t* candidates,
                    int32_t* topk, float* pool_scores, uint64_t* pool_counts, Stream s) {
  const uint64_t slots = uint64_t{cfg.candidate_blocks} * cfg.block;
  LaunchScores(args, {candidates, cfg.candidate_blocks, cfg.block}, pool_scores, slots, s);
  IndexerCountsKernel<<<Blocks(args.tokens, 64), 64, 0, s>>>(
      args.visible, args.tokens, cfg.block, candidates, cfg.candidate_blocks, nullptr, pool_counts);
  CheckLaunch("IndexerCountsKernel");
  TopKRows(pool_scores, args.tokens, slots, pool_counts, slots, cfg.topk, topk, s);
  MapPoolSlotsKernel<<<Blocks(size_t{args.tokens} * cfg.topk, 256), 256, 0, s>>>(
      args.tokens, cfg.topk, candidates, cfg.candidate_blocks, cfg.block, topk);
  CheckLaunch("MapPoolSlotsKernel");
}

// Carves the scratch buffer into 256-byte aligned pieces.
struct Carver {
  uint8_t* p;
  template <typename T>
  T* Take(size_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += (n * sizeof(T) + 255) / 256 * 256;
    return r;
  }
};
}  // namespace

void IndexerScores(const IndexerArgs& args, float* scores, uint64_t row_stride, Stream s) {
  LaunchScores(args, {}, scores, row_stride, s);
}

size_t IndexerScratchBytes(uint32_t tokens, uint64_t max_visible, const IndexerConfig& cfg) {
  const uint64_t nb = (max_visible + cfg.block - 1) / cfg.block;
  const uint64_t slots = uint64_t{cfg.candidate_blocks} * cfg.block;
  auto r = [](size_t b) { return (b + 255) / 256 * 256; };
  return r(tokens * max_visible * 4) + r(tokens * nb * 4) + r(tokens * 8) + r(tokens * slots * 4) +
         r(tokens * 8);
}

void IndexerSelectFull(const IndexerArgs& args, const IndexerConfig& cfg, uint64_t max_visible,
                       int32_t* candidates, int32_t* topk, void* scratch, Stream s) {
  if (args.tokens == 0) return;
  const uint64_t nb = (max_visible + cfg.block - 1) / cfg.block;
  const uint64_t slots = uint64_t{cfg.candidate_blocks} * cfg.block;
  Carver c{static_cast<uint8_t*>(scratch)};
  float* scores = c.Take<float>(size_t{args.tokens} * max_visible);
  float* pooled = c.Take<float>(size_t{args.tokens} * nb);
  uint64_t* block_counts = c.Take<uint64_t>(args.tokens);
  float* pool_scores = c.Take<float>(size_t{args.tokens} * slots);
  uint64_t* pool_counts = c.Take<uint64_t>(args.tokens);
  LaunchScores(args, {}, scores, max_visible, s);
  BlockMaxPool(scores, args.tokens, max_visible, max_visible, cfg.block, pooled, nb, s);
  IndexerCountsKernel<<<Blocks(args.tokens, 64), 64, 0, s>>>(args.visible, args.tokens, cfg.block,
                                                             nullptr, 0, block_counts, nullptr);
  CheckLaunch("IndexerCountsKernel");
  TopKRows(pooled, args.tokens, nb, block_counts, nb, cfg.candidate_blocks, candidates, s);
  // The pool is rescored by the same kernel code: the same bits as above.
  SelectFromPool(args, cfg, candidates, topk, pool_scores, pool_counts, s);
}

void IndexerReindex(const IndexerArgs& args, const IndexerConfig& cfg, const int32_t* candidates,
                    int32_t* topk, void* scratch, Stream s) {
  if (args.tokens == 0) return;
  const uint64_t slots = uint64_t{cfg.candidate_blocks} * cfg.block;
  Carver c{static_cast<uint8_t*>(scratch)};
  float* pool_scores = c.Take<float>(size_t{args.tokens} * slots);
  uint64_t* pool_counts = c.Take<uint64_t>(args.tokens);
  SelectFromPool(args, cfg, candidates, topk, pool_scores, pool_counts, s);
}

void IndexerReuse(const int32_t* source_topk, size_t tokens, uint32_t k, int32_t* topk, Stream s) {
  STRATA_CUDA(cudaMemcpyAsync(topk, source_topk, tokens * k * sizeof(int32_t),
                              cudaMemcpyDeviceToDevice, s));
}

void BlockMaxPool(const float* scores, uint32_t rows, uint64_t n, uint64_t row_stride,
                  uint32_t block, float* pooled, uint64_t pooled_stride, Stream s) {
  const uint64_t total = (n + block - 1) / block * rows;
  if (total == 0) return;
  BlockMaxPoolKernel<<<Blocks(total, 256), 256, 0, s>>>(scores, rows, n, row_stride, block, pooled,
                                                        pooled_stride);
  CheckLaunch("BlockMaxPoolKernel");
}

void TopKRows(const float* scores, uint32_t rows, uint64_t n, const uint64_t* counts,
              uint64_t row_stride, uint32_t k, int32_t* out, Stream s) {
  if (rows == 0 || k == 0) return;
  TopKRowsKernel<<<rows, kTopKThreads, 0, s>>>(scores, n, counts, row_stride, k, out);
  CheckLaunch("TopKRowsKernel");
}

void Route(const RouterConfig& cfg, const float* x, uint32_t tokens, uint32_t d_model,
           const float* w_router, const float* bias, int32_t* expert_ids, float* gates, Stream s) {
  if (cfg.experts > kMaxExperts || cfg.topk == 0 || cfg.topk > cfg.experts) {
    std::fprintf(stderr, "strata kernels (CUDA): Route supports 1 <= topk <= experts <= %u\n",
                 kMaxExperts);
    std::abort();
  }
  if (tokens == 0) return;
  RouteKernel<<<Blocks(tokens, 64), 64, 0, s>>>(cfg, x, tokens, d_model, w_router, bias, expert_ids,
                                                gates);
  CheckLaunch("RouteKernel");
}

size_t MoeScratchBytes(const MoeArgs& a) {
  const size_t slots = size_t{a.tokens} * a.topk;
  return slots * a.d_model * sizeof(float) + (slots + a.experts.size() + 1) * sizeof(int32_t);
}

void MoeForward(const MoeArgs& a, uint32_t max_hidden, void* scratch, Stream s) {
  if (a.tokens == 0) return;
  const uint32_t slots = a.tokens * a.topk;
  float* y = static_cast<float*>(scratch);
  int32_t* group = reinterpret_cast<int32_t*>(y + size_t{slots} * a.d_model);
  int32_t* begin = group + slots;
  const size_t smem = (a.d_model + max_hidden) * sizeof(float);
  if (smem > 48 * 1024) {
    STRATA_CUDA(cudaFuncSetAttribute(SwigluKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  }
  GroupByExpertKernel<<<1, 1, 0, s>>>(a.expert_ids, slots, static_cast<uint32_t>(a.experts.size()),
                                      begin, group);
  CheckLaunch("GroupByExpertKernel");
  SwigluKernel<<<slots, kFfnThreads, smem, s>>>(a.experts.data(), a.expert_ids, group, a.topk, a.x,
                                                a.d_model, y);
  CheckLaunch("SwigluKernel");
  if (a.shared) {
    SwigluKernel<<<a.tokens, kFfnThreads, smem, s>>>(a.shared, nullptr, nullptr, 1, a.x, a.d_model,
                                                     a.out);
    CheckLaunch("SwigluKernel (shared)");
  } else {
    STRATA_CUDA(cudaMemsetAsync(a.out, 0, size_t{a.tokens} * a.d_model * sizeof(float), s));
  }
  CombineKernel<<<Blocks(size_t{a.tokens} * a.d_model, 256), 256, 0, s>>>(
      a.tokens, a.d_model, a.topk, a.gates, y, a.out);
  CheckLaunch("CombineKernel");
}

void GatherBlocks(const PagedPool& pool, const uint32_t* pages, uint32_t blocks,
                  const PayloadBuffers& payloads, Stream s) {
  CopyGroups(pool, pages, blocks, payloads.base, payloads.stride, payloads.body_offset, true, s);
}

void ScatterBlocks(const PayloadBuffers& payloads, const uint32_t* pages, uint32_t blocks,
                   const PagedPool& pool, Stream s) {
  CopyGroups(pool, pages, blocks, payloads.base, payloads.stride, payloads.body_offset, false, s);
}

}  // namespace strata::kernels::cuda

// CUDA MoE: the router and the SwiGLU experts grouped by expert, plus the
// shared expert (moe.h; the CPU reference is kernels/src/moe.cc).

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"

namespace strata::kernels::cuda {
namespace {

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

}  // namespace

// ---- Host API ----------------------------------------------------------------

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

}  // namespace strata::kernels::cuda

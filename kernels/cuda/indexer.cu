// CUDA indexer: scores, block-max pooling, per-row top-k and the Full /
// Reindex / Reuse layers (indexer.h; the CPU reference is
// kernels/src/indexer.cc).

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"

namespace strata::kernels::cuda {
namespace {

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

}  // namespace

// ---- Host API ----------------------------------------------------------------

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

}  // namespace strata::kernels::cuda

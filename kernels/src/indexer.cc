#include "strata/kernels/indexer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "reduce.h"
#include "strata/kernels/formats.h"

namespace strata::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float Score(const float* q, const float* w, uint32_t heads, const float* key) {
  float s = 0;
  for (uint32_t h = 0; h < heads; ++h) {
    s += w[h] * std::max(0.0f, detail::Dot(q + size_t{h} * kIndexerDim, key, kIndexerDim));
  }
  return s;
}

// The keys any token of the call can see, dequantized once per call
// (dequantization is exact, so this changes nothing in the results).
struct DequantizedKeys {
  std::vector<std::vector<float>> per_seq;
  explicit DequantizedKeys(const IndexerArgs& a) : per_seq(a.seqs.size()) {
    std::vector<uint64_t> used(a.seqs.size(), 0);
    for (uint32_t t = 0; t < a.tokens; ++t) {
      const uint32_t sq = a.seq ? a.seq[t] : 0;
      assert(a.visible[t] <= a.seqs[sq].count);
      used[sq] = std::max(used[sq], a.visible[t]);
    }
    for (size_t s = 0; s < a.seqs.size(); ++s) {
      per_seq[s].resize(used[s] * kIndexerDim);
      Dequantize(kIndexerKey, a.seqs[s].keys, used[s], per_seq[s].data());
    }
  }
};

// The strict total order of the selection: a ranks before b.
bool Before(const float* scores, int32_t a, int32_t b) {
  const float sa = std::isnan(scores[a]) ? kNegInf : scores[a];
  const float sb = std::isnan(scores[b]) ? kNegInf : scores[b];
  if (sa != sb) return sa > sb;
  if (std::isnan(scores[a]) != std::isnan(scores[b])) return std::isnan(scores[b]);  // -inf > NaN
  return a < b;
}

uint32_t TopKWithScratch(const float* scores, uint64_t n, uint32_t k, int32_t* out,
                         std::vector<int32_t>& idx) {
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), 0);
  const uint32_t kept = static_cast<uint32_t>(std::min<uint64_t>(n, k));
  auto before = [scores](int32_t a, int32_t b) { return Before(scores, a, b); };
  // A strict total order makes the selected set unique, whatever the algorithm.
  std::nth_element(idx.begin(), idx.begin() + kept, idx.end(), before);
  std::sort(idx.begin(), idx.begin() + kept);
  std::copy(idx.begin(), idx.begin() + kept, out);
  std::fill(out + kept, out + k, -1);
  return kept;
}

}  // namespace

void IndexerScores(const IndexerArgs& a, float* scores, uint64_t row_stride) {
  const DequantizedKeys keys(a);
  for (uint32_t t = 0; t < a.tokens; ++t) {
    const uint32_t sq = a.seq ? a.seq[t] : 0;
    const uint64_t vis = a.visible[t];
    assert(vis <= a.seqs[sq].count && vis <= row_stride);
    const float* q = a.q + size_t{t} * a.heads * kIndexerDim;
    const float* w = a.weights + size_t{t} * a.heads;
    float* row = scores + t * row_stride;
    for (uint64_t j = 0; j < vis; ++j)
      row[j] = Score(q, w, a.heads, &keys.per_seq[sq][j * kIndexerDim]);
    std::fill(row + vis, row + row_stride, kNegInf);
  }
}

void BlockMaxPool(const float* scores, uint64_t n, uint32_t block, float* pooled) {
  for (uint64_t b = 0; b * block < n; ++b) {
    float m = kNegInf;
    for (uint64_t j = b * block; j < std::min(n, (b + 1) * block); ++j) m = std::max(m, scores[j]);
    pooled[b] = m;
  }
}

uint32_t TopK(const float* scores, uint64_t n, uint32_t k, int32_t* out) {
  std::vector<int32_t> idx;
  return TopKWithScratch(scores, n, k, out, idx);
}

void IndexerSelectFull(const IndexerArgs& a, const IndexerConfig& cfg, int32_t* candidates,
                       int32_t* topk) {
  const DequantizedKeys keys(a);
  std::vector<float> scores, pooled, pool_scores;
  std::vector<int32_t> idx, blocks(cfg.candidate_blocks), pool;
  for (uint32_t t = 0; t < a.tokens; ++t) {
    const uint32_t sq = a.seq ? a.seq[t] : 0;
    const uint64_t vis = a.visible[t];
    assert(vis <= a.seqs[sq].count);
    const float* q = a.q + size_t{t} * a.heads * kIndexerDim;
    const float* w = a.weights + size_t{t} * a.heads;
    scores.resize(vis);
    for (uint64_t j = 0; j < vis; ++j)
      scores[j] = Score(q, w, a.heads, &keys.per_seq[sq][j * kIndexerDim]);
    pooled.resize((vis + cfg.block - 1) / cfg.block);
    BlockMaxPool(scores.data(), vis, cfg.block, pooled.data());
    int32_t* cand = candidates + size_t{t} * cfg.candidate_blocks;
    const uint32_t nb =
        TopKWithScratch(pooled.data(), pooled.size(), cfg.candidate_blocks, cand, idx);
    // The pool: the candidate blocks' visible keys, in ascending order.
    pool.clear();
    pool_scores.clear();
    for (uint32_t c = 0; c < nb; ++c) {
      const uint64_t b = static_cast<uint64_t>(cand[c]);
      for (uint64_t j = b * cfg.block; j < std::min(vis, (b + 1) * cfg.block); ++j) {
        pool.push_back(static_cast<int32_t>(j));
        pool_scores.push_back(scores[j]);
      }
    }
    int32_t* out = topk + size_t{t} * cfg.topk;
    const uint32_t kept = TopKWithScratch(pool_scores.data(), pool.size(), cfg.topk, out, idx);
    for (uint32_t j = 0; j < kept; ++j) out[j] = pool[out[j]];  // pool is ascending: stays sorted
  }
}

void IndexerReindex(const IndexerArgs& a, const IndexerConfig& cfg, const int32_t* candidates,
                    int32_t* topk) {
  const DequantizedKeys keys(a);
  std::vector<float> pool_scores;
  std::vector<int32_t> idx, pool;
  for (uint32_t t = 0; t < a.tokens; ++t) {
    const uint32_t sq = a.seq ? a.seq[t] : 0;
    const uint64_t vis = a.visible[t];
    const float* q = a.q + size_t{t} * a.heads * kIndexerDim;
    const float* w = a.weights + size_t{t} * a.heads;
    const int32_t* cand = candidates + size_t{t} * cfg.candidate_blocks;
    pool.clear();
    pool_scores.clear();
    for (uint32_t c = 0; c < cfg.candidate_blocks && cand[c] >= 0; ++c) {
      const uint64_t b = static_cast<uint64_t>(cand[c]);
      for (uint64_t j = b * cfg.block; j < std::min(vis, (b + 1) * cfg.block); ++j) {
        pool.push_back(static_cast<int32_t>(j));
        pool_scores.push_back(Score(q, w, a.heads, &keys.per_seq[sq][j * kIndexerDim]));
      }
    }
    int32_t* out = topk + size_t{t} * cfg.topk;
    const uint32_t kept = TopKWithScratch(pool_scores.data(), pool.size(), cfg.topk, out, idx);
    for (uint32_t j = 0; j < kept; ++j) out[j] = pool[out[j]];
  }
}

void IndexerReuse(const int32_t* source_topk, size_t tokens, uint32_t k, int32_t* topk) {
  std::memcpy(topk, source_topk, tokens * k * sizeof(int32_t));
}

}  // namespace strata::kernels

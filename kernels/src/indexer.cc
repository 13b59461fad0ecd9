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

// scores[j] = Score(q, w, heads, key j) for j in [from, to): four keys at
// a time, with the same arithmetic as Score for each.
void ScoreRange(const float* q, const float* w, uint32_t heads, const float* keys, uint64_t from,
                uint64_t to, float* scores) {
  uint64_t j = from;
  for (; j + 4 <= to; j += 4) {
    float s[4] = {0, 0, 0, 0}, d[4];
    for (uint32_t h = 0; h < heads; ++h) {
      detail::Dot4(q + size_t{h} * kIndexerDim, keys + j * kIndexerDim, kIndexerDim, kIndexerDim,
                   d);
      for (int r = 0; r < 4; ++r) s[r] += w[h] * std::max(0.0f, d[r]);
    }
    std::copy(s, s + 4, scores + j);
  }
  for (; j < to; ++j) scores[j] = Score(q, w, heads, keys + j * kIndexerDim);
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

// ScoreRange for two tokens of the same sequence over the same keys.
void ScoreRange2(const float* q0, const float* w0, const float* q1, const float* w1, uint32_t heads,
                 const float* keys, uint64_t from, uint64_t to, float* scores0, float* scores1) {
  uint64_t j = from;
  for (; j + 4 <= to; j += 4) {
    float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0}, d0[4], d1[4];
    for (uint32_t h = 0; h < heads; ++h) {
      detail::Dot2x4(q0 + size_t{h} * kIndexerDim, q1 + size_t{h} * kIndexerDim,
                     keys + j * kIndexerDim, kIndexerDim, kIndexerDim, d0, d1);
      for (int r = 0; r < 4; ++r) {
        s0[r] += w0[h] * std::max(0.0f, d0[r]);
        s1[r] += w1[h] * std::max(0.0f, d1[r]);
      }
    }
    std::copy(s0, s0 + 4, scores0 + j);
    std::copy(s1, s1 + 4, scores1 + j);
  }
  ScoreRange(q0, w0, heads, keys, j, to, scores0);
  ScoreRange(q1, w1, heads, keys, j, to, scores1);
}

// Scores of tokens [t0, t1) against every key each can see: row t - t0 of
// `out` (row_stride floats) holds token t's scores for keys [0, visible).
// Tiled so that a tile of keys stays in cache while every token of the
// tile scores it: one pass over the keys per tile of tokens, not per token.
void ScoreTokenTile(const IndexerArgs& a, const DequantizedKeys& keys, uint32_t t0, uint32_t t1,
                    uint64_t row_stride, float* out) {
  constexpr uint64_t kKeyTile =
      128;  // x 512 B of floats: stays in L1 while the tile's tokens score it
  const uint64_t max_vis = *std::max_element(a.visible + t0, a.visible + t1);
  auto seq = [&](uint32_t t) { return a.seq ? a.seq[t] : 0; };
  auto q = [&](uint32_t t) { return a.q + size_t{t} * a.heads * kIndexerDim; };
  auto w = [&](uint32_t t) { return a.weights + size_t{t} * a.heads; };
  auto row = [&](uint32_t t) { return out + (t - t0) * row_stride; };
  for (uint64_t j0 = 0; j0 < max_vis; j0 += kKeyTile) {
    const uint64_t j1 = j0 + kKeyTile;
    for (uint32_t t = t0; t < t1;) {
      const float* k = keys.per_seq[seq(t)].data();
      const uint64_t end = std::min(a.visible[t], j1);
      if (t + 1 < t1 && seq(t + 1) == seq(t)) {
        // Two tokens of one sequence share the key loads; the longer one's
        // extra keys go alone.
        const uint64_t end1 = std::min(a.visible[t + 1], j1);
        const uint64_t both = std::min(end, end1);
        if (j0 < both)
          ScoreRange2(q(t), w(t), q(t + 1), w(t + 1), a.heads, k, j0, both, row(t), row(t + 1));
        const uint64_t from = std::max(j0, both);
        if (from < end) ScoreRange(q(t), w(t), a.heads, k, from, end, row(t));
        if (from < end1) ScoreRange(q(t + 1), w(t + 1), a.heads, k, from, end1, row(t + 1));
        t += 2;
      } else {
        if (j0 < end) ScoreRange(q(t), w(t), a.heads, k, j0, end, row(t));
        t += 1;
      }
    }
  }
}

constexpr uint32_t kTokenTile = 16;

// The strict total order of the selection: a ranks before b.
bool Before(const float* scores, int32_t a, int32_t b) {
  const float sa = std::isnan(scores[a]) ? kNegInf : scores[a];
  const float sb = std::isnan(scores[b]) ? kNegInf : scores[b];
  if (sa != sb) return sa > sb;
  if (std::isnan(scores[a]) != std::isnan(scores[b])) return std::isnan(scores[b]);  // -inf > NaN
  return a < b;
}

// TopKWithScratch for a small k out of many: one pass that keeps the k
// best seen so far, sorted best first. Past the first few hundred
// elements almost none gets in, so this is one compare per element.
uint32_t TopKSmall(const float* scores, uint64_t n, uint32_t k, int32_t* out,
                   std::vector<int32_t>& best) {
  best.clear();
  for (uint64_t i = 0; i < n; ++i) {
    const auto j = static_cast<int32_t>(i);
    if (best.size() == k && !Before(scores, j, best.back())) continue;
    if (best.size() == k) best.pop_back();
    auto at = std::upper_bound(best.begin(), best.end(), j,
                               [scores](int32_t a, int32_t b) { return Before(scores, a, b); });
    best.insert(at, j);
  }
  const auto kept = static_cast<uint32_t>(best.size());
  std::copy(best.begin(), best.end(), out);
  std::sort(out, out + kept);
  std::fill(out + kept, out + k, -1);
  return kept;
}

uint32_t TopKWithScratch(const float* scores, uint64_t n, uint32_t k, int32_t* out,
                         std::vector<int32_t>& idx) {
  // The selected set is unique (a strict total order), so either way
  // selects the same indices.
  if (k <= 32 && n >= 16 * uint64_t{k}) return TopKSmall(scores, n, k, out, idx);
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
  for (uint32_t t0 = 0; t0 < a.tokens; t0 += kTokenTile) {
    const uint32_t t1 = std::min(a.tokens, t0 + kTokenTile);
    ScoreTokenTile(a, keys, t0, t1, row_stride, scores + size_t{t0} * row_stride);
  }
  for (uint32_t t = 0; t < a.tokens; ++t) {
    assert(a.visible[t] <= row_stride);
    std::fill(scores + t * row_stride + a.visible[t], scores + (t + 1) * row_stride, kNegInf);
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
  std::vector<float> tile_scores, pooled, pool_scores;
  uint64_t row_stride = 0;  // of the current tile's scores
  std::vector<int32_t> idx, pool;
  for (uint32_t t = 0; t < a.tokens; ++t) {
    const uint64_t vis = a.visible[t];
    // Token t's scores: row t % kTokenTile of its tile's scores.
    const uint32_t t0 = t - t % kTokenTile;
    if (t == t0) {
      const uint32_t t1 = std::min(a.tokens, t0 + kTokenTile);
      row_stride = *std::max_element(a.visible + t0, a.visible + t1);
      tile_scores.resize(kTokenTile * row_stride);
      ScoreTokenTile(a, keys, t0, t1, row_stride, tile_scores.data());
    }
    const float* scores = tile_scores.data() + (t - t0) * row_stride;
    pooled.resize((vis + cfg.block - 1) / cfg.block);
    BlockMaxPool(scores, vis, cfg.block, pooled.data());
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

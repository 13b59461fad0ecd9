// Indexer: scores against float64, block-max pooling, deterministic top-k
// (ties to the lower index, NaN last), the Full / Reindex / Reuse pipeline
// against a brute-force reference, and bit-exact batch/chunk invariance.
#include "strata/kernels/indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "reduce.h"  // detail::Dot and its fast variants
#include "strata/kernels/formats.h"

namespace strata::kernels {
namespace {

using testing::Dot64;
using testing::QuantizedRows;
using testing::RandomFloats;
using testing::RandomQuantized;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Two sequences of keys and a batch of query tokens spread over them.
struct Fixture {
  uint32_t heads = 4;
  std::vector<QuantizedRows> keys;
  std::vector<IndexerKeys> seqs;
  std::vector<float> q, w;
  std::vector<uint32_t> seq;
  std::vector<uint64_t> visible;

  Fixture(uint32_t tokens, uint64_t n0, uint64_t n1, uint64_t seed) {
    keys.push_back(RandomQuantized(kIndexerKey, n0, seed));
    keys.push_back(RandomQuantized(kIndexerKey, n1, seed + 1));
    seqs = {{keys[0].bytes.data(), n0}, {keys[1].bytes.data(), n1}};
    q = RandomFloats(size_t{tokens} * heads * kIndexerDim, seed + 2);
    w = RandomFloats(size_t{tokens} * heads, seed + 3);
    std::mt19937_64 rng(seed);
    for (uint32_t t = 0; t < tokens; ++t) {
      seq.push_back(t % 2);
      const uint64_t n = t % 2 ? n1 : n0;
      visible.push_back(n - rng() % std::min<uint64_t>(n, 40));
    }
  }
  IndexerArgs Args() const {
    return {static_cast<uint32_t>(seq.size()),
            heads,
            q.data(),
            w.data(),
            seq.data(),
            visible.data(),
            seqs};
  }
  // The same tokens [first, first + n) as a smaller batch.
  IndexerArgs Slice(uint32_t first, uint32_t n) const {
    return {n,
            heads,
            q.data() + size_t{first} * heads * kIndexerDim,
            w.data() + size_t{first} * heads,
            seq.data() + first,
            visible.data() + first,
            seqs};
  }
};

// Selection order of the spec, by brute force: a stable sort by score with
// NaN last keeps ties in ascending index order.
std::vector<int32_t> BruteTopK(const std::vector<float>& s, uint32_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(s[i]) ? kNegInf : s[i]; };
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    if (key(a) != key(b)) return key(a) > key(b);
    return !std::isnan(s[a]) && std::isnan(s[b]);
  });
  idx.resize(std::min<size_t>(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  idx.resize(k, -1);
  return idx;
}

TEST(IndexerTest, ScoresMatchFloat64) {
  const Fixture f(6, 300, 170, 11);
  const uint64_t stride = 300;
  std::vector<float> scores(6 * stride);
  IndexerScores(f.Args(), scores.data(), stride);
  for (uint32_t t = 0; t < 6; ++t) {
    const std::vector<float>& k = f.keys[f.seq[t]].values;
    for (uint64_t j = 0; j < stride; ++j) {
      const float got = scores[t * stride + j];
      if (j >= f.visible[t]) {
        EXPECT_EQ(got, kNegInf);
        continue;
      }
      double want = 0, mag = 0;
      for (uint32_t h = 0; h < f.heads; ++h) {
        const float* q = &f.q[(size_t{t} * f.heads + h) * kIndexerDim];
        const double w = f.w[t * f.heads + h];
        want += w * std::max(0.0, Dot64(q, &k[j * kIndexerDim], kIndexerDim));
        for (uint32_t d = 0; d < kIndexerDim; ++d)
          mag += std::fabs(w * q[d] * k[j * kIndexerDim + d]);
      }
      // float32 accumulation of ~4 x 128 products: relative 1e-5 of the magnitude.
      ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6) << "token " << t << " key " << j;
    }
  }
}

TEST(IndexerTest, BlockMaxPool) {
  const std::vector<float> s = {1, 5, 2, kNegInf, 3, 3, 9, -1, 4, 0};
  std::vector<float> pooled(4);
  BlockMaxPool(s.data(), s.size(), 3, pooled.data());
  EXPECT_EQ(pooled, (std::vector<float>{5, 3, 9, 0}));  // the last block is partial
}

TEST(IndexerTest, TopKBreaksTiesTowardLowerIndex) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int round = 0; round < 50; ++round) {
    std::vector<float> s(1 + rng() % 300);
    for (float& x : s) x = static_cast<float>(rng() % 7);  // many ties
    if (round % 3 == 0) s[rng() % s.size()] = std::numeric_limits<float>::quiet_NaN();
    if (round % 5 == 0) s[rng() % s.size()] = kNegInf;
    const uint32_t k = 1 + rng() % 64;
    std::vector<int32_t> got(k);
    EXPECT_EQ(TopK(s.data(), s.size(), k, got.data()), std::min<size_t>(k, s.size()));
    ASSERT_EQ(got, BruteTopK(s, k)) << "round " << round;
  }
  const std::vector<float> ties = {2, 1, 2, 2};
  std::vector<int32_t> two(2);
  TopK(ties.data(), ties.size(), 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{0, 2}));
}

TEST(IndexerTest, FullReindexReuseMatchBruteForce) {
  const Fixture f(8, 400, 250, 21);
  const Fixture g(8, 400, 250, 31);  // the Reindex layer's own queries
  IndexerArgs ga = g.Args();
  ga.visible = f.visible.data();
  ga.seqs = f.seqs;
  const IndexerConfig cfg{8, 5, 12};
  std::vector<int32_t> cand(8 * cfg.candidate_blocks), topk(8 * cfg.topk), re(8 * cfg.topk),
      reuse(8 * cfg.topk);
  IndexerSelectFull(f.Args(), cfg, cand.data(), topk.data());
  IndexerReindex(ga, cfg, cand.data(), re.data());
  IndexerReuse(topk.data(), 8, cfg.topk, reuse.data());
  EXPECT_EQ(reuse, topk);

  std::vector<float> s(8 * 400), s2(8 * 400);
  IndexerScores(f.Args(), s.data(), 400);
  IndexerScores(ga, s2.data(), 400);
  for (uint32_t t = 0; t < 8; ++t) {
    const uint64_t vis = f.visible[t];
    std::vector<float> row(s.begin() + t * 400, s.begin() + t * 400 + vis);
    std::vector<float> pooled((vis + 7) / 8);
    BlockMaxPool(row.data(), vis, 8, pooled.data());
    const std::vector<int32_t> blocks = BruteTopK(pooled, cfg.candidate_blocks);
    EXPECT_TRUE(std::equal(blocks.begin(), blocks.end(), cand.begin() + t * cfg.candidate_blocks));
    // Full: its own scores over the pool. Reindex: the other query's scores.
    std::vector<float> masked(vis, kNegInf), masked2(vis, kNegInf);
    std::vector<bool> in_pool(vis, false);
    for (int32_t b : blocks) {
      for (uint64_t j = b * 8; j < std::min<uint64_t>(vis, b * 8 + 8); ++j) in_pool[j] = true;
    }
    std::vector<float> pool_scores, pool_scores2;
    std::vector<int32_t> pool;
    for (uint64_t j = 0; j < vis; ++j) {
      if (!in_pool[j]) continue;
      pool.push_back(static_cast<int32_t>(j));
      pool_scores.push_back(row[j]);
      pool_scores2.push_back(s2[t * 400 + j]);
    }
    for (auto [scores, got] : {std::pair{&pool_scores, &topk}, std::pair{&pool_scores2, &re}}) {
      std::vector<int32_t> want = BruteTopK(*scores, cfg.topk);
      for (int32_t& i : want) i = i < 0 ? -1 : pool[i];
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got->begin() + t * cfg.topk))
          << "token " << t;
    }
  }
}

TEST(IndexerTest, BatchAndChunkInvariant) {
  const Fixture f(9, 500, 333, 41);
  const IndexerConfig cfg{8, 16, 40};
  std::vector<int32_t> cand(9 * cfg.candidate_blocks), topk(9 * cfg.topk);
  IndexerSelectFull(f.Args(), cfg, cand.data(), topk.data());
  std::vector<float> scores(9 * 500);
  IndexerScores(f.Args(), scores.data(), 500);
  // Chunks of 1, 2, 4 and 2 tokens must give the same bits.
  std::vector<int32_t> cand2(cand.size()), topk2(topk.size());
  std::vector<float> scores2(scores.size());
  for (auto [first, n] : {std::pair{0u, 1u}, {1u, 2u}, {3u, 4u}, {7u, 2u}}) {
    IndexerSelectFull(f.Slice(first, n), cfg, &cand2[first * cfg.candidate_blocks],
                      &topk2[first * cfg.topk]);
    IndexerScores(f.Slice(first, n), &scores2[first * 500], 500);
  }
  EXPECT_EQ(cand, cand2);
  EXPECT_EQ(topk, topk2);
  EXPECT_EQ(0, std::memcmp(scores.data(), scores2.data(), scores.size() * sizeof(float)));
}

// The fast paths (four keys, or two tokens by four keys, per call) give
// each score the exact arithmetic of detail::Dot: same bits for every n.
TEST(IndexerTest, FastDotsEqualDotBitForBit) {
  for (size_t n : {1u, 7u, 8u, 9u, 64u, 127u, 128u, 200u}) {
    const std::vector<float> a0 = RandomFloats(n, 100 + n), a1 = RandomFloats(n, 200 + n);
    const std::vector<float> b = RandomFloats(4 * (n + 3), 300 + n);
    const size_t stride = n + 3;
    float d4[4], e0[4], e1[4];
    detail::Dot4(a0.data(), b.data(), stride, n, d4);
    detail::Dot2x4(a0.data(), a1.data(), b.data(), stride, n, e0, e1);
    for (size_t r = 0; r < 4; ++r) {
      const float want0 = detail::Dot(a0.data(), b.data() + r * stride, n);
      const float want1 = detail::Dot(a1.data(), b.data() + r * stride, n);
      EXPECT_EQ(0, std::memcmp(&d4[r], &want0, sizeof(float))) << "n " << n << " r " << r;
      EXPECT_EQ(0, std::memcmp(&e0[r], &want0, sizeof(float))) << "n " << n << " r " << r;
      EXPECT_EQ(0, std::memcmp(&e1[r], &want1, sizeof(float))) << "n " << n << " r " << r;
    }
  }
}

// Runs of tokens from one sequence with different visible counts, over
// more keys than one cache tile: the tiled, paired scan gives every score
// the bits of a plain per-key loop.
TEST(IndexerTest, TiledScanEqualsPlainLoopBitForBit) {
  const uint32_t heads = 2, tokens = 37;
  const std::vector<uint64_t> counts = {1300, 700};
  std::vector<QuantizedRows> keys = {RandomQuantized(kIndexerKey, counts[0], 5),
                                     RandomQuantized(kIndexerKey, counts[1], 6)};
  const std::vector<IndexerKeys> seqs = {{keys[0].bytes.data(), counts[0]},
                                         {keys[1].bytes.data(), counts[1]}};
  const std::vector<float> q = RandomFloats(size_t{tokens} * heads * kIndexerDim, 7);
  const std::vector<float> w = RandomFloats(size_t{tokens} * heads, 8);
  std::vector<uint32_t> seq(tokens);
  std::vector<uint64_t> visible(tokens);
  std::mt19937_64 rng(9);
  for (uint32_t t = 0; t < tokens; ++t) {
    seq[t] = t < 20 || t % 7 == 0 ? 0 : 1;  // mostly runs; some lone tokens
    visible[t] = 1 + rng() % counts[seq[t]];
  }
  const IndexerArgs args{tokens, heads, q.data(), w.data(), seq.data(), visible.data(), seqs};
  const uint64_t stride = counts[0];
  std::vector<float> got(tokens * stride);
  IndexerScores(args, got.data(), stride);
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint64_t j = 0; j < visible[t]; ++j) {
      float want = 0;
      for (uint32_t h = 0; h < heads; ++h) {
        const float d = detail::Dot(&q[(size_t{t} * heads + h) * kIndexerDim],
                                    &keys[seq[t]].values[j * kIndexerDim], kIndexerDim);
        want += w[t * heads + h] * std::max(0.0f, d);
      }
      ASSERT_EQ(0, std::memcmp(&got[t * stride + j], &want, sizeof(float)))
          << "token " << t << " key " << j;
    }
  }
}

// Small k out of many takes a one-pass selection; it must pick exactly the
// set the general path (and the brute force) picks, NaN and ties included.
TEST(IndexerTest, TopKOfFewAmongManyMatchesBruteForce) {
  std::mt19937_64 rng(testing::TestSeed() + 1);
  for (int round = 0; round < 40; ++round) {
    const uint32_t k = 1 + rng() % 32;
    std::vector<float> s(16 * k + rng() % 4000);
    for (float& x : s)
      x = round % 2 ? static_cast<float>(rng() % 50) : std::ldexp(float(rng() % 100000), -7);
    for (int i = 0; i < round % 4; ++i)
      s[rng() % s.size()] = std::numeric_limits<float>::quiet_NaN();
    if (round % 5 == 0) s[rng() % s.size()] = kNegInf;
    std::vector<int32_t> got(k);
    EXPECT_EQ(TopK(s.data(), s.size(), k, got.data()), k);
    ASSERT_EQ(got, BruteTopK(s, k)) << "round " << round;
  }
  // Everything NaN: still k picks, lowest indices first.
  std::vector<float> nan(100, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> got(3);
  TopK(nan.data(), nan.size(), 3, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace strata::kernels

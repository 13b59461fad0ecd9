// Sparse global + sliding-window attention: against a float64 reference,
// masked vs compact bounded replay (bit-exact), and batch/chunk invariance
// (bit-exact).
#include "strata/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "strata/kernels/formats.h"

namespace strata::kernels {
namespace {

using testing::Dot64;
using testing::QuantizedRows;
using testing::RandomFloats;
using testing::RandomQuantized;

constexpr uint32_t kWindow = 128;
constexpr uint32_t kSlots = 134;
constexpr uint32_t kHeads = 4;
constexpr uint32_t kTopK = 16;

// One sequence: global entries, and a ring holding its last kSlots positions.
struct Sequence {
  QuantizedRows global;
  std::vector<uint8_t> ring;
  int64_t last = 0;  // newest position in the ring
  Sequence(uint64_t entries, int64_t last_pos, uint64_t seed)
      : global(RandomQuantized(kMainKv, entries, seed)),
        ring(kSlots * kSwaFp8.Bytes()),
        last(last_pos) {
    const std::vector<float> keys = RandomFloats(kSlots * kHeadDim, seed + 1);
    for (int64_t p = last - kSlots + 1; p <= last; ++p) {
      if (p >= 0) WriteRingPosition(ring.data(), kSlots, p, &keys[(p % kSlots) * kHeadDim]);
    }
  }
  SequenceKv Kv(int64_t replay_start = 0) const {
    return {global.bytes.data(), global.values.size() / kHeadDim, ring.data(), kSlots,
            replay_start};
  }
};

// A batch: the last 7 positions of each sequence (what a 134-slot ring
// holds a full window for), interleaved.
struct Batch {
  std::vector<float> q;
  std::vector<uint32_t> seq;
  std::vector<int64_t> pos;
  std::vector<int32_t> topk;
  Batch(const std::vector<Sequence>& seqs, uint64_t seed) {
    std::mt19937_64 rng(testing::TestSeed() + seed);
    for (int back = 6; back >= 0; --back) {
      for (uint32_t s = 0; s < seqs.size(); ++s) {
        seq.push_back(s);
        pos.push_back(seqs[s].last - back);
        // Distinct ascending global indices, the tail padded with -1.
        const uint64_t n = seqs[s].global.values.size() / kHeadDim;
        std::vector<int32_t> idx;
        while (idx.size() < kTopK - rng() % 4) {
          const int32_t i = static_cast<int32_t>(rng() % n);
          if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
        }
        std::sort(idx.begin(), idx.end());
        idx.resize(kTopK, -1);
        topk.insert(topk.end(), idx.begin(), idx.end());
      }
    }
    q = RandomFloats(seq.size() * kHeads * kHeadDim, seed + 2);
  }
  uint32_t Tokens() const { return static_cast<uint32_t>(seq.size()); }
  AttentionArgs Args(std::span<const SequenceKv> kv, float* out, float* lse, uint32_t first = 0,
                     uint32_t n = ~0u) const {
    AttentionArgs a;
    a.tokens = std::min(n, Tokens() - first);
    a.heads = kHeads;
    a.topk = kTopK;
    a.window = kWindow;
    a.softmax_scale = 1.0f / std::sqrt(float{kHeadDim});
    a.q = q.data() + size_t{first} * kHeads * kHeadDim;
    a.seq = seq.data() + first;
    a.positions = pos.data() + first;
    a.topk_idx = topk.data() + size_t{first} * kTopK;
    a.seqs = kv;
    a.out = out + size_t{first} * kHeads * kHeadDim;
    a.lse = lse + size_t{first} * kHeads;
    return a;
  }
};

TEST(AttentionTest, MatchesFloat64Reference) {
  const std::vector<Sequence> seqs = {Sequence(300, 399, 1), Sequence(50, 150, 2)};
  for (int64_t replay : {0, 396}) {
    const std::vector<SequenceKv> kv = {seqs[0].Kv(replay), seqs[1].Kv()};
    Batch b(seqs, 3);
    // Tokens before the replay start cannot attend under it; keep the others.
    std::vector<float> out(b.Tokens() * kHeads * kHeadDim), lse(b.Tokens() * kHeads);
    for (uint32_t t = 0; t < b.Tokens(); ++t) {
      if (b.pos[t] >= kv[b.seq[t]].replay_start)
        SparseSwaAttention(b.Args(kv, out.data(), lse.data(), t, 1));
    }
    for (uint32_t t = 0; t < b.Tokens(); ++t) {
      const SequenceKv& s = kv[b.seq[t]];
      const int64_t i = b.pos[t];
      if (i < s.replay_start) continue;
      // The visible keys, dequantized exactly.
      std::vector<std::vector<float>> keys;
      for (uint32_t j = 0; j < kTopK; ++j) {
        const int32_t g = b.topk[t * kTopK + j];
        if (g >= 0)
          keys.emplace_back(&seqs[b.seq[t]].global.values[size_t(g) * kHeadDim],
                            &seqs[b.seq[t]].global.values[size_t(g + 1) * kHeadDim]);
      }
      for (int64_t p = std::max(s.replay_start, i - kWindow + 1); p <= i; ++p) {
        keys.emplace_back(kHeadDim);
        Dequantize(kSwaFp8, s.ring + (p % kSlots) * kSwaFp8.Bytes(), 1, keys.back().data());
      }
      for (uint32_t h = 0; h < kHeads; ++h) {
        const float* q = &b.q[(size_t{t} * kHeads + h) * kHeadDim];
        std::vector<double> sc;
        sc.reserve(keys.size());
        for (const auto& k : keys)
          sc.push_back(Dot64(q, k.data(), kHeadDim) / std::sqrt(double{kHeadDim}));
        const double m = *std::max_element(sc.begin(), sc.end());
        double l = 0;
        for (double x : sc) l += std::exp(x - m);
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          double o = 0;
          for (size_t j = 0; j < keys.size(); ++j) o += std::exp(sc[j] - m) / l * keys[j][d];
          ASSERT_NEAR(out[(size_t{t} * kHeads + h) * kHeadDim + d], o, 1e-5)
              << t << " " << h << " " << d;
        }
        EXPECT_NEAR(lse[t * kHeads + h], m + std::log(l), 1e-5);
      }
    }
  }
}

// Replaying from s must look exactly like a dense window with positions < s
// masked, whatever (finite) data the ring still holds there.
TEST(AttentionTest, MaskedAndCompactReplayAgreeBitExactly) {
  const std::vector<Sequence> seqs = {Sequence(300, 399, 11), Sequence(80, 140, 12)};
  const Batch b(seqs, 13);
  for (int64_t s :
       {int64_t{0}, int64_t{200}, int64_t{272}, int64_t{393}, int64_t{396}, int64_t{399}}) {
    const std::vector<SequenceKv> kv = {seqs[0].Kv(s), seqs[1].Kv(std::min<int64_t>(s, 134))};
    std::vector<float> compact(b.Tokens() * kHeads * kHeadDim), masked(compact.size());
    std::vector<float> lse_c(b.Tokens() * kHeads), lse_m(lse_c.size());
    for (uint32_t t = 0; t < b.Tokens(); ++t) {
      if (b.pos[t] < kv[b.seq[t]].replay_start) continue;
      SparseSwaAttention(b.Args(kv, compact.data(), lse_c.data(), t, 1));
      SparseSwaAttentionMasked(b.Args(kv, masked.data(), lse_m.data(), t, 1));
    }
    EXPECT_EQ(0, std::memcmp(compact.data(), masked.data(), compact.size() * sizeof(float)))
        << "s=" << s;
    EXPECT_EQ(0, std::memcmp(lse_c.data(), lse_m.data(), lse_c.size() * sizeof(float)))
        << "s=" << s;
  }
  // Masking matters: replay from 396 differs from the full window.
  const size_t n = b.Tokens() * kHeads * kHeadDim;
  std::vector<float> full(n), replay(n), l1(b.Tokens() * kHeads), l2(l1.size());
  const std::vector<SequenceKv> kv0 = {seqs[0].Kv(0)}, kv1 = {seqs[0].Kv(396)};
  SparseSwaAttention(b.Args(kv0, full.data(), l1.data(), 12, 1));  // token 12: seq 0, position 399
  SparseSwaAttention(b.Args(kv1, replay.data(), l2.data(), 12, 1));
  EXPECT_NE(full, replay);
}

TEST(AttentionTest, BatchAndChunkInvariant) {
  const std::vector<Sequence> seqs = {Sequence(300, 399, 21), Sequence(64, 200, 22)};
  const std::vector<SequenceKv> kv = {seqs[0].Kv(), seqs[1].Kv(190)};
  const Batch b(seqs, 23);
  const size_t n = b.Tokens() * kHeads * kHeadDim;
  std::vector<float> whole(n), lse_whole(b.Tokens() * kHeads);
  SparseSwaAttention(b.Args(kv, whole.data(), lse_whole.data()));
  for (uint32_t chunk : {1u, 3u, 5u}) {
    std::vector<float> out(n), lse(lse_whole.size());
    for (uint32_t first = 0; first < b.Tokens(); first += chunk) {
      SparseSwaAttention(b.Args(kv, out.data(), lse.data(), first, chunk));
    }
    EXPECT_EQ(0, std::memcmp(whole.data(), out.data(), n * sizeof(float))) << "chunk " << chunk;
    EXPECT_EQ(0, std::memcmp(lse_whole.data(), lse.data(), lse.size() * sizeof(float)));
  }
  // A sequence alone (its own SequenceKv list) equals it inside the batch.
  const std::vector<SequenceKv> only = {kv[1]};
  std::vector<uint32_t> zero(1, 0);
  std::vector<float> alone(kHeads * kHeadDim), lse_alone(kHeads);
  AttentionArgs a = b.Args(only, alone.data(), lse_alone.data(), 1, 1);  // token 1: seq 1
  a.seq = zero.data();
  a.out = alone.data();
  a.lse = lse_alone.data();
  SparseSwaAttention(a);
  EXPECT_EQ(0, std::memcmp(alone.data(), &whole[kHeads * kHeadDim], alone.size() * sizeof(float)));
}

// What a warm run relies on: prefill in one call from a big scratch ring
// equals decoding the same positions in chunks of up to 7 through the
// 134-slot ring (written as they go, wrapping many times): bit for bit.
TEST(AttentionTest, RingChunksEqualOneShotPrefill) {
  constexpr uint32_t kLen = 300, kBig = 512;
  const QuantizedRows global = RandomQuantized(kMainKv, 64, 31);
  const std::vector<float> keys = RandomFloats(kLen * kHeadDim, 32);
  const std::vector<float> q = RandomFloats(kLen * kHeads * kHeadDim, 33);
  std::vector<int64_t> pos(kLen);
  std::vector<int32_t> topk(kLen * kTopK);
  std::mt19937_64 rng(testing::TestSeed() + 34);
  for (uint32_t t = 0; t < kLen; ++t) {
    pos[t] = t;
    for (uint32_t j = 0; j < kTopK; ++j) topk[t * kTopK + j] = j < 10 ? int32_t(rng() % 64) : -1;
    std::sort(topk.begin() + t * kTopK, topk.begin() + t * kTopK + 10);
  }
  AttentionArgs a;
  a.heads = kHeads;
  a.topk = kTopK;
  a.window = kWindow;
  a.softmax_scale = 0.05f;
  const size_t per_token = kHeads * kHeadDim;

  std::vector<uint8_t> big(kBig * kSwaFp8.Bytes());
  for (uint32_t p = 0; p < kLen; ++p) WriteRingPosition(big.data(), kBig, p, &keys[p * kHeadDim]);
  const std::vector<SequenceKv> big_kv = {{global.bytes.data(), 64, big.data(), kBig, 0}};
  std::vector<float> one_shot(kLen * per_token);
  a.tokens = kLen;
  a.q = q.data();
  a.positions = pos.data();
  a.topk_idx = topk.data();
  a.seqs = big_kv;
  a.out = one_shot.data();
  SparseSwaAttention(a);

  std::vector<uint8_t> ring(kSlots * kSwaFp8.Bytes());
  const std::vector<SequenceKv> ring_kv = {{global.bytes.data(), 64, ring.data(), kSlots, 0}};
  std::vector<float> chunked(one_shot.size());
  for (uint32_t first = 0, c = 1; first < kLen; first += c, c = c % 7 + 1) {
    const uint32_t n = std::min(c, kLen - first);
    for (uint32_t p = first; p < first + n; ++p) {
      WriteRingPosition(ring.data(), kSlots, p, &keys[p * kHeadDim]);
    }
    a.tokens = n;
    a.q = q.data() + first * per_token;
    a.positions = pos.data() + first;
    a.topk_idx = topk.data() + first * kTopK;
    a.seqs = ring_kv;
    a.out = chunked.data() + first * per_token;
    SparseSwaAttention(a);
  }
  EXPECT_EQ(0, std::memcmp(one_shot.data(), chunked.data(), one_shot.size() * sizeof(float)));
}

}  // namespace
}  // namespace strata::kernels

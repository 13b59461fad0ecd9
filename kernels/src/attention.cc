#include "strata/kernels/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "reduce.h"
#include "strata/kernels/formats.h"

namespace strata::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One softmax part for one head: scores in, (max, sum, unnormalized output) out.
struct Part {
  float m = kNegInf;
  float l = 0;
};

// keys: n x kHeadDim dequantized keys (= values); scores: n scores, -inf for
// masked keys. o receives sum_j e^(score_j - m) * key_j in key order.
Part Softmax(const float* scores, const float* keys, uint32_t n, float* o) {
  Part p;
  for (uint32_t j = 0; j < n; ++j) p.m = std::max(p.m, scores[j]);
  std::fill(o, o + kHeadDim, 0.0f);
  if (p.m == kNegInf) return p;  // no visible key
  for (uint32_t j = 0; j < n; ++j) {
    const float w = std::exp(scores[j] - p.m);  // exactly 0 for a masked key
    p.l += w;
    const float* v = keys + size_t{j} * kHeadDim;
    for (uint32_t d = 0; d < kHeadDim; ++d) o[d] += w * v[d];
  }
  return p;
}

// Per-token scratch, reused across tokens.
struct Scratch {
  std::vector<float> keys, scores, og, ol;
};

// Attends one token. `masked` selects the dense-window-with-mask variant.
void AttendToken(const AttentionArgs& a, uint32_t t, bool masked, Scratch& s) {
  const SequenceKv& kv = a.seqs[a.seq ? a.seq[t] : 0];
  const int64_t i = a.positions[t];
  assert(kv.ring_slots >= a.window && i >= kv.replay_start);
  const int32_t* idx = a.topk_idx + size_t{t} * a.topk;

  // Local range: visible keys start at max(s, i-W+1); the masked variant
  // walks from max(0, i-W+1) and masks what lies before s.
  const int64_t window_lo = std::max<int64_t>(0, i - a.window + 1);
  const int64_t visible_lo = std::max<int64_t>(kv.replay_start, window_lo);
  const int64_t lo = masked ? window_lo : visible_lo;
  const uint32_t n_local = static_cast<uint32_t>(i - lo + 1);
  uint32_t n_global = 0;
  for (uint32_t j = 0; j < a.topk; ++j) n_global += idx[j] >= 0;

  const uint32_t n = n_global + n_local;
  s.keys.resize(size_t{n} * kHeadDim);
  s.scores.resize(n);
  float* keys = s.keys.data();
  for (uint32_t j = 0, g = 0; j < a.topk; ++j) {
    if (idx[j] < 0) continue;
    assert(static_cast<uint64_t>(idx[j]) < kv.global_count);
    DequantizeEntry(kMainKv, kv.global + size_t(idx[j]) * kMainKv.Bytes(),
                    keys + size_t{g++} * kHeadDim);
  }
  float* local = keys + size_t{n_global} * kHeadDim;
  for (int64_t p = lo; p <= i; ++p) {
    const uint8_t* slot = kv.ring + (p % kv.ring_slots) * kSwaFp8.Bytes();
    DequantizeEntry(kSwaFp8, slot, local + size_t(p - lo) * kHeadDim);
  }

  for (uint32_t h = 0; h < a.heads; ++h) {
    const float* q = a.q + (size_t{t} * a.heads + h) * kHeadDim;
    for (uint32_t j = 0; j < n; ++j) {
      const int64_t p = lo + (int64_t{j} - n_global);
      const bool hidden = j >= n_global && p < visible_lo;
      s.scores[j] = hidden
                        ? kNegInf
                        : detail::Dot(q, keys + size_t{j} * kHeadDim, kHeadDim) * a.softmax_scale;
    }
    const Part g = Softmax(s.scores.data(), keys, n_global, s.og.data());
    const Part l = Softmax(s.scores.data() + n_global, local, n_local, s.ol.data());
    const float m = std::max(g.m, l.m);
    const float ag = g.m == kNegInf ? 0.0f : std::exp(g.m - m);
    const float al = l.m == kNegInf ? 0.0f : std::exp(l.m - m);
    const float denom = ag * g.l + al * l.l;
    float* out = a.out + (size_t{t} * a.heads + h) * kHeadDim;
    for (uint32_t d = 0; d < kHeadDim; ++d) out[d] = (ag * s.og[d] + al * s.ol[d]) / denom;
    if (a.lse) a.lse[size_t{t} * a.heads + h] = m + std::log(denom);
  }
}

void Run(const AttentionArgs& a, bool masked) {
  Scratch s;
  s.og.resize(kHeadDim);
  s.ol.resize(kHeadDim);
  for (uint32_t t = 0; t < a.tokens; ++t) AttendToken(a, t, masked, s);
}

}  // namespace

void SparseSwaAttention(const AttentionArgs& args) { Run(args, /*masked=*/false); }
void SparseSwaAttentionMasked(const AttentionArgs& args) { Run(args, /*masked=*/true); }

void WriteRingPosition(uint8_t* ring, uint32_t ring_slots, int64_t pos, const float* key) {
  Quantize(kSwaFp8, key, 1, ring + (pos % ring_slots) * kSwaFp8.Bytes());
}

}  // namespace strata::kernels

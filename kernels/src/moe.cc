#include "strata/kernels/moe.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "reduce.h"

namespace strata::kernels {
namespace {

float Silu(float g) { return g / (1.0f + std::exp(-g)); }

void SwigluRow(const ExpertWeights& w, const float* x, uint32_t d_model, float* h, float* y) {
  for (uint32_t f = 0; f < w.hidden; ++f) {
    const float g = detail::Dot(x, w.w_gate + size_t{f} * d_model, d_model);
    const float u = detail::Dot(x, w.w_up + size_t{f} * d_model, d_model);
    h[f] = Silu(g) * u;
  }
  for (uint32_t d = 0; d < d_model; ++d)
    y[d] = detail::Dot(h, w.w_down + size_t{d} * w.hidden, w.hidden);
}

}  // namespace

void Route(const RouterConfig& cfg, const float* x, uint32_t tokens, uint32_t d_model,
           const float* w_router, const float* bias, int32_t* expert_ids, float* gates) {
  assert(cfg.topk >= 1 && cfg.topk <= cfg.experts);
  std::vector<float> score(cfg.experts), rank(cfg.experts);
  std::vector<int32_t> order(cfg.experts);
  for (uint32_t t = 0; t < tokens; ++t) {
    const float* xt = x + size_t{t} * d_model;
    for (uint32_t e = 0; e < cfg.experts; ++e)
      score[e] = detail::Dot(xt, w_router + size_t{e} * d_model, d_model);
    if (cfg.score == RouterScore::kSoftmax) {
      const float m = *std::max_element(score.begin(), score.end());
      float sum = 0;
      for (float& s : score) sum += (s = std::exp(s - m));
      for (float& s : score) s /= sum;
    } else {
      for (float& s : score) s = 1.0f / (1.0f + std::exp(-s));
    }
    for (uint32_t e = 0; e < cfg.experts; ++e) {
      const float r = bias ? score[e] + bias[e] : score[e];
      rank[e] = std::isnan(r) ? -std::numeric_limits<float>::infinity() : r;
      order[e] = static_cast<int32_t>(e);
    }
    // Stable sort by rank: equal ranks keep ascending ids, so ties go low.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return rank[a] > rank[b]; });
    std::sort(order.begin(), order.begin() + cfg.topk);
    int32_t* ids = expert_ids + size_t{t} * cfg.topk;
    float* g = gates + size_t{t} * cfg.topk;
    float total = 0;
    for (uint32_t j = 0; j < cfg.topk; ++j) {
      ids[j] = order[j];
      g[j] = score[order[j]];
      total += g[j];
    }
    for (uint32_t j = 0; j < cfg.topk; ++j) {
      if (cfg.renormalize && total > 0) g[j] /= total;
      g[j] *= cfg.scaling;
    }
  }
}

void SwigluFfn(const ExpertWeights& w, const float* x, uint32_t rows, uint32_t d_model, float* y) {
  std::vector<float> h(w.hidden);
  for (uint32_t r = 0; r < rows; ++r)
    SwigluRow(w, x + size_t{r} * d_model, d_model, h.data(), y + size_t{r} * d_model);
}

void MoeForward(const MoeArgs& a) {
  const size_t slots = size_t{a.tokens} * a.topk;
  // Group (token, slot) pairs by expert, in token order within an expert:
  // a counting sort, so each expert's weights stream through once.
  std::vector<size_t> begin(a.experts.size() + 1, 0), group(slots);
  for (size_t s = 0; s < slots; ++s) {
    assert(a.expert_ids[s] >= 0 && static_cast<size_t>(a.expert_ids[s]) < a.experts.size());
    ++begin[a.expert_ids[s] + 1];
  }
  for (size_t e = 0; e < a.experts.size(); ++e) begin[e + 1] += begin[e];
  std::vector<size_t> fill(begin.begin(), begin.end() - 1);
  for (size_t s = 0; s < slots; ++s) group[fill[a.expert_ids[s]]++] = s;

  std::vector<float> y(slots * a.d_model), h;
  for (size_t e = 0; e < a.experts.size(); ++e) {
    h.resize(a.experts[e].hidden);
    for (size_t i = begin[e]; i < begin[e + 1]; ++i) {
      const size_t s = group[i];
      SwigluRow(a.experts[e], a.x + (s / a.topk) * a.d_model, a.d_model, h.data(),
                &y[s * a.d_model]);
    }
  }
  if (a.shared) {
    SwigluFfn(*a.shared, a.x, a.tokens, a.d_model, a.out);
  } else {
    std::fill(a.out, a.out + size_t{a.tokens} * a.d_model, 0.0f);
  }
  for (size_t s = 0; s < slots; ++s) {  // per token, slots in ascending expert id
    float* out = a.out + (s / a.topk) * a.d_model;
    for (uint32_t d = 0; d < a.d_model; ++d) out[d] += a.gates[s] * y[s * a.d_model + d];
  }
}

}  // namespace strata::kernels

// MoE: router (softmax and sigmoid, bias, renormalization, tie-breaking)
// and the grouped SwiGLU experts + shared expert + combine against float64;
// bit-exact batch/chunk invariance.
#include "strata/kernels/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using testing::Dot64;
using testing::RandomFloats;

constexpr uint32_t kD = 256, kExperts = 16, kHidden = 96, kTokens = 12;

struct Weights {
  std::vector<std::vector<float>> mats;  // gate, up, down per expert; shared last
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  explicit Weights(uint64_t seed) {
    for (uint32_t e = 0; e <= kExperts; ++e) {
      for (int m = 0; m < 3; ++m)
        mats.push_back(RandomFloats(kHidden * kD, seed + 3 * e + m, 0.06f));
    }
    for (uint32_t e = 0; e <= kExperts; ++e) {
      const ExpertWeights w{mats[3 * e].data(), mats[3 * e + 1].data(), mats[3 * e + 2].data(),
                            kHidden};
      if (e < kExperts)
        experts.push_back(w);
      else
        shared = w;
    }
  }
};

std::vector<double> Swiglu64(const ExpertWeights& w, const float* x) {
  std::vector<double> h(w.hidden), y(kD, 0.0);
  for (uint32_t f = 0; f < w.hidden; ++f) {
    const double g = Dot64(x, w.w_gate + size_t{f} * kD, kD);
    h[f] = g / (1 + std::exp(-g)) * Dot64(x, w.w_up + size_t{f} * kD, kD);
  }
  for (uint32_t d = 0; d < kD; ++d) {
    for (uint32_t f = 0; f < w.hidden; ++f) y[d] += h[f] * w.w_down[size_t{d} * w.hidden + f];
  }
  return y;
}

TEST(MoeTest, RouterMatchesFloat64) {
  const std::vector<float> x = RandomFloats(kTokens * kD, 1);
  const std::vector<float> wr = RandomFloats(kExperts * kD, 2, 0.06f);
  const std::vector<float> bias = RandomFloats(kExperts, 3, 0.1f);
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    for (bool use_bias : {false, true}) {
      const RouterConfig cfg{kExperts, 3, score, score == RouterScore::kSigmoid, 2.5f};
      std::vector<int32_t> ids(kTokens * 3);
      std::vector<float> gates(kTokens * 3);
      Route(cfg, x.data(), kTokens, kD, wr.data(), use_bias ? bias.data() : nullptr, ids.data(),
            gates.data());
      for (uint32_t t = 0; t < kTokens; ++t) {
        std::vector<double> s(kExperts), rank(kExperts);
        for (uint32_t e = 0; e < kExperts; ++e) s[e] = Dot64(&x[t * kD], &wr[e * kD], kD);
        if (score == RouterScore::kSoftmax) {
          const double m = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double& v : s) sum += (v = std::exp(v - m));
          for (double& v : s) v /= sum;
        } else {
          for (double& v : s) v = 1 / (1 + std::exp(-v));
        }
        for (uint32_t e = 0; e < kExperts; ++e) rank[e] = s[e] + (use_bias ? bias[e] : 0.0);
        std::vector<int32_t> order(kExperts);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return rank[a] > rank[b]; });
        if (rank[order[2]] - rank[order[3]] < 1e-5)
          continue;  // a near-tie float32 may break differently
        std::vector<int32_t> want(order.begin(), order.begin() + 3);
        std::sort(want.begin(), want.end());
        ASSERT_TRUE(std::equal(want.begin(), want.end(), &ids[t * 3])) << "token " << t;
        double total = 0;
        for (int32_t e : want) total += s[e];
        for (int j = 0; j < 3; ++j) {
          const double g = s[want[j]] / (cfg.renormalize ? total : 1.0) * cfg.scaling;
          EXPECT_NEAR(gates[t * 3 + j], g, 1e-5 * (1 + g));
        }
      }
    }
  }
}

TEST(MoeTest, RouterTiesGoToTheLowerExpert) {
  std::vector<float> wr(kExperts * kD, 0.0f), x(kD, 1.0f);
  for (int e : {9, 5, 3}) std::fill(&wr[e * kD], &wr[e * kD] + kD, 0.01f);  // three equal winners
  std::vector<int32_t> ids(2);
  std::vector<float> gates(2);
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    Route({kExperts, 2, score, true, 1.0f}, x.data(), 1, kD, wr.data(), nullptr, ids.data(),
          gates.data());
    EXPECT_EQ(ids, (std::vector<int32_t>{3, 5}));
    EXPECT_EQ(gates[0], 0.5f);
    EXPECT_EQ(gates[1], 0.5f);
  }
  std::vector<float> bias(kExperts, 0.0f);
  bias[9] = 1.0f;  // the bias steers selection; gates still come from the scores
  Route({kExperts, 2, RouterScore::kSigmoid, false, 1.0f}, x.data(), 1, kD, wr.data(), bias.data(),
        ids.data(), gates.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(gates[0], gates[1]);
}

TEST(MoeTest, ForwardMatchesFloat64) {
  const Weights w(10);
  const std::vector<float> x = RandomFloats(kTokens * kD, 4);
  const std::vector<float> wr = RandomFloats(kExperts * kD, 5, 0.06f);
  std::vector<int32_t> ids(kTokens * 2);
  std::vector<float> gates(kTokens * 2), out(kTokens * kD);
  Route({kExperts, 2, RouterScore::kSoftmax, true, 1.0f}, x.data(), kTokens, kD, wr.data(), nullptr,
        ids.data(), gates.data());
  for (bool with_shared : {true, false}) {
    MoeForward({kTokens, kD, 2, x.data(), ids.data(), gates.data(), w.experts,
                with_shared ? &w.shared : nullptr, out.data()});
    for (uint32_t t = 0; t < kTokens; ++t) {
      std::vector<double> want(kD, 0.0);
      if (with_shared) want = Swiglu64(w.shared, &x[t * kD]);
      for (int j = 0; j < 2; ++j) {
        const std::vector<double> y = Swiglu64(w.experts[ids[t * 2 + j]], &x[t * kD]);
        for (uint32_t d = 0; d < kD; ++d) want[d] += gates[t * 2 + j] * y[d];
      }
      for (uint32_t d = 0; d < kD; ++d)
        ASSERT_NEAR(out[t * kD + d], want[d], 1e-5 * (1 + std::fabs(want[d])));
    }
  }
}

TEST(MoeTest, BatchAndChunkInvariant) {
  const Weights w(20);
  const std::vector<float> x = RandomFloats(kTokens * kD, 6);
  const std::vector<float> wr = RandomFloats(kExperts * kD, 7, 0.06f);
  const RouterConfig cfg{kExperts, 2, RouterScore::kSigmoid, true, 1.5f};
  auto run = [&](uint32_t first, uint32_t n, int32_t* ids, float* gates, float* out) {
    Route(cfg, &x[first * kD], n, kD, wr.data(), nullptr, ids + first * 2, gates + first * 2);
    MoeForward({n, kD, 2, &x[first * kD], ids + first * 2, gates + first * 2, w.experts, &w.shared,
                out + first * kD});
  };
  std::vector<int32_t> ids(kTokens * 2), ids2(ids.size());
  std::vector<float> gates(kTokens * 2), gates2(gates.size()), out(kTokens * kD), out2(out.size());
  run(0, kTokens, ids.data(), gates.data(), out.data());
  for (uint32_t first = 0, n = 1; first < kTokens; first += n, ++n) {
    run(first, std::min(n, kTokens - first), ids2.data(), gates2.data(), out2.data());
  }
  EXPECT_EQ(ids, ids2);
  EXPECT_EQ(0, std::memcmp(gates.data(), gates2.data(), gates.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)));
}

}  // namespace
}  // namespace strata::kernels

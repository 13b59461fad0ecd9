// Mixture-of-experts FFN (DESIGN §9): a router picks top-k routed experts
// per token, each expert is a SwiGLU FFN run over the tokens routed to it,
// a shared expert sees every token, and a fixed-order combine sums them.
//
//   router:  logit_e = x . w_router[e]; score_e = softmax(logits)_e or
//            sigmoid(logit_e). Selection ranks score_e + bias_e (bias may be
//            null; it steers selection only, as in DeepSeek-V3), higher
//            first, ties to the lower expert id. Gate weights are the
//            selected scores, optionally renormalized to sum to 1, times
//            `scaling`. Experts come back in ascending id order.
//   expert:  y = W_down (silu(W_gate x) * (W_up x)), silu(g) = g / (1 + e^-g).
//   combine: out_t = shared(x_t) + sum over the token's experts in
//            ascending id order of gate * y.
// Every row is computed alone in a fixed order: batch-invariant.
#pragma once

#include <cstdint>
#include <span>

namespace strata::kernels {

enum class RouterScore : uint8_t { kSoftmax, kSigmoid };

struct RouterConfig {
  uint32_t experts = 16;
  uint32_t topk = 2;
  RouterScore score = RouterScore::kSoftmax;
  bool renormalize = true;
  float scaling = 1.0f;
};

// x: tokens x d_model; w_router: experts x d_model; bias: experts or null.
// expert_ids, gates: tokens x topk.
void Route(const RouterConfig& cfg, const float* x, uint32_t tokens, uint32_t d_model,
           const float* w_router, const float* bias, int32_t* expert_ids, float* gates);

struct ExpertWeights {
  const float* w_gate = nullptr;  // hidden x d_model
  const float* w_up = nullptr;    // hidden x d_model
  const float* w_down = nullptr;  // d_model x hidden
  uint32_t hidden = 0;
};

struct MoeArgs {
  uint32_t tokens = 0;
  uint32_t d_model = 0;
  uint32_t topk = 0;
  const float* x = nullptr;             // tokens x d_model
  const int32_t* expert_ids = nullptr;  // tokens x topk, from Route
  const float* gates = nullptr;         // tokens x topk
  std::span<const ExpertWeights> experts;
  const ExpertWeights* shared = nullptr;  // may be null
  float* out = nullptr;                   // tokens x d_model
};

// Groups the tokens by expert, runs each expert once over its group, then
// combines per token.
void MoeForward(const MoeArgs& args);

// One SwiGLU FFN on `rows` rows (the shared expert, and a building block).
void SwigluFfn(const ExpertWeights& w, const float* x, uint32_t rows, uint32_t d_model, float* y);

}  // namespace strata::kernels

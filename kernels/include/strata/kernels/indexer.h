// The lightning indexer and top-k selection (DESIGN §9).
//
// Score of a query token t against indexer key j (kIndexerKey, FP4):
//   score(t, j) = sum over heads h (in order) of w[t,h] * max(0, q[t,h] . k_j)
// Token t sees the first visible[t] keys of its sequence (the caller
// enforces causality through that count).
//
// Layer kinds:
//   Full    — scores every visible key, max-pools them into blocks of
//             `block` (8) keys, keeps the top `candidate_blocks` (256) blocks
//             as the candidate pool, then picks its top-k keys from the pool.
//   Reindex — its own query scores only the pool of a Full layer and picks
//             its own top-k.
//   Reuse   — takes another layer's indices unchanged.
//
// Selection is deterministic: higher score first, equal scores go to the
// lower index; NaN ranks below every number. Selected indices are returned
// in ascending order (a canonical order, so downstream sums are fixed),
// padded with -1 when fewer exist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace strata::kernels {

constexpr uint32_t kIndexerDim = 128;  // = kIndexerKey.values

struct IndexerKeys {
  const uint8_t* keys = nullptr;  // count kIndexerKey entries (68 B)
  uint64_t count = 0;
};

struct IndexerArgs {
  uint32_t tokens = 0;
  uint32_t heads = 0;
  const float* q = nullptr;           // tokens x heads x kIndexerDim
  const float* weights = nullptr;     // tokens x heads
  const uint32_t* seq = nullptr;      // per token: index into seqs (nullptr: all 0)
  const uint64_t* visible = nullptr;  // per token: keys visible (<= that sequence's count)
  std::span<const IndexerKeys> seqs;
};

struct IndexerConfig {
  uint32_t block = 8;               // keys per pooled block
  uint32_t candidate_blocks = 256;  // C: 2,048 keys
  uint32_t topk = 512;
};

// scores[t * row_stride + j] = score(t, j) for j < visible[t]; -inf after,
// up to row_stride.
void IndexerScores(const IndexerArgs& args, float* scores, uint64_t row_stride);

// pooled[b] = max of scores[b*block .. min(n, (b+1)*block)); NaN-free input.
void BlockMaxPool(const float* scores, uint64_t n, uint32_t block, float* pooled);

// The k best of n scores (order above), ascending, padded with -1 to k.
// Returns how many were selected: min(n, k).
uint32_t TopK(const float* scores, uint64_t n, uint32_t k, int32_t* out);

// Full layer: candidates is tokens x candidate_blocks (block ids), topk is
// tokens x cfg.topk (key indices).
void IndexerSelectFull(const IndexerArgs& args, const IndexerConfig& cfg, int32_t* candidates,
                       int32_t* topk);

// Reindex layer: scores the keys of the given candidate blocks (visible ones
// only) with this layer's query and selects its top-k.
void IndexerReindex(const IndexerArgs& args, const IndexerConfig& cfg, const int32_t* candidates,
                    int32_t* topk);

// Reuse layer: the source layer's indices.
void IndexerReuse(const int32_t* source_topk, size_t tokens, uint32_t k, int32_t* topk);

}  // namespace strata::kernels

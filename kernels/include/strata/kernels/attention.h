// Sparse global + sliding-window attention (DESIGN §9), the V4.1 shape:
// one shared KV head (each cached entry is both key and value), `heads`
// query heads of kHeadDim values.
//
// For a query token at position i of a sequence, the keys are
//   - global: the entries named by the token's top-k indices (from the
//     indexer), dequantized from FP4 (kMainKv); index -1 means "no entry";
//   - local: the sliding window, read from the sequence's MXFP8 ring
//     (kSwaFp8; position p lives in slot p % ring_slots): positions
//     max(s, i - W + 1) .. i, where s is the sequence's replay start.
// Each part is a two-pass softmax (max, then sum of exp in key order); the
// two are merged by log-sum-exp:
//   out = (e^(mg-M) og + e^(ml-M) ol) / (e^(mg-M) lg + e^(ml-M) ll),
//   lse = M + log(e^(mg-M) lg + e^(ml-M) ll),  M = max(mg, ml).
//
// Bounded replay: with s > 0 the local keys before s are invisible, as if
// the sequence started at s. Two implementations:
//   - SparseSwaAttention (compact): gathers only the visible local keys.
//   - SparseSwaAttentionMasked: walks the full window max(0, i-W+1)..i and
//     masks positions < s with a -inf score, like a dense kernel would. Its
//     masked slots are read, so they must hold finite data.
// They agree bit for bit (a masked key adds exactly +0 to every sum).
//
// The ring must still hold every local key a call reads: a 134-slot ring
// (W + 6) serves up to 7 consecutive new positions of a sequence per call
// (decode, speculative tokens). A longer prefill chunk of c tokens writes
// its keys to a scratch ring of at least W + c - 1 slots and attends from
// that; the stored ring is then the last 134 positions.
//
// Determinism: every (token, head) is computed alone, with a fixed order of
// operations, so results do not depend on which other tokens are in the batch.
#pragma once

#include <cstdint>
#include <span>

namespace strata::kernels {

constexpr uint32_t kHeadDim = 512;  // = kMainKv.values = kSwaFp8.values

struct SequenceKv {
  const uint8_t* global = nullptr;  // global_count kMainKv entries (288 B)
  uint64_t global_count = 0;
  const uint8_t* ring = nullptr;  // ring_slots kSwaFp8 entries (528 B)
  uint32_t ring_slots = 0;        // must be >= window (134 in the V4.1 layout)
  int64_t replay_start = 0;       // s: local keys before s are invisible
};

struct AttentionArgs {
  uint32_t tokens = 0;
  uint32_t heads = 0;
  uint32_t topk = 0;      // global indices per token
  uint32_t window = 128;  // W
  float softmax_scale = 0;
  const float* q = nullptr;            // tokens x heads x kHeadDim
  const uint32_t* seq = nullptr;       // per token: index into seqs (nullptr: all 0)
  const int64_t* positions = nullptr;  // per token: absolute position i
  const int32_t* topk_idx = nullptr;   // tokens x topk; -1 = none
  std::span<const SequenceKv> seqs;
  float* out = nullptr;  // tokens x heads x kHeadDim
  float* lse = nullptr;  // tokens x heads, natural log; may be null
};

void SparseSwaAttention(const AttentionArgs& args);
void SparseSwaAttentionMasked(const AttentionArgs& args);

// Writes the local key of position `pos` into its ring slot: quantizes
// kHeadDim floats to kSwaFp8.
void WriteRingPosition(uint8_t* ring, uint32_t ring_slots, int64_t pos, const float* key);

}  // namespace strata::kernels

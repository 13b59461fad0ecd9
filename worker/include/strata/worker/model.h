// The mini V4.1 model (DESIGN §9): weights, loading, and the batched
// forward pass over chunks of several sequences.
//
// Per layer l (pre-norm residual blocks):
//   sources produced at l:  entries = Quantize(W_main n(h)), Quantize(W_index n(h))
//                           (stride 2: the mean of two consecutive n(h))
//   attention:  local key k = W_local n(h) -> the layer's FP8 ring;
//               indexer (Full / Reindex / Reuse) -> top-k global entries;
//               o = SparseSwaAttention(W_q n(h), global entries, ring);
//               h += W_o o
//   FFN:        h += MoE(n(h)) with routed top-k experts + a shared expert
// Decoder layers run only on tokens at or after the sequence's decoder
// start (decoder bounded replay); the decoder source is produced from the
// last encoder layer's output for every token.
//
// What the model attends over is exactly the stored form: global entries
// are FP4 bytes, ring positions FP8 bytes, in the cold path as in the warm
// one, so a warm run continuing from stored state is bit-identical.
// Every row is computed alone in a fixed order (kernels and the matmuls
// here), so results do not depend on batch composition or chunking.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "strata/status.h"
#include "strata/worker/model_config.h"
#include "strata/worker/safetensors.h"

namespace strata {
class TaskPool;  // strata/task_pool.h
}  // namespace strata

namespace strata::worker {

struct ExpertTensors {
  std::vector<float> w_gate, w_up, w_down;
};

struct LayerWeights {
  std::vector<float> attn_norm;     // d
  std::vector<float> wq;            // heads*512 x d
  std::vector<float> wlocal;        // 512 x d
  std::vector<float> wo;            // d x heads*512
  std::vector<float> idx_q, idx_w;  // indexer_heads*128 x d, indexer_heads x d (Full/Reindex)
  std::vector<float> ffn_norm;      // d
  std::vector<float> router;        // experts x d
  std::vector<ExpertTensors> experts;
  std::vector<ExpertTensors> shared;  // 0 or 1
};

struct SourceWeights {
  std::vector<float> norm;     // d
  std::vector<float> w_main;   // 512 x d
  std::vector<float> w_index;  // 128 x d
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embed;  // vocab x d
  std::vector<SourceWeights> sources;
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // d
  std::vector<float> lm_head;     // vocab x d
};

// Every tensor a config needs, with its shape, in file order.
std::vector<std::pair<std::string, std::vector<uint64_t>>> ExpectedTensors(const ModelConfig& c);

// Deterministic random weights (same config and seed, same bytes).
SafetensorsFile RandomModelFile(const ModelConfig& config, uint64_t seed);

// Validates the file against the config in its metadata: a wrong dtype,
// shape, missing or extra tensor is an error naming the tensor.
Result<ModelWeights> ModelFromFile(const SafetensorsFile& file);
Result<ModelWeights> LoadModel(const std::string& path);

// ---- forward ---------------------------------------------------------------

// One sequence's model state. Global entries are contiguous per source (the
// engine mirrors them into store blocks); rings hold ring_slots FP8
// positions per layer, position p in slot p % ring_slots.
struct SequenceState {
  std::vector<std::vector<uint8_t>> main;   // per source: entries x 288 B
  std::vector<std::vector<uint8_t>> index;  // per source: entries x 68 B
  std::vector<std::vector<uint8_t>> rings;  // per layer
  std::vector<std::vector<float>> pending;  // stride-2 sources: n(h) of the last even token
  int64_t encoder_replay_start = 0;         // local keys before it are invisible to encoder layers
  int64_t decoder_start = 0;                // decoder layers run from here

  void Init(const ModelConfig& c);
  // Resizes source s to hold `entries` entries (new bytes zero).
  void Reserve(uint32_t s, uint64_t entries);
  uint64_t Entries(uint32_t s) const { return index[s].size() / 68; }
};

struct ForwardItem {
  SequenceState* seq = nullptr;
  std::span<const uint32_t> tokens;  // the tokens of positions [begin, begin + size)
  int64_t begin = 0;
  bool write_global = true;  // false: encoder bounded replay (never overwrites global KV)
  bool run_decoder = true;
  bool want_logits = false;  // logits of the last token
};

struct ForwardHooks {
  // Called before layer l runs (before the sources it produces). Returns
  // false for an item that must leave the batch now (its fetch failed);
  // the item's state is then unspecified and the caller recomputes it.
  std::function<bool(uint32_t layer, size_t item)> before_layer;
};

struct ForwardOptions {
  // Dense-window attention with masking instead of the compact kernel
  // (the bounded-replay reference; bit-identical by the kernels' contract).
  bool masked_attention = false;
  // Threads that share the indexer's full scans (with the calling thread);
  // null: the calling thread alone. Rows are independent: same results.
  TaskPool* pool = nullptr;
};

// Runs the items as one batch. logits: per item with want_logits, vocab
// floats (empty for dropped items or items without logits).
void Forward(const ModelWeights& model, std::span<ForwardItem> items, const ForwardHooks& hooks,
             const ForwardOptions& options, std::vector<std::vector<float>>& logits);

}  // namespace strata::worker

// The mini V4.1 model's shape (DESIGN §9): causal encoder layers then
// decoder layers, every layer with sparse global attention plus a sliding
// window, MoE FFN with routed top-k experts and a shared expert.
//
// Global KV comes from *sources*; each emits one main entry (512 FP4 values)
// and one indexer key (128 FP4 values) every `stride` tokens:
//   encoder.stride1  from the input of encoder layer `producer_layer`
//   encoder.stride2  the mean of two consecutive inputs of its producer layer
//   decoder.stride1  from the output of the last encoder layer
// so the default is (1 + 1/2 + 1) x 356 B = 890 B of global KV per token,
// exactly the store's layout id 1.
//
// Layer kinds (the V4.1 topology):
//   kFull    — runs the indexer over every visible entry of its source
//   kReindex — scores only the candidate pool of an earlier Full layer
//   kReuse   — takes an earlier layer's top-k indices unchanged
// Validate() checks that no layer reads a source or a reference layer that
// is not yet written when it runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::worker {

enum class LayerKind : uint8_t { kFull, kReindex, kReuse };
std::string_view LayerKindName(LayerKind kind);

struct SourceSpec {
  std::string name;
  uint32_t stride = 1;  // 1 or 2
  // Encoder sources: the layer whose (normalized) input produces the
  // entries. The decoder source: the first decoder layer (it is projected
  // from the last encoder layer's output).
  uint32_t producer_layer = 0;
};

struct LayerSpec {
  LayerKind kind = LayerKind::kFull;
  uint32_t source = 0;  // index into ModelConfig::sources
  int32_t ref = -1;     // Reindex: the Full layer; Reuse: the layer whose indices
};

struct ModelConfig {
  uint32_t vocab = 256;  // byte-level tokenizer
  uint32_t d_model = 256;
  uint32_t heads = 1;          // query heads of 512 values (one shared KV head)
  uint32_t indexer_heads = 1;  // indexer query heads of 128 values
  uint32_t encoder_layers = 4;
  uint32_t decoder_layers = 4;
  uint32_t window = 128;      // sliding window W
  uint32_t ring_slots = 134;  // W + 6 speculative slots
  uint32_t experts = 16;
  uint32_t experts_per_token = 2;
  uint32_t shared_experts = 1;  // 0 or 1
  uint32_t expert_hidden = 128;
  uint32_t attention_topk = 64;    // global entries per query
  uint32_t indexer_block = 8;      // entries per pooled indexer block
  uint32_t candidate_blocks = 16;  // the Full layers' candidate pool
  uint32_t block_tokens = 256;     // store block size (layout id 1)
  float norm_eps = 1e-5f;
  std::vector<SourceSpec> sources;
  std::vector<LayerSpec> layers;

  uint32_t Layers() const { return encoder_layers + decoder_layers; }
  bool IsDecoder(uint32_t layer) const { return layer >= encoder_layers; }
  // Bytes of global KV per token, summed over sources.
  double GlobalKvBytesPerToken() const;

  // Checks sizes and the layer topology; errors name the offending layer.
  Status Validate() const;

  // Flat string map, stored in the safetensors __metadata__.
  std::map<std::string, std::string> ToMetadata() const;
  static Result<ModelConfig> FromMetadata(const std::map<std::string, std::string>& meta);
};

// The default: d_model 256, 4 + 4 layers, W 128 / 134 slots, 16
// experts top-2 + 1 shared, sources at stride 1, 2 and decoder stride 1.
// Topology: L0 Full(enc.s1), L1 Reindex(L0), L2 Full(enc.s2), L3 Reuse(L2),
// L4 Full(dec), L5 Reindex(L4), L6 Reuse(L5), L7 Reuse(L4).
ModelConfig DefaultModelConfig();

// A smaller model with the same topology and state formats, for fast tests.
ModelConfig TinyModelConfig();

}  // namespace strata::worker

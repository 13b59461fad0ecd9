#include "strata/worker/model_config.h"

#include <charconv>

#include "strata/kernels/attention.h"
#include "strata/kernels/formats.h"

namespace strata::worker {
namespace {

constexpr uint32_t kMaxDim = 1u << 16;

Status LayerError(uint32_t l, const std::string& why) {
  return InvalidArgument("model config: layer " + std::to_string(l) + ": " + why);
}

Result<uint32_t> ParseU32(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) return InvalidArgument("model metadata lacks '" + key + "'");
  uint32_t v = 0;
  const char* end = it->second.data() + it->second.size();
  auto [p, ec] = std::from_chars(it->second.data(), end, v);
  if (ec != std::errc() || p != end) {
    return InvalidArgument("model metadata '" + key + "' is not an unsigned integer: '" +
                           it->second + "'");
  }
  return v;
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFull:
      return "full";
    case LayerKind::kReindex:
      return "reindex";
    case LayerKind::kReuse:
      return "reuse";
  }
  return "unknown";
}

double ModelConfig::GlobalKvBytesPerToken() const {
  const double entry = kernels::kMainKv.Bytes() + kernels::kIndexerKey.Bytes();
  double total = 0;
  for (const SourceSpec& s : sources) total += entry / s.stride;
  return total;
}

Status ModelConfig::Validate() const {
  if (vocab == 0 || vocab > kMaxDim) return InvalidArgument("model config: vocab out of range");
  if (d_model == 0 || d_model % 8 != 0 || d_model > kMaxDim) {
    return InvalidArgument("model config: d_model must be a positive multiple of 8");
  }
  if (heads == 0 || heads > 64 || indexer_heads == 0 || indexer_heads > 64) {
    return InvalidArgument("model config: heads and indexer_heads must be 1..64");
  }
  // Each checked on its own: their uint32 sum (Layers()) could wrap.
  if (encoder_layers == 0 || decoder_layers == 0 || encoder_layers > 64 || decoder_layers > 64 ||
      Layers() > 64) {
    return InvalidArgument("model config: needs 1+ encoder and 1+ decoder layers, 64 at most");
  }
  if (window == 0 || window > kMaxDim || ring_slots <= window || ring_slots > 2 * kMaxDim) {
    return InvalidArgument("model config: ring_slots must exceed the window (1..65536)");
  }
  if (experts == 0 || experts > 256 || experts_per_token == 0 || experts_per_token > experts ||
      shared_experts > 1 || expert_hidden == 0 || expert_hidden > kMaxDim) {
    return InvalidArgument("model config: bad expert sizes");
  }
  // Bounded so that per-row buffers (rows x top-k, the candidate pool) stay
  // small; the product in 64 bits.
  if (indexer_block == 0 || indexer_block > 1024 || candidate_blocks == 0 ||
      candidate_blocks > 4096) {
    return InvalidArgument("model config: indexer_block 1..1024, candidate_blocks 1..4096");
  }
  if (attention_topk == 0 ||
      uint64_t{attention_topk} > uint64_t{indexer_block} * candidate_blocks) {
    return InvalidArgument(
        "model config: attention_topk must be 1..indexer_block x candidate_blocks");
  }
  if (block_tokens == 0 || block_tokens % 2 != 0 || block_tokens > kMaxDim) {
    return InvalidArgument("model config: block_tokens must be even, 65536 at most");
  }
  if (sources.empty() || sources.size() > 8) return InvalidArgument("model config: 1..8 sources");
  for (const SourceSpec& src : sources) {
    if (src.stride != 1 && src.stride != 2) {
      return InvalidArgument("model config: source '" + src.name + "' stride must be 1 or 2");
    }
    if (src.producer_layer > encoder_layers) {
      return InvalidArgument("model config: source '" + src.name +
                             "' is produced after the first decoder layer");
    }
    if (src.producer_layer == encoder_layers && src.stride != 1) {
      return InvalidArgument("model config: the decoder source '" + src.name +
                             "' must have stride 1");
    }
  }
  if (layers.size() != Layers()) {
    return InvalidArgument("model config: " + std::to_string(layers.size()) + " layer specs for " +
                           std::to_string(Layers()) + " layers");
  }
  std::vector<bool> consumed(sources.size(), false);
  for (uint32_t l = 0; l < Layers(); ++l) {
    const LayerSpec& spec = layers[l];
    if (spec.source >= sources.size()) return LayerError(l, "unknown source");
    const SourceSpec& src = sources[spec.source];
    // The source's entries for a token are written when its producer runs
    // on that token; a layer before the producer would read unwritten KV.
    if (l < src.producer_layer) {
      return LayerError(l, "reads source '" + src.name + "' before its producer layer " +
                               std::to_string(src.producer_layer) + " writes it");
    }
    // An encoder layer must not read the decoder source, and a decoder
    // layer runs on a subset of the tokens, so references stay in-stack.
    if (!IsDecoder(l) && src.producer_layer >= encoder_layers) {
      return LayerError(l, "an encoder layer cannot read the decoder source");
    }
    consumed[spec.source] = true;
    if (spec.kind == LayerKind::kFull) {
      if (spec.ref != -1) return LayerError(l, "a full layer takes no reference layer");
      continue;
    }
    if (spec.ref < 0 || static_cast<uint32_t>(spec.ref) >= l) {
      return LayerError(l,
                        std::string(LayerKindName(spec.kind)) + " must reference an earlier layer");
    }
    const uint32_t ref = static_cast<uint32_t>(spec.ref);
    if (IsDecoder(ref) != IsDecoder(l)) {
      return LayerError(l, "references layer " + std::to_string(ref) + " of the other stack");
    }
    if (layers[ref].source != spec.source) {
      return LayerError(l, "references layer " + std::to_string(ref) + " of another source");
    }
    if (spec.kind == LayerKind::kReindex && layers[ref].kind != LayerKind::kFull) {
      return LayerError(l, "reindex must reference a full layer (its candidate pool)");
    }
  }
  for (size_t s = 0; s < sources.size(); ++s) {
    if (!consumed[s])
      return InvalidArgument("model config: source '" + sources[s].name + "' is read by no layer");
  }
  return Status::Ok();
}

std::map<std::string, std::string> ModelConfig::ToMetadata() const {
  std::map<std::string, std::string> m;
  auto put = [&m](const std::string& k, uint32_t v) { m[k] = std::to_string(v); };
  m["format"] = "strata-mini-v41/1";
  put("vocab", vocab);
  put("d_model", d_model);
  put("heads", heads);
  put("indexer_heads", indexer_heads);
  put("encoder_layers", encoder_layers);
  put("decoder_layers", decoder_layers);
  put("window", window);
  put("ring_slots", ring_slots);
  put("experts", experts);
  put("experts_per_token", experts_per_token);
  put("shared_experts", shared_experts);
  put("expert_hidden", expert_hidden);
  put("attention_topk", attention_topk);
  put("indexer_block", indexer_block);
  put("candidate_blocks", candidate_blocks);
  put("block_tokens", block_tokens);
  put("sources", static_cast<uint32_t>(sources.size()));
  for (size_t s = 0; s < sources.size(); ++s) {
    const std::string p = "source." + std::to_string(s) + ".";
    m[p + "name"] = sources[s].name;
    put(p + "stride", sources[s].stride);
    put(p + "producer_layer", sources[s].producer_layer);
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string p = "layer." + std::to_string(l) + ".";
    put(p + "kind", static_cast<uint32_t>(layers[l].kind));
    put(p + "source", layers[l].source);
    m[p + "ref"] = std::to_string(layers[l].ref);
  }
  return m;
}

Result<ModelConfig> ModelConfig::FromMetadata(const std::map<std::string, std::string>& meta) {
  auto fmt = meta.find("format");
  if (fmt == meta.end() || fmt->second != "strata-mini-v41/1") {
    return InvalidArgument("model metadata: format is not 'strata-mini-v41/1'");
  }
  ModelConfig c;
  struct Field {
    const char* key;
    uint32_t* dst;
  };
  const Field fields[] = {{"vocab", &c.vocab},
                          {"d_model", &c.d_model},
                          {"heads", &c.heads},
                          {"indexer_heads", &c.indexer_heads},
                          {"encoder_layers", &c.encoder_layers},
                          {"decoder_layers", &c.decoder_layers},
                          {"window", &c.window},
                          {"ring_slots", &c.ring_slots},
                          {"experts", &c.experts},
                          {"experts_per_token", &c.experts_per_token},
                          {"shared_experts", &c.shared_experts},
                          {"expert_hidden", &c.expert_hidden},
                          {"attention_topk", &c.attention_topk},
                          {"indexer_block", &c.indexer_block},
                          {"candidate_blocks", &c.candidate_blocks},
                          {"block_tokens", &c.block_tokens}};
  for (const Field& f : fields) {
    Result<uint32_t> v = ParseU32(meta, f.key);
    if (!v.ok()) return v.status();
    *f.dst = *v;
  }
  Result<uint32_t> nsrc = ParseU32(meta, "sources");
  if (!nsrc.ok()) return nsrc.status();
  if (*nsrc > 8) return InvalidArgument("model metadata: too many sources");
  for (uint32_t s = 0; s < *nsrc; ++s) {
    const std::string p = "source." + std::to_string(s) + ".";
    SourceSpec src;
    auto name = meta.find(p + "name");
    if (name == meta.end()) return InvalidArgument("model metadata lacks '" + p + "name'");
    src.name = name->second;
    Result<uint32_t> stride = ParseU32(meta, p + "stride");
    if (!stride.ok()) return stride.status();
    Result<uint32_t> producer = ParseU32(meta, p + "producer_layer");
    if (!producer.ok()) return producer.status();
    src.stride = *stride;
    src.producer_layer = *producer;
    c.sources.push_back(std::move(src));
  }
  if (c.encoder_layers > 64 || c.decoder_layers > 64 || c.Layers() > 64) {
    return InvalidArgument("model metadata: too many layers");
  }
  for (uint32_t l = 0; l < c.Layers(); ++l) {
    const std::string p = "layer." + std::to_string(l) + ".";
    Result<uint32_t> kind = ParseU32(meta, p + "kind");
    if (!kind.ok()) return kind.status();
    if (*kind > 2) return InvalidArgument("model metadata: bad '" + p + "kind'");
    Result<uint32_t> source = ParseU32(meta, p + "source");
    if (!source.ok()) return source.status();
    auto ref = meta.find(p + "ref");
    if (ref == meta.end()) return InvalidArgument("model metadata lacks '" + p + "ref'");
    int32_t r = 0;
    const char* end = ref->second.data() + ref->second.size();
    auto [ptr, ec] = std::from_chars(ref->second.data(), end, r);
    if (ec != std::errc() || ptr != end) {
      return InvalidArgument("model metadata: bad '" + p + "ref'");
    }
    c.layers.push_back({static_cast<LayerKind>(*kind), *source, r});
  }
  STRATA_RETURN_IF_ERROR(c.Validate());
  return c;
}

ModelConfig DefaultModelConfig() {
  ModelConfig c;
  c.sources = {{"encoder.stride1", 1, 0}, {"encoder.stride2", 2, 2}, {"decoder.stride1", 1, 4}};
  c.layers = {{LayerKind::kFull, 0, -1}, {LayerKind::kReindex, 0, 0}, {LayerKind::kFull, 1, -1},
              {LayerKind::kReuse, 1, 2}, {LayerKind::kFull, 2, -1},   {LayerKind::kReindex, 2, 4},
              {LayerKind::kReuse, 2, 5}, {LayerKind::kReuse, 2, 4}};
  return c;
}

ModelConfig TinyModelConfig() {
  ModelConfig c = DefaultModelConfig();
  c.d_model = 64;
  c.experts = 4;
  c.expert_hidden = 32;
  c.attention_topk = 16;
  c.candidate_blocks = 4;
  return c;
}

}  // namespace strata::worker

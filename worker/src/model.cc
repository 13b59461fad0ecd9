#include "strata/worker/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "linalg.h"
#include "strata/kernels/attention.h"
#include "strata/kernels/formats.h"
#include "strata/kernels/indexer.h"
#include "strata/kernels/moe.h"
#include "strata/task_pool.h"

namespace strata::worker {
namespace {

using kernels::kHeadDim;
using kernels::kIndexerDim;
constexpr uint32_t kMainBytes = kernels::kMainKv.Bytes();
constexpr uint32_t kIndexBytes = kernels::kIndexerKey.Bytes();
constexpr uint32_t kSlotBytes = kernels::kSwaFp8.Bytes();

std::string LayerName(uint32_t l) { return "layers." + std::to_string(l) + "."; }
std::string SourceName(uint32_t s) { return "sources." + std::to_string(s) + "."; }

bool HasIndexer(const LayerSpec& spec) { return spec.kind != LayerKind::kReuse; }

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<uint64_t>>> ExpectedTensors(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> t;
  const uint64_t d = c.d_model;
  t.push_back({"embed", {c.vocab, d}});
  for (uint32_t s = 0; s < c.sources.size(); ++s) {
    t.push_back({SourceName(s) + "norm", {d}});
    t.push_back({SourceName(s) + "w_main", {kHeadDim, d}});
    t.push_back({SourceName(s) + "w_index", {kIndexerDim, d}});
  }
  for (uint32_t l = 0; l < c.Layers(); ++l) {
    const std::string p = LayerName(l);
    t.push_back({p + "attn_norm", {d}});
    t.push_back({p + "wq", {uint64_t{c.heads} * kHeadDim, d}});
    t.push_back({p + "wlocal", {kHeadDim, d}});
    t.push_back({p + "wo", {d, uint64_t{c.heads} * kHeadDim}});
    if (HasIndexer(c.layers[l])) {
      t.push_back({p + "idx_q", {uint64_t{c.indexer_heads} * kIndexerDim, d}});
      t.push_back({p + "idx_w", {c.indexer_heads, d}});
    }
    t.push_back({p + "ffn_norm", {d}});
    t.push_back({p + "router", {c.experts, d}});
    auto expert = [&](const std::string& e) {
      t.push_back({e + "w_gate", {c.expert_hidden, d}});
      t.push_back({e + "w_up", {c.expert_hidden, d}});
      t.push_back({e + "w_down", {d, c.expert_hidden}});
    };
    for (uint32_t e = 0; e < c.experts; ++e) expert(p + "experts." + std::to_string(e) + ".");
    for (uint32_t e = 0; e < c.shared_experts; ++e) expert(p + "shared." + std::to_string(e) + ".");
  }
  t.push_back({"final_norm", {d}});
  t.push_back({"lm_head", {c.vocab, d}});
  return t;
}

SafetensorsFile RandomModelFile(const ModelConfig& config, uint64_t seed) {
  SafetensorsFile file;
  file.metadata = config.ToMetadata();
  file.metadata["seed"] = std::to_string(seed);
  for (auto& [name, shape] : ExpectedTensors(config)) {
    Tensor t;
    t.shape = shape;
    t.data.resize(t.Elements());
    const bool is_norm = name.ends_with("norm");
    if (is_norm) {
      std::fill(t.data.begin(), t.data.end(), 1.0f);
    } else {
      // Uniform with variance 1/fan_in (embeddings: variance 1).
      const double fan_in = name == "embed" ? 3.0 : static_cast<double>(shape.back());
      const double a = std::sqrt(3.0 / fan_in);
      uint64_t state = seed ^ HashName(name);
      for (float& v : t.data) {
        const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
        v = static_cast<float>((2.0 * u - 1.0) * a);
      }
    }
    file.tensors.emplace(name, std::move(t));
  }
  return file;
}

Result<ModelWeights> ModelFromFile(const SafetensorsFile& file) {
  Result<ModelConfig> config = ModelConfig::FromMetadata(file.metadata);
  if (!config.ok()) return config.status();
  const ModelConfig& c = *config;
  const auto expected = ExpectedTensors(c);
  std::map<std::string, const std::vector<float>*> found;
  for (const auto& [name, shape] : expected) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) {
      return InvalidArgument("model: tensor '" + name + "' is missing");
    }
    if (it->second.dtype != "F32") {
      return InvalidArgument("model: tensor '" + name + "' has dtype " + it->second.dtype +
                             ", expected F32");
    }
    if (it->second.shape != shape) {
      auto str = [](const std::vector<uint64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
        return out + "]";
      };
      return InvalidArgument("model: tensor '" + name + "' has shape " + str(it->second.shape) +
                             ", expected " + str(shape));
    }
    found[name] = &it->second.data;
  }
  if (file.tensors.size() != expected.size()) {
    for (const auto& [name, t] : file.tensors) {
      if (!found.count(name)) return InvalidArgument("model: unexpected tensor '" + name + "'");
    }
  }
  auto get = [&found](const std::string& name) { return *found.at(name); };
  ModelWeights w;
  w.config = c;
  w.embed = get("embed");
  for (uint32_t s = 0; s < c.sources.size(); ++s) {
    w.sources.push_back({get(SourceName(s) + "norm"), get(SourceName(s) + "w_main"),
                         get(SourceName(s) + "w_index")});
  }
  for (uint32_t l = 0; l < c.Layers(); ++l) {
    const std::string p = LayerName(l);
    LayerWeights lw;
    lw.attn_norm = get(p + "attn_norm");
    lw.wq = get(p + "wq");
    lw.wlocal = get(p + "wlocal");
    lw.wo = get(p + "wo");
    if (HasIndexer(c.layers[l])) {
      lw.idx_q = get(p + "idx_q");
      lw.idx_w = get(p + "idx_w");
    }
    lw.ffn_norm = get(p + "ffn_norm");
    lw.router = get(p + "router");
    auto expert = [&](const std::string& e) {
      return ExpertTensors{get(e + "w_gate"), get(e + "w_up"), get(e + "w_down")};
    };
    for (uint32_t e = 0; e < c.experts; ++e) {
      lw.experts.push_back(expert(p + "experts." + std::to_string(e) + "."));
    }
    for (uint32_t e = 0; e < c.shared_experts; ++e) {
      lw.shared.push_back(expert(p + "shared." + std::to_string(e) + "."));
    }
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = get("final_norm");
  w.lm_head = get("lm_head");
  for (const auto& [name, data] : found) {
    for (float v : *data) {
      if (!std::isfinite(v)) return InvalidArgument("model: tensor '" + name + "' holds NaN/Inf");
    }
  }
  return w;
}

Result<ModelWeights> LoadModel(const std::string& path) {
  Result<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  Result<ModelWeights> w = ModelFromFile(*file);
  if (!w.ok()) return Status(w.status().code(), "'" + path + "': " + w.status().message());
  return w;
}

// ---- state -------------------------------------------------------------------

void SequenceState::Init(const ModelConfig& c) {
  main.assign(c.sources.size(), {});
  index.assign(c.sources.size(), {});
  pending.assign(c.sources.size(), {});
  rings.assign(c.Layers(), std::vector<uint8_t>(size_t{c.ring_slots} * kSlotBytes, 0));
  encoder_replay_start = 0;
  decoder_start = 0;
}

void SequenceState::Reserve(uint32_t s, uint64_t entries) {
  if (Entries(s) >= entries) return;
  main[s].resize(entries * kMainBytes, 0);
  index[s].resize(entries * kIndexBytes, 0);
}

// ---- forward -----------------------------------------------------------------

namespace {

struct Row {
  uint32_t item;
  int64_t pos;
};

// Per-item scratch ring for one layer: wide enough for the item's chunk
// (the kernel's contract: W + c - 1 slots at least).
struct ScratchRing {
  std::vector<uint8_t> bytes;
  uint32_t slots = 0;
};

void LoadScratch(const std::vector<uint8_t>& ring, uint32_t ring_slots, int64_t first,
                 int64_t count, ScratchRing& s) {
  s.slots = ring_slots + static_cast<uint32_t>(count);
  s.bytes.assign(size_t{s.slots} * kSlotBytes, 0);
  for (int64_t p = std::max<int64_t>(0, first - ring_slots); p < first; ++p) {
    std::memcpy(&s.bytes[(p % s.slots) * kSlotBytes], &ring[(p % ring_slots) * kSlotBytes],
                kSlotBytes);
  }
}

void StoreScratch(const ScratchRing& s, int64_t end, uint32_t ring_slots,
                  std::vector<uint8_t>& ring) {
  for (int64_t p = std::max<int64_t>(0, end - ring_slots); p < end; ++p) {
    std::memcpy(&ring[(p % ring_slots) * kSlotBytes], &s.bytes[(p % s.slots) * kSlotBytes],
                kSlotBytes);
  }
}

class ForwardPass {
 public:
  ForwardPass(const ModelWeights& m, std::span<ForwardItem> items, const ForwardHooks& hooks,
              const ForwardOptions& opt)
      : m_(m), c_(m.config), items_(items), hooks_(hooks), opt_(opt), alive_(items.size(), true) {}

  void Run(std::vector<std::vector<float>>& logits) {
    const uint32_t d = c_.d_model;
    for (uint32_t it = 0; it < items_.size(); ++it) {
      for (size_t j = 0; j < items_[it].tokens.size(); ++j) {
        rows_.push_back({it, items_[it].begin + static_cast<int64_t>(j)});
      }
    }
    h_.resize(rows_.size() * d);
    for (size_t r = 0; r < rows_.size(); ++r) {
      const ForwardItem& item = items_[rows_[r].item];
      const uint32_t tok = item.tokens[static_cast<size_t>(rows_[r].pos - item.begin)];
      std::memcpy(&h_[r * d], &m_.embed[size_t{tok} * d], d * sizeof(float));
    }
    topk_.assign(c_.Layers(), {});
    candidates_.assign(c_.Layers(), {});
    for (uint32_t l = 0; l < c_.Layers(); ++l) {
      for (uint32_t it = 0; it < items_.size(); ++it) {
        if (alive_[it] && hooks_.before_layer && !hooks_.before_layer(l, it)) alive_[it] = false;
      }
      for (uint32_t s = 0; s < c_.sources.size(); ++s) {
        if (c_.sources[s].producer_layer == l) ProduceSource(s);
      }
      RunLayer(l);
    }
    logits.assign(items_.size(), {});
    for (size_t r = 0; r < rows_.size(); ++r) {
      const ForwardItem& item = items_[rows_[r].item];
      const bool last = rows_[r].pos == item.begin + static_cast<int64_t>(item.tokens.size()) - 1;
      if (!last || !item.want_logits || !alive_[rows_[r].item]) continue;
      std::vector<float> hn(d);
      RmsNorm(&h_[r * d], 1, d, m_.final_norm.data(), c_.norm_eps, hn.data());
      logits[rows_[r].item].resize(c_.vocab);
      Linear(hn.data(), 1, d, m_.lm_head.data(), c_.vocab, logits[rows_[r].item].data());
    }
  }

 private:
  // The rows a layer runs on: every live row for encoder layers; decoder
  // layers only rows at or after their sequence's decoder start.
  std::vector<uint32_t> ActiveRows(uint32_t l) const {
    std::vector<uint32_t> out;
    for (uint32_t r = 0; r < rows_.size(); ++r) {
      const ForwardItem& item = items_[rows_[r].item];
      if (!alive_[rows_[r].item]) continue;
      if (c_.IsDecoder(l) && (!item.run_decoder || rows_[r].pos < item.seq->decoder_start)) {
        continue;
      }
      out.push_back(r);
    }
    return out;
  }

  void Gather(const std::vector<uint32_t>& rows, std::vector<float>& x) const {
    const uint32_t d = c_.d_model;
    x.resize(rows.size() * d);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(&x[i * d], &h_[size_t{rows[i]} * d], d * sizeof(float));
    }
  }

  void ProduceSource(uint32_t s) {
    const uint32_t d = c_.d_model;
    const SourceSpec& spec = c_.sources[s];
    const SourceWeights& w = m_.sources[s];
    std::vector<uint32_t> rows;
    for (uint32_t r = 0; r < rows_.size(); ++r) {
      if (alive_[rows_[r].item] && items_[rows_[r].item].write_global) rows.push_back(r);
    }
    if (rows.empty()) return;
    std::vector<float> x, xn(rows.size() * d);
    Gather(rows, x);
    RmsNorm(x.data(), rows.size(), d, w.norm.data(), c_.norm_eps, xn.data());
    std::vector<float> in(d), main(kHeadDim), idx(kIndexerDim);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows_[rows[i]];
      SequenceState& seq = *items_[row.item].seq;
      const float* cur = &xn[i * d];
      if (spec.stride == 2) {
        if (row.pos % 2 == 0) {
          seq.pending[s].assign(cur, cur + d);  // waits for its odd partner
          continue;
        }
        const bool prev_here = i > 0 && rows_[rows[i - 1]].item == row.item;
        const float* prev = prev_here ? &xn[(i - 1) * d] : seq.pending[s].data();
        for (uint32_t k = 0; k < d; ++k) in[k] = (prev[k] + cur[k]) * 0.5f;
        seq.pending[s].clear();
      } else {
        std::copy(cur, cur + d, in.begin());
      }
      const uint64_t e = static_cast<uint64_t>(row.pos) / spec.stride;
      seq.Reserve(s, e + 1);
      Linear(in.data(), 1, d, w.w_main.data(), kHeadDim, main.data());
      Linear(in.data(), 1, d, w.w_index.data(), kIndexerDim, idx.data());
      kernels::Quantize(kernels::kMainKv, main.data(), 1, &seq.main[s][e * kMainBytes]);
      kernels::Quantize(kernels::kIndexerKey, idx.data(), 1, &seq.index[s][e * kIndexBytes]);
    }
  }

  // One layer's rows and what its steps hand on, in RunLayer's order.
  struct LayerRows {
    std::vector<uint32_t> rows;  // ActiveRows
    size_t n = 0;                // rows.size()
    std::vector<float> x, xn, y;
    std::vector<uint32_t> item_of_row, items;
    std::vector<int64_t> positions;
    std::vector<ScratchRing> scratch;     // per item
    std::vector<int64_t> end;             // per item: past its last row's position
    std::vector<kernels::SequenceKv> kv;  // per item
    std::vector<int32_t> topk;            // per row
  };

  void RunLayer(uint32_t l) {
    LayerRows lr;
    lr.rows = ActiveRows(l);
    if (lr.rows.empty()) return;
    lr.n = lr.rows.size();
    NormRows(l, lr);
    LoadLocalKeys(l, lr);
    SelectTopk(l, lr);
    Attend(l, lr);
    MoeFfn(l, lr);
  }

  // The layer's input normed for attention, and its items.
  void NormRows(uint32_t l, LayerRows& lr) const {
    const std::vector<uint32_t>& rows = lr.rows;
    const uint32_t d = c_.d_model;
    const size_t n = lr.n;
    const LayerWeights& w = m_.layers[l];
    std::vector<float>& x = lr.x;
    std::vector<float>& xn = lr.xn;
    xn.resize(n * d);
    Gather(rows, x);
    RmsNorm(x.data(), n, d, w.attn_norm.data(), c_.norm_eps, xn.data());

    // Items in this layer, in row order; rows of one item are contiguous.
    std::vector<uint32_t>& item_of_row = lr.item_of_row;
    std::vector<uint32_t>& items = lr.items;
    std::vector<int64_t>& positions = lr.positions;
    item_of_row.resize(n);
    positions.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const Row& row = rows_[rows[i]];
      if (items.empty() || items.back() != row.item) items.push_back(row.item);
      item_of_row[i] = static_cast<uint32_t>(items.size() - 1);
      positions[i] = row.pos;
    }
  }

  // Local keys into per-item scratch rings.
  void LoadLocalKeys(uint32_t l, LayerRows& lr) const {
    const uint32_t d = c_.d_model;
    const size_t n = lr.n;
    const LayerWeights& w = m_.layers[l];
    const std::vector<float>& xn = lr.xn;
    const std::vector<uint32_t>& item_of_row = lr.item_of_row;
    const std::vector<uint32_t>& items = lr.items;
    const std::vector<int64_t>& positions = lr.positions;
    std::vector<float> klocal(n * kHeadDim);
    Linear(xn.data(), n, d, w.wlocal.data(), kHeadDim, klocal.data());
    std::vector<ScratchRing>& scratch = lr.scratch;
    std::vector<int64_t>& end = lr.end;
    scratch.resize(items.size());
    std::vector<int64_t> first(items.size(), -1);
    end.assign(items.size(), 0);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t k = item_of_row[i];
      if (first[k] < 0) first[k] = positions[i];
      end[k] = positions[i] + 1;
    }
    for (size_t k = 0; k < items.size(); ++k) {
      LoadScratch(items_[items[k]].seq->rings[l], c_.ring_slots, first[k], end[k] - first[k],
                  scratch[k]);
    }
    for (size_t i = 0; i < n; ++i) {
      ScratchRing& s = scratch[item_of_row[i]];
      kernels::WriteRingPosition(s.bytes.data(), s.slots, positions[i], &klocal[i * kHeadDim]);
    }
  }

  // Indexer: visible entries of the layer's source for each row (the same
  // entries, with the scratch rings, are what attention reads), and each
  // row's top-k of them.
  void SelectTopk(uint32_t l, LayerRows& lr) {
    const std::vector<uint32_t>& rows = lr.rows;
    const uint32_t d = c_.d_model;
    const size_t n = lr.n;
    const LayerSpec& spec = c_.layers[l];
    const LayerWeights& w = m_.layers[l];
    const uint32_t src = spec.source;
    const uint32_t stride = c_.sources[src].stride;
    const bool decoder = c_.IsDecoder(l);
    const std::vector<float>& xn = lr.xn;
    const std::vector<uint32_t>& item_of_row = lr.item_of_row;
    const std::vector<uint32_t>& items = lr.items;
    const std::vector<int64_t>& positions = lr.positions;
    const std::vector<ScratchRing>& scratch = lr.scratch;
    std::vector<kernels::SequenceKv>& kv = lr.kv;
    std::vector<int32_t>& topk = lr.topk;
    std::vector<kernels::IndexerKeys> keys(items.size());
    kv.resize(items.size());
    for (size_t k = 0; k < items.size(); ++k) {
      const SequenceState& seq = *items_[items[k]].seq;
      keys[k] = {seq.index[src].data(), seq.Entries(src)};
      kv[k].global = seq.main[src].data();
      kv[k].global_count = seq.Entries(src);
      kv[k].ring = scratch[k].bytes.data();
      kv[k].ring_slots = scratch[k].slots;
      kv[k].replay_start = decoder ? seq.decoder_start : seq.encoder_replay_start;
    }
    std::vector<uint64_t> visible(n);
    for (size_t i = 0; i < n; ++i) visible[i] = static_cast<uint64_t>(positions[i] + 1) / stride;

    const uint32_t k_top = c_.attention_topk;
    const kernels::IndexerConfig icfg{c_.indexer_block, c_.candidate_blocks, k_top};
    std::vector<int32_t>& topk_all = topk_[l];
    topk_all.assign(rows_.size() * k_top, -1);
    topk.resize(n * k_top);
    if (spec.kind == LayerKind::kReuse) {
      const std::vector<int32_t>& ref = topk_[spec.ref];
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&topk[i * k_top], &ref[size_t{rows[i]} * k_top], k_top * sizeof(int32_t));
      }
    } else {
      const uint32_t ih = c_.indexer_heads;
      std::vector<float> iq(n * ih * kIndexerDim), iw(n * ih);
      Linear(xn.data(), n, d, w.idx_q.data(), ih * kIndexerDim, iq.data());
      Linear(xn.data(), n, d, w.idx_w.data(), ih, iw.data());
      kernels::IndexerArgs ia;
      ia.tokens = static_cast<uint32_t>(n);
      ia.heads = ih;
      ia.q = iq.data();
      ia.weights = iw.data();
      ia.seq = item_of_row.data();
      ia.visible = visible.data();
      ia.seqs = keys;
      const uint32_t cb = c_.candidate_blocks;
      if (spec.kind == LayerKind::kFull) {
        std::vector<int32_t> cand(n * cb);
        SelectFull(ia, icfg, cand.data(), topk.data());
        candidates_[l].assign(rows_.size() * cb, -1);
        for (size_t i = 0; i < n; ++i) {
          std::memcpy(&candidates_[l][size_t{rows[i]} * cb], &cand[i * cb], cb * sizeof(int32_t));
        }
      } else {
        std::vector<int32_t> cand(n * cb);
        const std::vector<int32_t>& ref = candidates_[spec.ref];
        for (size_t i = 0; i < n; ++i) {
          std::memcpy(&cand[i * cb], &ref[size_t{rows[i]} * cb], cb * sizeof(int32_t));
        }
        kernels::IndexerReindex(ia, icfg, cand.data(), topk.data());
      }
    }
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(&topk_all[size_t{rows[i]} * k_top], &topk[i * k_top], k_top * sizeof(int32_t));
    }
  }

  // Attention.
  void Attend(uint32_t l, LayerRows& lr) {
    const std::vector<uint32_t>& rows = lr.rows;
    const uint32_t d = c_.d_model;
    const size_t n = lr.n;
    const LayerWeights& w = m_.layers[l];
    const std::vector<float>& xn = lr.xn;
    const std::vector<uint32_t>& item_of_row = lr.item_of_row;
    const std::vector<uint32_t>& items = lr.items;
    const std::vector<int64_t>& positions = lr.positions;
    const std::vector<ScratchRing>& scratch = lr.scratch;
    const std::vector<int64_t>& end = lr.end;
    const std::vector<kernels::SequenceKv>& kv = lr.kv;
    const std::vector<int32_t>& topk = lr.topk;
    std::vector<float>& y = lr.y;
    const uint32_t k_top = c_.attention_topk;
    const uint32_t qd = c_.heads * kHeadDim;
    std::vector<float> q(n * qd), o(n * qd);
    y.resize(n * d);
    Linear(xn.data(), n, d, w.wq.data(), qd, q.data());
    kernels::AttentionArgs aa;
    aa.tokens = static_cast<uint32_t>(n);
    aa.heads = c_.heads;
    aa.topk = k_top;
    aa.window = c_.window;
    aa.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    aa.q = q.data();
    aa.seq = item_of_row.data();
    aa.positions = positions.data();
    aa.topk_idx = topk.data();
    aa.seqs = kv;
    aa.out = o.data();
    if (opt_.masked_attention) {
      kernels::SparseSwaAttentionMasked(aa);
    } else {
      kernels::SparseSwaAttention(aa);
    }
    Linear(o.data(), n, qd, w.wo.data(), d, y.data());
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t k = 0; k < d; ++k) h_[size_t{rows[i]} * d + k] += y[i * d + k];
    }
    for (size_t k = 0; k < items.size(); ++k) {
      StoreScratch(scratch[k], end[k], c_.ring_slots, items_[items[k]].seq->rings[l]);
    }
  }

  // MoE FFN.
  void MoeFfn(uint32_t l, LayerRows& lr) {
    const std::vector<uint32_t>& rows = lr.rows;
    const uint32_t d = c_.d_model;
    const size_t n = lr.n;
    const LayerWeights& w = m_.layers[l];
    std::vector<float>& x = lr.x;
    std::vector<float>& xn = lr.xn;
    std::vector<float>& y = lr.y;
    Gather(rows, x);
    RmsNorm(x.data(), n, d, w.ffn_norm.data(), c_.norm_eps, xn.data());
    const kernels::RouterConfig rc{c_.experts, c_.experts_per_token, kernels::RouterScore::kSoftmax,
                                   true, 1.0f};
    std::vector<int32_t> ids(n * rc.topk);
    std::vector<float> gates(n * rc.topk);
    kernels::Route(rc, xn.data(), static_cast<uint32_t>(n), d, w.router.data(), nullptr, ids.data(),
                   gates.data());
    std::vector<kernels::ExpertWeights> experts;
    for (const ExpertTensors& e : w.experts) {
      experts.push_back({e.w_gate.data(), e.w_up.data(), e.w_down.data(), c_.expert_hidden});
    }
    kernels::ExpertWeights shared;
    if (!w.shared.empty()) {
      shared = {w.shared[0].w_gate.data(), w.shared[0].w_up.data(), w.shared[0].w_down.data(),
                c_.expert_hidden};
    }
    kernels::MoeArgs ma;
    ma.tokens = static_cast<uint32_t>(n);
    ma.d_model = d;
    ma.topk = rc.topk;
    ma.x = xn.data();
    ma.expert_ids = ids.data();
    ma.gates = gates.data();
    ma.experts = experts;
    ma.shared = w.shared.empty() ? nullptr : &shared;
    ma.out = y.data();
    kernels::MoeForward(ma);
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t k = 0; k < d; ++k) h_[size_t{rows[i]} * d + k] += y[i * d + k];
    }
  }

  const ModelWeights& m_;
  const ModelConfig& c_;
  std::span<ForwardItem> items_;
  const ForwardHooks& hooks_;
  // The indexer's full scan is the one kernel whose cost grows with the
  // context (every visible key for every row: quadratic over a cold
  // prefill), so its rows are split across the pool's threads.
  void SelectFull(const kernels::IndexerArgs& ia, const kernels::IndexerConfig& icfg,
                  int32_t* candidates, int32_t* topk) const {
    constexpr uint32_t kMinRowsPerPart = 16;
    const size_t parts = opt_.pool == nullptr ? 1
                                              : std::min<size_t>(opt_.pool->threads() + 1,
                                                                 ia.tokens / kMinRowsPerPart);
    if (parts <= 1) {
      kernels::IndexerSelectFull(ia, icfg, candidates, topk);
      return;
    }
    std::vector<std::function<void()>> tasks;
    for (size_t p = 0; p < parts; ++p) {
      const uint32_t lo = static_cast<uint32_t>(ia.tokens * p / parts);
      const uint32_t hi = static_cast<uint32_t>(ia.tokens * (p + 1) / parts);
      kernels::IndexerArgs part = ia;
      part.tokens = hi - lo;
      part.q += size_t{lo} * ia.heads * kIndexerDim;
      part.weights += size_t{lo} * ia.heads;
      part.seq += lo;
      part.visible += lo;
      tasks.emplace_back(
          [part, &icfg, c = candidates + size_t{lo} * icfg.candidate_blocks,
           t = topk + size_t{lo} * icfg.topk] { kernels::IndexerSelectFull(part, icfg, c, t); });
    }
    opt_.pool->RunAll(std::move(tasks));
  }

  const ForwardOptions& opt_;
  std::vector<bool> alive_;
  std::vector<Row> rows_;
  std::vector<float> h_;
  std::vector<std::vector<int32_t>> topk_, candidates_;  // per layer, all rows
};

}  // namespace

void Forward(const ModelWeights& model, std::span<ForwardItem> items, const ForwardHooks& hooks,
             const ForwardOptions& options, std::vector<std::vector<float>>& logits) {
  ForwardPass(model, items, hooks, options).Run(logits);
}

}  // namespace strata::worker

#include "bench_blocks.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "strata/chain_key.h"

namespace strata::bench {

const ModelId& BenchModel() {
  static const ModelId id =
      ModelFingerprint{"bench-weights", "byte-tokenizer", "none", 1, "fp4"}.Id();
  return id;
}

SealedBlock MakeBlock(const Layout& layout, uint64_t seed) {
  SealedBlock b;
  b.bytes.resize(layout.PayloadBytes());
  std::mt19937_64 rng(seed);
  for (size_t i = layout.HeaderBytes(); i + 8 <= b.bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&b.bytes[i], &v, 8);
  }
  b.checksum = SealPayload(layout, layout.block_tokens, b.bytes).value();
  return b;
}

std::vector<uint32_t> RandomTokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = static_cast<uint32_t>(rng() % 129280);
  return t;
}

Status CommitPrompt(Store& store, std::span<const uint32_t> tokens,
                    const std::function<const SealedBlock&(size_t)>& bytes_of) {
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  MatchRequest req;
  req.model_id = BenchModel();
  req.tokens = tokens.first(0);  // nothing hits: prefix_key is key[0]
  req.want_swa = false;
  auto m = store.Match(req);
  if (!m.ok()) return m.status();
  std::vector<ChainKey> keys{m->prefix_key};
  const size_t blocks = tokens.size() / layout.block_tokens;
  for (size_t b = 0; b < blocks; ++b) {
    keys.push_back(
        ChainKeys::Next(keys.back(), tokens.subspan(b * layout.block_tokens, layout.block_tokens)));
  }
  for (size_t first = 0; first < blocks; first += kMaxBlocksPerCall) {
    const size_t last = std::min(blocks, first + kMaxBlocksPerCall);
    std::vector<CommitPayload> payloads;
    for (size_t b = first; b < last; ++b) {
      const SealedBlock& sb = bytes_of(b);
      CommitPayload c;
      c.block = {keys[b + 1], StateKind::kGlobalKv, kV41GlobalKvLayoutId, sb.bytes.size(),
                 b > 0 ? std::optional<ChainKey>(keys[b]) : std::nullopt};
      c.bytes = sb.bytes;
      c.checksum = sb.checksum;
      payloads.push_back(c);
    }
    auto r = store.Commit(BenchModel(), payloads);
    if (!r.ok()) return r.status();
    for (const Status& s : r->blocks) {
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

}  // namespace strata::bench

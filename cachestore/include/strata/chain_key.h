// Model fingerprints, namespaces and chain keys (DESIGN §2).
//
// Byte encoding (fixed; changing it changes every key, see the test vectors
// in tests/chain_key_test.cc). All integers are little-endian; LP(s) is a
// u32 byte length followed by the bytes of s. H(x) is SHA-256(x) truncated to
// its first 16 bytes.
//
//   model_id = H("strata/model/v1" || LP(weights_revision) ||
//                LP(tokenizer_version) || LP(chat_template_version) ||
//                u32 kv_layout_version || LP(precision))
//   key[0]   = H("strata/chain/v1" || LP(namespace) || model_id || LP(extra))
//   key[i+1] = H("strata/block/v1" || key[i] || u32 n_tokens ||
//                n_tokens x u32 token || u32 n_mm ||
//                n_mm x (u32 offset_in_block || 16-byte content hash))
//
// Block i (tokens [i*B, (i+1)*B)) is stored under key[i+1], the key that
// commits to every token up to its end. The SWA state at boundary b (after b
// blocks) is stored under key[b] with kind SWA_STATE. The string tags carry
// no length prefix; each is 15 bytes, which keeps the three domains apart.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

// 16 opaque bytes; `Tag` keeps model ids and chain keys from mixing.
template <typename Tag>
struct Digest16 {
  std::array<uint8_t, 16> bytes{};

  std::string ToHex() const;
  static std::optional<Digest16> FromHex(std::string_view hex);
  // The first 8 bytes; uniformly distributed because the digest is.
  uint64_t Prefix64() const {
    uint64_t v;
    std::memcpy(&v, bytes.data(), sizeof(v));
    return v;
  }
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted <=>
  friend auto operator<=>(const Digest16&, const Digest16&) = default;
  // Spelled out: the defaulted one compares the array through a libc
  // memcmp call, and index lookups compare keys on every probe.
  friend bool operator==(const Digest16& a, const Digest16& b) {
    return std::memcmp(a.bytes.data(), b.bytes.data(), sizeof(a.bytes)) == 0;
  }
};

struct ModelIdTag {};
struct ChainKeyTag {};
using ModelId = Digest16<ModelIdTag>;
using ChainKey = Digest16<ChainKeyTag>;

struct ModelFingerprint {
  std::string weights_revision;
  std::string tokenizer_version;
  std::string chat_template_version;
  uint32_t kv_layout_version = 1;
  std::string precision;  // e.g. "fp4-e2m1+mxfp8"

  ModelId Id() const;
};

// The weights_revision of a weights file, from its content: "sha256:" and
// the first 16 bytes of the SHA-256 of every byte of the file, in hex. A
// path would name a file, not weights: one rewritten in place, or two hosts
// with different files at the same path, would share each other's state.
// strata-worker and strata-admin --model FILE both use this.
Result<std::string> WeightsRevisionOfFile(const std::string& path);

// A multimodal item (image, audio clip) occupying prompt positions starting
// at `position`; `content_hash` identifies its content.
struct MultimodalRef {
  uint32_t position = 0;
  std::array<uint8_t, 16> content_hash{};
};

constexpr size_t kMaxNamespaceBytes = 128;
constexpr size_t kMaxExtraBytes = 4096;

// 1..128 bytes of [A-Za-z0-9._-].
Status ValidateNamespace(std::string_view ns);

// Everything that feeds key[0].
struct ChainRoot {
  std::string_view ns;
  ModelId model_id;
  std::string_view extra;  // e.g. a LoRA adapter id or a cache salt
};

// Checks what feeds key[0] and the multimodal list (sorted by position).
Status ValidateChainInputs(const ChainRoot& root, std::span<const MultimodalRef> mm = {});

class ChainKeys {
 public:
  static ChainKey Root(const ChainRoot& root);
  // `mm` holds the items that start inside this block, positions relative to
  // the block start.
  static ChainKey Next(const ChainKey& prev, std::span<const uint32_t> tokens,
                       std::span<const MultimodalRef> mm = {});

  // key[1..n] for the n full blocks of `tokens` (a partial tail is not
  // keyed). `mm` positions are absolute and must be sorted. Stops early (and
  // returns fewer keys) when `keep_going` returns false for a key, so a
  // lookup can stop hashing at its first miss.
  static Result<std::vector<ChainKey>> ForPrompt(
      const ChainRoot& root, std::span<const uint32_t> tokens, uint32_t block_tokens,
      std::span<const MultimodalRef> mm = {},
      const std::function<bool(size_t block, const ChainKey&)>& keep_going = nullptr);
};

}  // namespace strata

template <typename Tag>
struct std::hash<strata::Digest16<Tag>> {
  size_t operator()(const strata::Digest16<Tag>& d) const noexcept { return d.Prefix64(); }
};

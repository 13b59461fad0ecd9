#include "strata/chain_key.h"

#include <openssl/evp.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace strata {
namespace {

static_assert(std::endian::native == std::endian::little,
              "chain keys hash token arrays in place; add a byte swap for big-endian hosts");

constexpr std::string_view kModelTag = "strata/model/v1";
constexpr std::string_view kChainTag = "strata/chain/v1";
constexpr std::string_view kBlockTag = "strata/block/v1";

// Streams bytes into SHA-256. One context per thread, reused: creating and
// fetching a digest per call would cost more than hashing a 1 KiB block.
class Sha256 {
 public:
  Sha256() {
    static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    thread_local std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                             &EVP_MD_CTX_free);
    ctx_ = ctx.get();
    if (md == nullptr || ctx_ == nullptr || EVP_DigestInit_ex2(ctx_, md, nullptr) != 1) {
      std::fprintf(stderr, "strata: OpenSSL SHA-256 unavailable\n");
      std::abort();
    }
  }
  void Bytes(const void* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  void Str(std::string_view s) { Bytes(s.data(), s.size()); }
  void U32(uint32_t v) { Bytes(&v, sizeof(v)); }  // host is little-endian
  void LengthPrefixed(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Str(s);
  }
  template <typename D>
  D Finish16() {
    unsigned char full[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, full, &len);
    D d;
    std::memcpy(d.bytes.data(), full, d.bytes.size());
    return d;
  }

 private:
  EVP_MD_CTX* ctx_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

template <typename Tag>
std::string Digest16<Tag>::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

template <typename Tag>
std::optional<Digest16<Tag>> Digest16<Tag>::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Digest16 d;
  for (size_t i = 0; i < 16; ++i) {
    int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return d;
}

template struct Digest16<ModelIdTag>;
template struct Digest16<ChainKeyTag>;

ModelId ModelFingerprint::Id() const {
  Sha256 h;
  h.Str(kModelTag);
  h.LengthPrefixed(weights_revision);
  h.LengthPrefixed(tokenizer_version);
  h.LengthPrefixed(chat_template_version);
  h.U32(kv_layout_version);
  h.LengthPrefixed(precision);
  return h.Finish16<ModelId>();
}

Result<std::string> WeightsRevisionOfFile(const std::string& path) {
  std::unique_ptr<std::FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (f == nullptr) {
    return NotFound("weights file '" + path + "': " + std::strerror(errno));
  }
  Sha256 h;
  std::vector<char> buffer(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f.get())) > 0) h.Bytes(buffer.data(), n);
  if (std::ferror(f.get()) != 0) {
    return Internal("weights file '" + path + "': read failed");
  }
  struct RevisionTag {};
  return "sha256:" + h.Finish16<Digest16<RevisionTag>>().ToHex();
}

Status ValidateNamespace(std::string_view ns) {
  if (ns.empty() || ns.size() > kMaxNamespaceBytes) {
    return InvalidArgument("namespace must be 1.." + std::to_string(kMaxNamespaceBytes) +
                           " bytes, got " + std::to_string(ns.size()));
  }
  for (char c : ns) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return InvalidArgument("namespace may hold only [A-Za-z0-9._-]");
  }
  return Status::Ok();
}

Status ValidateChainInputs(const ChainRoot& root, std::span<const MultimodalRef> mm) {
  STRATA_RETURN_IF_ERROR(ValidateNamespace(root.ns));
  if (root.extra.size() > kMaxExtraBytes) {
    return InvalidArgument("chain extra of " + std::to_string(root.extra.size()) +
                           " bytes exceeds " + std::to_string(kMaxExtraBytes));
  }
  for (size_t i = 1; i < mm.size(); ++i) {
    if (mm[i].position < mm[i - 1].position) {
      return InvalidArgument("multimodal refs must be sorted by position");
    }
  }
  return Status::Ok();
}

ChainKey ChainKeys::Root(const ChainRoot& root) {
  Sha256 h;
  h.Str(kChainTag);
  h.LengthPrefixed(root.ns);
  h.Bytes(root.model_id.bytes.data(), root.model_id.bytes.size());
  h.LengthPrefixed(root.extra);
  return h.Finish16<ChainKey>();
}

ChainKey ChainKeys::Next(const ChainKey& prev, std::span<const uint32_t> tokens,
                         std::span<const MultimodalRef> mm) {
  Sha256 h;
  h.Str(kBlockTag);
  h.Bytes(prev.bytes.data(), prev.bytes.size());
  h.U32(static_cast<uint32_t>(tokens.size()));
  h.Bytes(tokens.data(), tokens.size_bytes());
  h.U32(static_cast<uint32_t>(mm.size()));
  for (const MultimodalRef& m : mm) {
    h.U32(m.position);
    h.Bytes(m.content_hash.data(), m.content_hash.size());
  }
  return h.Finish16<ChainKey>();
}

Result<std::vector<ChainKey>> ChainKeys::ForPrompt(
    const ChainRoot& root, std::span<const uint32_t> tokens, uint32_t block_tokens,
    std::span<const MultimodalRef> mm,
    const std::function<bool(size_t, const ChainKey&)>& keep_going) {
  if (block_tokens == 0) return InvalidArgument("block_tokens must be positive");
  STRATA_RETURN_IF_ERROR(ValidateChainInputs(root, mm));
  const size_t blocks = tokens.size() / block_tokens;
  std::vector<ChainKey> keys;
  keys.reserve(blocks);
  std::vector<MultimodalRef> local;  // this block's items, block-relative
  size_t next_mm = 0;
  ChainKey key = Root(root);
  for (size_t b = 0; b < blocks; ++b) {
    const uint64_t begin = uint64_t{b} * block_tokens, end = begin + block_tokens;
    local.clear();
    while (next_mm < mm.size() && mm[next_mm].position < end) {
      MultimodalRef r = mm[next_mm++];
      r.position = static_cast<uint32_t>(r.position - begin);
      local.push_back(r);
    }
    key = Next(key, tokens.subspan(begin, block_tokens), local);
    keys.push_back(key);
    if (keep_going && !keep_going(b, key)) break;
  }
  return keys;
}

}  // namespace strata

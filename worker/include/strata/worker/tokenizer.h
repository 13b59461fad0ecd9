// Byte-level tokenizer: token id = byte value (vocab 256). Lossless for any
// byte string; its version feeds the model fingerprint.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::worker {

class ByteTokenizer {
 public:
  static constexpr const char* kVersion = "bytes/1";
  static constexpr uint32_t kVocab = 256;
  static std::vector<uint32_t> Encode(std::string_view text);
  // Ids >= 256 (impossible from this model) decode as '?'.
  static std::string Decode(std::span<const uint32_t> ids);
};

}  // namespace strata::worker

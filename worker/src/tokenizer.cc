#include "strata/worker/tokenizer.h"

namespace strata::worker {

std::vector<uint32_t> ByteTokenizer::Encode(std::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::Decode(std::span<const uint32_t> ids) {
  std::string out;
  out.reserve(ids.size());
  for (uint32_t id : ids) out += id < kVocab ? static_cast<char>(id) : '?';
  return out;
}

}  // namespace strata::worker

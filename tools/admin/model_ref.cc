#include "model_ref.h"

#include <filesystem>
#include <fstream>

#include "strata/chain_key.h"
#include "strata/layout.h"
#include "strata/store_types.h"

namespace strata::admin {

Result<ModelId> ResolveModel(const std::string& ref) {
  if (std::optional<ModelId> id = ModelId::FromHex(ref)) return *id;
  // The fingerprint strata-worker forms (worker/src/engine.cc, Engine::Engine).
  ModelFingerprint fp;
  if (ref.starts_with("seed:")) {
    const std::string seed = ref.substr(5);
    if (seed.empty() || seed.size() > 19 ||
        seed.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("--model: '" + ref + "': seed:N needs a decimal N");
    }
    fp.weights_revision = "random-seed-" + seed;
  } else {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(ref, ec)) {
      return InvalidArgument("--model: '" + ref +
                             "' is neither 32 hex digits, seed:N, nor a model file");
    }
    Result<std::string> revision = WeightsRevisionOfFile(ref);
    if (!revision.ok()) return InvalidArgument("--model: " + revision.status().message());
    fp.weights_revision = *revision;
  }
  fp.tokenizer_version = "bytes/1";
  fp.chat_template_version = "none";
  fp.kv_layout_version = kV41KvLayoutVersion;
  fp.precision = kV41Precision;
  return fp.Id();
}

Result<std::vector<uint32_t>> ReadTokensFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("--tokens-file: cannot read " + path);
  std::vector<uint32_t> tokens;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    size_t i = 0;
    while (i < line.size()) {
      if (line[i] == ' ' || line[i] == '\t' || line[i] == ',' || line[i] == '\r') {
        ++i;
        continue;
      }
      const size_t start = i;
      while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
      const std::string word = line.substr(start, i - start);
      const bool separated = i == line.size() || line[i] == ' ' || line[i] == '\t' ||
                             line[i] == ',' || line[i] == '\r';
      if (word.empty() || !separated || word.size() > 10 || std::stoull(word) > UINT32_MAX) {
        size_t end = start;
        while (end < line.size() && line[end] != ' ' && line[end] != ',') ++end;
        return InvalidArgument(path + ":" + std::to_string(line_no) + ": '" +
                               line.substr(start, end - start) + "' is not a token id (0.." +
                               std::to_string(UINT32_MAX) + ")");
      }
      if (tokens.size() == kMaxPromptTokens) {
        return InvalidArgument(path + ": more than " + std::to_string(kMaxPromptTokens) +
                               " tokens");
      }
      tokens.push_back(static_cast<uint32_t>(std::stoull(word)));
    }
  }
  return tokens;
}

}  // namespace strata::admin

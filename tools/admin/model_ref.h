// What users have in hand for a model and a prompt: a model fingerprint in
// hex or what strata-worker was given, and a file of token ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/chain_key.h"
#include "strata/status.h"

namespace strata::admin {

// What users have for a model:
//   32 hex digits   the model fingerprint id (ModelFingerprint::Id)
//   seed:N          strata-worker's random weights (--seed N, no --model)
//   PATH            a weights file, spelled as strata-worker's --model got it
Result<ModelId> ResolveModel(const std::string& ref);

// Token ids, decimal, separated by whitespace or commas; '#' starts a
// comment. At most kMaxPromptTokens.
Result<std::vector<uint32_t>> ReadTokensFile(const std::string& path);

}  // namespace strata::admin

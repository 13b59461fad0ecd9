// A prompt on the command line: its model (a fingerprint in hex, or what
// strata-worker was given), its token ids from a file, and the chain keys
// derived from them client-side, the way the client library does.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "model_ref.h"
#include "strata/chain_key.h"

namespace strata::admin {

struct PromptOptions {
  std::string model;
  std::string tokens_file;
  uint32_t block_tokens = 256;
  std::string extra;  // feeds key[0], as the worker's chain_extra
};
// --model, --tokens-file, --block-tokens, --extra on `cmd`.
void AddPromptOptions(CLI::App* cmd, PromptOptions* options);

struct PromptKeys {
  ModelId model;
  std::string ns;  // the namespace the keys were derived for
  std::vector<uint32_t> tokens;
  std::vector<ChainKey> keys;  // key[1..n], one per full block
};
// `ns`: the namespace to derive for; empty: the token's own (from Hello;
// operator tokens must name one). INVALID_ARGUMENT for a prompt without a
// full block.
Result<PromptKeys> DerivePromptKeys(Context& ctx, const PromptOptions& options,
                                    const std::string& ns);

}  // namespace strata::admin

#include "prompt_input.h"

#include "strata/store_types.h"

namespace strata::admin {

void AddPromptOptions(CLI::App* cmd, PromptOptions* options) {
  cmd->add_option("--model", options->model,
                  "Model: fingerprint id (32 hex), seed:N, or a model file")
      ->required();
  cmd->add_option("--tokens-file", options->tokens_file, "The prompt's token ids (decimal)")
      ->required();
  cmd->add_option("--block-tokens", options->block_tokens, "Tokens per block")
      ->check(CLI::Range(kMinBlockTokens, kMaxBlockTokens));
  cmd->add_option("--extra", options->extra, "What fed key[0] besides model and namespace");
}

Result<PromptKeys> DerivePromptKeys(Context& ctx, const PromptOptions& options,
                                    const std::string& ns) {
  PromptKeys out;
  Result<ModelId> model = ResolveModel(options.model);
  if (!model.ok()) return model.status();
  out.model = *model;
  Result<std::vector<uint32_t>> tokens = ReadTokensFile(options.tokens_file);
  if (!tokens.ok()) return tokens.status();
  out.tokens = std::move(tokens).value();
  out.ns = ns;
  if (out.ns.empty()) {
    // The keys commit to the namespace: the token's own, as the client's.
    Result<v1::HelloResponse> hello = ctx.clients.front()->Hello();
    if (!hello.ok()) {
      if (hello.status().code() == StatusCode::kPermissionDenied) {
        return InvalidArgument("an operator token must name the prompt's namespace: --namespace");
      }
      return hello.status();
    }
    out.ns = hello->namespace_();
  }
  const ChainRoot root{out.ns, out.model, options.extra};
  STRATA_RETURN_IF_ERROR(ValidateChainInputs(root));
  Result<std::vector<ChainKey>> keys = ChainKeys::ForPrompt(root, out.tokens, options.block_tokens);
  if (!keys.ok()) return keys.status();
  // Only full blocks have keys: a shorter prompt names nothing to look up.
  if (keys->empty()) {
    return InvalidArgument("the prompt (" + std::to_string(out.tokens.size()) +
                           " tokens) has no full block of " + std::to_string(options.block_tokens) +
                           " tokens");
  }
  if (keys->size() > kMaxBlocksPerCall) {
    return InvalidArgument("prompt of " + std::to_string(keys->size()) + " blocks exceeds " +
                           std::to_string(kMaxBlocksPerCall));
  }
  out.keys = std::move(keys).value();
  return out;
}

}  // namespace strata::admin

// prefix: which blocks of a prompt hit, on which node and tier, and the
// first missing block. Keys are derived here, as the client derives them.
#include <cstdio>

#include "commands.h"
#include "prompt_input.h"
#include "table.h"

namespace strata::admin {
namespace {

struct PrefixOptions {
  PromptOptions prompt;
  std::string ns;
};

struct BlockAnswer {
  bool hit = false;
  size_t node = 0;
  v1::PrefixBlock block;
};

v1::PrefixRequest PrefixRequestFor(const PromptKeys& keys, const std::string& ns) {
  v1::PrefixRequest req;
  req.set_model_id(
      std::string(reinterpret_cast<const char*>(keys.model.bytes.data()), keys.model.bytes.size()));
  req.set_namespace_(ns);
  for (const ChainKey& k : keys.keys) {
    req.add_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
  }
  return req;
}

// The prompt's blocks as the nodes answered for them, and the nodes' ids.
struct PrefixAnswers {
  std::vector<BlockAnswer> blocks;
  std::vector<std::string> node_ids;  // one per node in --store
  size_t first_missing = 0;           // blocks before it all hit
};

// Asks every node in turn. Each block is where some node holds it (the first
// such node in --store).
Result<PrefixAnswers> AskNodes(Context& ctx, const v1::PrefixRequest& req, size_t keys) {
  PrefixAnswers out;
  out.blocks.resize(keys);
  out.node_ids.resize(ctx.clients.size());
  std::vector<BlockAnswer>& blocks = out.blocks;
  for (size_t n = 0; n < ctx.clients.size() && keys > 0; ++n) {
    Result<v1::PrefixResponse> r = ctx.clients[n]->Prefix(req);
    if (!r.ok()) return r.status();
    out.node_ids[n] = r->node_id();
    if (r->blocks_size() != static_cast<int>(blocks.size())) {
      return Internal("node " + ctx.clients[n]->address() + " answered " +
                      std::to_string(r->blocks_size()) + " blocks for " +
                      std::to_string(blocks.size()) + " keys");
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (!blocks[b].hit && r->blocks(static_cast<int>(b)).present()) {
        blocks[b] = {true, n, r->blocks(static_cast<int>(b))};
      }
    }
  }
  while (out.first_missing < blocks.size() && blocks[out.first_missing].hit) ++out.first_missing;
  return out;
}

void PrintPrefixJson(Context& ctx, const PromptKeys& keys, const PrefixAnswers& answers,
                     uint32_t bt, size_t tail) {
  const std::vector<BlockAnswer>& blocks = answers.blocks;
  const size_t first_missing = answers.first_missing;
  Json list = Json::MakeArray();
  for (size_t b = 0; b < blocks.size(); ++b) {
    const BlockAnswer& a = blocks[b];
    Json j = Json::MakeObject();
    j.Set("index", static_cast<uint64_t>(b))
        .Set("first_token", static_cast<uint64_t>(b) * bt)
        .Set("key", Hex(std::string(reinterpret_cast<const char*>(keys.keys[b].bytes.data()),
                                    keys.keys[b].bytes.size())))
        .Set("hit", a.hit)
        .Set("tier", a.hit ? Json(TierName(a.block.tier())) : Json())
        .Set("node_id", a.hit ? Json(answers.node_ids[a.node]) : Json())
        .Set("node", a.hit ? Json(ctx.clients[a.node]->address()) : Json())
        .Set("payload_bytes", a.block.payload_bytes())
        .Set("swa", a.block.swa())
        .Set("live_leases", a.block.live_leases())
        .Set("pinned", a.block.pinned());
    list.Push(std::move(j));
  }
  std::printf(
      "%s\n",
      Json::MakeObject()
          .Set("model_id", keys.model.ToHex())
          .Set("namespace", keys.ns)
          .Set("block_tokens", bt)
          .Set("prompt_tokens", static_cast<uint64_t>(keys.tokens.size()))
          .Set("blocks", std::move(list))
          .Set("hit_blocks", static_cast<uint64_t>(first_missing))
          .Set("hit_tokens", static_cast<uint64_t>(first_missing) * bt)
          .Set("first_missing_block",
               first_missing < blocks.size() ? Json(static_cast<uint64_t>(first_missing)) : Json())
          .Set("unkeyed_tail_tokens", static_cast<uint64_t>(tail))
          .Dump()
          .c_str());
}

void PrintPrefixTable(const PromptKeys& keys, const PrefixAnswers& answers, uint32_t bt,
                      size_t tail) {
  const std::vector<BlockAnswer>& blocks = answers.blocks;
  const size_t first_missing = answers.first_missing;
  Table table({"BLOCK", "TOKENS", "HIT", "TIER", "NODE", "SWA", "KEY"});
  for (size_t b = 0; b < blocks.size(); ++b) {
    const BlockAnswer& a = blocks[b];
    table.AddRow({std::to_string(b),
                  std::to_string(b * bt) + "-" + std::to_string((b + 1) * bt - 1),
                  a.hit ? "hit" : "miss", a.hit ? TierName(a.block.tier()) : "-",
                  a.hit ? answers.node_ids[a.node] : "-", a.block.swa() ? "yes" : "-",
                  keys.keys[b].ToHex()});
  }
  table.Print(stdout);
  std::printf("model %s, namespace %s: %zu of %zu blocks hit (%zu tokens)",
              keys.model.ToHex().c_str(), keys.ns.c_str(), first_missing, blocks.size(),
              first_missing * bt);
  if (first_missing < blocks.size()) {
    std::printf("; first missing block: %zu (tokens %zu-)", first_missing, first_missing * bt);
  } else {
    std::printf("; no missing block");
  }
  if (tail > 0) std::printf("; %zu tail tokens are not a full block", tail);
  std::printf("\n");
}

int RunPrefix(Context& ctx, const PrefixOptions& o) {
  Result<PromptKeys> keys = DerivePromptKeys(ctx, o.prompt, o.ns);
  if (!keys.ok()) return ctx.Fail(keys.status());
  Result<PrefixAnswers> answers = AskNodes(ctx, PrefixRequestFor(*keys, o.ns), keys->keys.size());
  if (!answers.ok()) return ctx.Fail(answers.status());
  const uint32_t bt = o.prompt.block_tokens;
  const size_t tail = keys->tokens.size() - keys->keys.size() * bt;
  if (ctx.json) {
    PrintPrefixJson(ctx, *keys, *answers, bt, tail);
  } else {
    PrintPrefixTable(*keys, *answers, bt, tail);
  }
  return 0;
}

}  // namespace

void AddPrefixCommand(CLI::App& app, Runner* run) {
  auto opt = std::make_shared<PrefixOptions>();
  CLI::App* cmd = app.add_subcommand(
      "prefix", "Which blocks of a prompt hit, on which node and tier; the first missing block");
  AddPromptOptions(cmd, &opt->prompt);
  cmd->add_option("--namespace", opt->ns,
                  "The prompt's namespace (default: the token's; operator tokens must name one)");
  cmd->callback([run, opt] { *run = [opt](Context& ctx) { return RunPrefix(ctx, *opt); }; });
}

}  // namespace strata::admin

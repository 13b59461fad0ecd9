// strata-tracegen: writes a synthetic multi-turn trace (Mooncake format).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "strata/trace/trace_generator.h"

int main(int argc, char** argv) {
  using strata::trace::TraceGeneratorOptions;
  CLI::App app{"strata-tracegen: synthetic multi-turn chat/agent traces (Mooncake JSONL)"};
  std::string preset = "chat", out_path;
  TraceGeneratorOptions o;
  app.add_option("--preset", preset, "chat or agent (flags below override it)");
  app.add_option("-o,--output", out_path, "Output file")->required();
  // Parsed into a copy so the preset can be applied first, then overridden.
  TraceGeneratorOptions flags;
  auto* seed = app.add_option("--seed", flags.seed, "Random seed");
  auto* convs = app.add_option("--conversations", flags.conversations, "Conversations");
  auto* dur = app.add_option("--duration-s", flags.duration_s, "Arrival window, seconds");
  auto* turns = app.add_option("--mean-turns", flags.mean_turns, "Mean turns per conversation");
  auto* think = app.add_option("--mean-think-s", flags.mean_think_s, "Mean think time, seconds");
  auto* prompts = app.add_option("--system-prompts", flags.system_prompts, "Shared system prompts");
  auto* zipf = app.add_option("--system-prompt-zipf", flags.system_prompt_zipf, "Zipf skew");
  auto* sys = app.add_option("--system-prompt-tokens", flags.system_prompt_tokens, "Tokens");
  auto* first = app.add_option("--first-message-tokens", flags.first_message_tokens, "Mean");
  auto* msg = app.add_option("--message-tokens", flags.message_tokens, "Mean");
  auto* outp = app.add_option("--output-tokens", flags.output_tokens, "Mean");
  auto* maxc = app.add_option("--max-context-tokens", flags.max_context_tokens, "Cap");
  bool json = false;
  app.add_flag("--json", json, "Print a JSON summary instead of a line of text");
  CLI11_PARSE(app, argc, argv);

  auto base = TraceGeneratorOptions::Preset(preset);
  if (!base.ok()) {
    std::fprintf(stderr, "strata-tracegen: %s\n", base.status().ToString().c_str());
    return 2;
  }
  o = *base;
  if (*seed) o.seed = flags.seed;
  if (*convs) o.conversations = flags.conversations;
  if (*dur) o.duration_s = flags.duration_s;
  if (*turns) o.mean_turns = flags.mean_turns;
  if (*think) o.mean_think_s = flags.mean_think_s;
  if (*prompts) o.system_prompts = flags.system_prompts;
  if (*zipf) o.system_prompt_zipf = flags.system_prompt_zipf;
  if (*sys) o.system_prompt_tokens = flags.system_prompt_tokens;
  if (*first) o.first_message_tokens = flags.first_message_tokens;
  if (*msg) o.message_tokens = flags.message_tokens;
  if (*outp) o.output_tokens = flags.output_tokens;
  if (*maxc) o.max_context_tokens = flags.max_context_tokens;

  const auto requests = strata::trace::GenerateTrace(o);
  if (auto st = strata::trace::WriteTrace(out_path, requests); !st.ok()) {
    std::fprintf(stderr, "strata-tracegen: %s\n", st.ToString().c_str());
    return 1;
  }
  const uint64_t tokens = strata::trace::InputTokens(requests);
  if (json) {
    std::printf("{\"requests\": %zu, \"input_tokens\": %llu, \"output\": \"%s\"}\n",
                requests.size(), static_cast<unsigned long long>(tokens), out_path.c_str());
  } else {
    std::printf("wrote %zu requests (%llu input tokens, preset %s) to %s\n", requests.size(),
                static_cast<unsigned long long>(tokens), preset.c_str(), out_path.c_str());
  }
  return 0;
}

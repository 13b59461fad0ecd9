// strata-tracegen: writes a synthetic multi-turn trace (Mooncake format).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <string_view>

#include "strata/json_text.h"
#include "strata/trace/trace_generator.h"

int main(int argc, char** argv) {
  using strata::trace::TraceGeneratorOptions;
  // The preset supplies the defaults that the other flags override, so it
  // is read before they are parsed (CLI11 still validates and documents it).
  std::string preset = "chat";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--preset" && i + 1 < argc) preset = argv[i + 1];
    if (arg.starts_with("--preset=")) preset = std::string(arg.substr(9));
  }
  auto base = TraceGeneratorOptions::Preset(preset);
  if (!base.ok()) {
    std::fprintf(stderr, "strata-tracegen: %s\n", base.status().ToString().c_str());
    return 2;
  }
  TraceGeneratorOptions o = *base;

  CLI::App app{"strata-tracegen: synthetic multi-turn chat/agent traces (Mooncake JSONL)"};
  std::string out_path;
  app.add_option("--preset", preset, "chat or agent (flags below override it)");
  app.add_option("-o,--output", out_path, "Output file")->required();
  app.add_option("--seed", o.seed, "Random seed");
  app.add_option("--conversations", o.conversations, "Conversations");
  app.add_option("--duration-s", o.duration_s, "Arrival window, seconds");
  app.add_option("--mean-turns", o.mean_turns, "Mean turns per conversation");
  app.add_option("--mean-think-s", o.mean_think_s, "Mean think time, seconds");
  app.add_option("--system-prompts", o.system_prompts, "Shared system prompts");
  app.add_option("--system-prompt-zipf", o.system_prompt_zipf, "Zipf skew");
  app.add_option("--system-prompt-tokens", o.system_prompt_tokens, "Tokens");
  app.add_option("--first-message-tokens", o.first_message_tokens, "Mean");
  app.add_option("--message-tokens", o.message_tokens, "Mean");
  app.add_option("--output-tokens", o.output_tokens, "Mean");
  app.add_option("--max-context-tokens", o.max_context_tokens, "Cap");
  bool json = false;
  app.add_flag("--json", json, "Print a JSON summary instead of a line of text");
  CLI11_PARSE(app, argc, argv);

  const auto generated = strata::trace::GenerateTrace(o);
  if (!generated.ok()) {
    std::fprintf(stderr, "strata-tracegen: %s\n", generated.status().ToString().c_str());
    return 2;
  }
  const std::vector<strata::trace::TraceRequest>& requests = *generated;
  if (auto st = strata::trace::WriteTrace(out_path, requests); !st.ok()) {
    std::fprintf(stderr, "strata-tracegen: %s\n", st.ToString().c_str());
    return 1;
  }
  const uint64_t tokens = strata::trace::InputTokens(requests);
  if (json) {
    std::printf("{\"requests\": %zu, \"input_tokens\": %llu, \"output\": %s}\n", requests.size(),
                static_cast<unsigned long long>(tokens), strata::JsonString(out_path).c_str());
  } else {
    std::printf("wrote %zu requests (%llu input tokens, preset %s) to %s\n", requests.size(),
                static_cast<unsigned long long>(tokens), preset.c_str(), out_path.c_str());
  }
  return 0;
}

// strata-mkworkload: writes the bundled multi-turn sample workload (a shared
// system prompt, then conversations whose turns extend each other).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "strata/store_types.h"
#include "strata/worker/workload.h"

int main(int argc, char** argv) {
  CLI::App app{"strata-mkworkload: a deterministic multi-turn sample workload"};
  std::string out;
  strata::worker::SampleWorkloadOptions o;
  app.add_option("--out,-o", out, "Output workload file")->required();
  app.add_option("--conversations", o.conversations, "Conversations")->check(CLI::Range(1u, 1000u));
  app.add_option("--turns", o.turns, "Turns per conversation")->check(CLI::Range(1u, 100u));
  app.add_option("--system-bytes", o.system_bytes, "Shared system prompt bytes")
      ->check(CLI::Range(64u, 1u << 20));
  app.add_option("--turn-bytes", o.turn_bytes, "User bytes per turn")
      ->check(CLI::Range(16u, 1u << 20));
  app.add_option("--max-new", o.max_new_tokens, "Tokens generated per turn")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--seed", o.seed, "Text seed");
  CLI11_PARSE(app, argc, argv);
  // Refused before the text is built: the last turn's prompt is the whole
  // conversation (system prompt, every turn, every reply but its own).
  const uint64_t longest = uint64_t{o.system_bytes} + uint64_t{o.turns} * o.turn_bytes +
                           uint64_t{o.turns - 1} * o.max_new_tokens;
  if (longest > strata::kMaxPromptTokens) {
    std::fprintf(stderr,
                 "strata-mkworkload: the last turn's prompt would be %llu tokens, above the "
                 "worker's limit of %zu: fewer turns or bytes\n",
                 static_cast<unsigned long long>(longest), strata::kMaxPromptTokens);
    return 2;
  }
  const auto items = strata::worker::MakeSampleWorkload(o);
  if (const strata::Status st = strata::worker::CheckWorkload(items); !st.ok()) {
    std::fprintf(stderr, "strata-mkworkload: %s\n", st.ToString().c_str());
    return 2;
  }
  const std::string text = strata::worker::FormatWorkload(items);
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) {
    std::fprintf(stderr, "strata-mkworkload: cannot write '%s'\n", out.c_str());
    return 1;
  }
  std::printf("wrote %s: %u conversations x %u turns\n", out.c_str(), o.conversations, o.turns);
  return 0;
}

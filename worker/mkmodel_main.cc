// strata-mkmodel: writes deterministic random weights for the mini V4.1
// model as a safetensors file (no checkpoint can be downloaded here).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "strata/worker/model.h"

int main(int argc, char** argv) {
  CLI::App app{"strata-mkmodel: deterministic random weights for the mini V4.1 model"};
  std::string out;
  uint64_t seed = 1;
  bool tiny = false;
  app.add_option("--out,-o", out, "Output safetensors file")->required();
  app.add_option("--seed", seed, "Random seed (same seed, same bytes)");
  app.add_flag("--tiny", tiny, "The small test config instead of the default (d_model 256)");
  CLI11_PARSE(app, argc, argv);
  using namespace strata::worker;
  const ModelConfig config = tiny ? TinyModelConfig() : DefaultModelConfig();
  if (strata::Status st = config.Validate(); !st.ok()) {
    std::fprintf(stderr, "strata-mkmodel: %s\n", st.ToString().c_str());
    return 1;
  }
  const SafetensorsFile file = RandomModelFile(config, seed);
  if (strata::Status st = WriteSafetensors(out, file); !st.ok()) {
    std::fprintf(stderr, "strata-mkmodel: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s: %zu tensors, d_model %u, %u+%u layers, %.0f B global KV/token\n",
              out.c_str(), file.tensors.size(), config.d_model, config.encoder_layers,
              config.decoder_layers, config.GlobalKvBytesPerToken());
  return 0;
}

// Without libFuzzer (g++ builds), a fuzz target runs as a regression test:
// every file under the corpus directories given, then `STRATA_FUZZ_RUNS`
// (default 2000) pseudo-random inputs from a fixed seed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::filesystem::is_directory(argv[i])) continue;
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++files;
    }
  }
  const char* env = std::getenv("STRATA_FUZZ_RUNS");
  const long runs = env != nullptr ? std::atol(env) : 2000;
  std::mt19937_64 rng(20261129);
  std::vector<uint8_t> buf;
  for (long r = 0; r < runs; ++r) {
    buf.resize(rng() % 512);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("replayed %zu corpus files and %ld random inputs\n", files, runs);
  return 0;
}

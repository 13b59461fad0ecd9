// strata-gpu-check: the standalone GPU runner behind benchmarks/gpu/run.sh.
// Runs the CUDA-vs-CPU checks (tests/kernels/cuda_checks.h), then the CUDA
// kernel timings of `strata-bench kernels --gpu`. Needs only the CUDA
// toolkit and a C++20 compiler, so a bare GPU machine can build it.
//   strata-gpu-check [--json] [--skip-checks | --checks-only]
// --checks-only runs the checks alone (e.g. under compute-sanitizer).
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_checks.h"
#include "kernels_bench.h"

int main(int argc, char** argv) {
  bool json = false, checks = true, bench = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else if (std::strcmp(argv[i], "--skip-checks") == 0)
      checks = false;
    else if (std::strcmp(argv[i], "--checks-only") == 0)
      bench = false;
    else {
      std::fprintf(stderr, "usage: %s [--json] [--skip-checks | --checks-only]\n", argv[0]);
      return 2;
    }
  }
  namespace k = strata::kernels;
  std::string why;
  if (!k::cuda::DeviceAvailable(&why)) {
    std::fprintf(stderr, "no CUDA device: %s\n", why.c_str());
    return 1;
  }
  int failed = 0;
  if (checks) {
    std::printf("CUDA vs CPU checks on %s\n", k::cuda::DeviceName().c_str());
    for (const auto& c : k::cuda_checks::kChecks) {
      const std::string error = c.run();
      std::printf("  %-12s %s\n", c.name, error.empty() ? "PASS" : ("FAIL: " + error).c_str());
      failed += !error.empty();
    }
    std::fflush(stdout);
  }
  if (!bench) return failed ? 1 : 0;
  strata::bench::KernelsBenchOptions o;
  o.gpu = true;
  o.json = json;
  const int rc = strata::bench::RunKernelsBench(o);
  return failed ? 1 : rc;
}

// `strata-bench kernels`: the CPU kernels' achieved GB/s or GFLOP/s next to
// this machine's single-thread memcpy bandwidth and a simple single-thread
// FLOP/s peak estimate, both measured in the same run. With --gpu (CUDA
// build, GPU present) the CUDA kernels instead, next to the device's
// measured copy bandwidth.
#pragma once

namespace strata::bench {

struct KernelsBenchOptions {
  int rounds = 5;  // timed repetitions per kernel (median reported)
  bool gpu = false;
  bool json = false;

  // A template so this header needs no CLI11: benchmarks/gpu/gpu_main.cc
  // builds the GPU timings on machines without it.
  template <typename App>
  void Register(App& app) {
    app.add_option("--rounds", rounds, "Timed repetitions per kernel (1..1000)");
    app.add_flag("--gpu", gpu, "Time the CUDA kernels (needs a CUDA build and a GPU)");
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunKernelsBench(const KernelsBenchOptions& options);

}  // namespace strata::bench

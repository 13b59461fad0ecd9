// strata-bench: benchmarks that print a comparison measured in the same
// run. Subcommands: store, replay, kernels (more come with the node, SSD and worker).
#include <CLI/CLI.hpp>

#include "kernels_bench.h"
#include "replay_bench.h"
#include "store_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"strata-bench: Strata benchmarks, each next to its baseline"};
  app.require_subcommand(1);
  strata::bench::StoreBenchOptions store_opts;
  CLI::App* store = app.add_subcommand(
      "store", "In-process store: fetch/commit vs memcpy, match vs hashing alone");
  store_opts.Register(*store);
  strata::bench::ReplayBenchOptions replay_opts;
  CLI::App* replay = app.add_subcommand(
      "replay", "Trace replay through the store vs prefix-safe LRU and the offline optimum");
  replay_opts.Register(*replay);
  strata::bench::KernelsBenchOptions kernels_opts;
  CLI::App* kernels = app.add_subcommand(
      "kernels", "CPU (or --gpu: CUDA) kernels vs memcpy bandwidth and a FLOP/s peak estimate");
  kernels_opts.Register(*kernels);
  CLI11_PARSE(app, argc, argv);
  if (store->parsed()) return strata::bench::RunStoreBench(store_opts);
  if (replay->parsed()) return strata::bench::RunReplayBench(replay_opts);
  if (kernels->parsed()) return strata::bench::RunKernelsBench(kernels_opts);
  return 0;
}

// strata-bench: benchmarks that print a comparison measured in the same
// run. Subcommands: store (more come with the node, SSD, worker, replay).
#include <CLI/CLI.hpp>

#include "store_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"strata-bench: Strata benchmarks, each next to its baseline"};
  app.require_subcommand(1);
  strata::bench::StoreBenchOptions store_opts;
  CLI::App* store = app.add_subcommand(
      "store", "In-process store: fetch/commit vs memcpy, match vs hashing alone");
  store_opts.Register(*store);
  CLI11_PARSE(app, argc, argv);
  if (store->parsed()) return strata::bench::RunStoreBench(store_opts);
  return 0;
}

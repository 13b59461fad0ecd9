// strata-bench: benchmarks that print a comparison measured in the same
// run. Subcommands: store, replay, kernels, ssd, ucx, node, worker, cluster, serve.
#include <CLI/CLI.hpp>

#include "cluster_bench.h"
#include "kernels_bench.h"
#include "node_bench.h"
#include "raw_ucx.h"
#include "replay_bench.h"
#include "serve_bench.h"
#include "ssd_bench.h"
#include "store_bench.h"
#include "worker_bench.h"

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
  strata::bench::SsdBenchOptions ssd_opts;
  CLI::App* ssd = app.add_subcommand(
      "ssd", "SSD tier (io_uring, O_DIRECT) reads/writes vs fio on the same file system");
  ssd_opts.Register(*ssd);
  strata::bench::UcxBenchOptions ucx_opts;
  CLI::App* ucx =
      app.add_subcommand("ucx", "UCX data plane fetches (shm RMA, tcp active messages) vs raw UCX");
  ucx_opts.Register(*ucx);
  strata::bench::NodeBenchOptions node_opts;
  CLI::App* node = app.add_subcommand(
      "node", "strata-node fetches over UCX shm and TCP vs raw UCX and Redis; match latency");
  node_opts.Register(*node);
  strata::bench::WorkerBenchOptions worker_opts;
  CLI::App* worker = app.add_subcommand(
      "worker", "Mini V4.1 worker: TTFT cold vs warm (90% hit), SWA miss 8K vs 32K, decode");
  worker_opts.Register(*worker);
  strata::bench::ClusterBenchOptions cluster_opts;
  CLI::App* cluster = app.add_subcommand(
      "cluster", "Cluster client over 1/2/3 nodes: aggregate fetch GB/s; match p99, 1 vs 3 nodes");
  cluster_opts.Register(*cluster);
  strata::bench::ServeBenchOptions serve_opts;
  CLI::App* serve = app.add_subcommand(
      "serve", "Serving workers over HTTP under a multi-turn trace: HBM tier + store vs no cache");
  serve_opts.Register(*serve);
  CLI11_PARSE(app, argc, argv);
  if (store->parsed()) return strata::bench::RunStoreBench(store_opts);
  if (replay->parsed()) return strata::bench::RunReplayBench(replay_opts);
  if (kernels->parsed()) return strata::bench::RunKernelsBench(kernels_opts);
  if (ssd->parsed()) return strata::bench::RunSsdBench(ssd_opts);
  if (ucx->parsed()) return strata::bench::RunUcxBench(ucx_opts);
  if (node->parsed()) return strata::bench::RunNodeBench(node_opts);
  if (worker->parsed()) return strata::bench::RunWorkerBench(worker_opts);
  if (cluster->parsed()) return strata::bench::RunClusterBench(cluster_opts);
  if (serve->parsed()) return strata::bench::RunServeBench(serve_opts);
  return 0;
}

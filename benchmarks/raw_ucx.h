// The raw-UCX baseline for the data plane (`strata-bench ucx`, and the
// lead's `strata-bench node`): the same fetch pattern with no Strata logic —
// a child process registers a buffer, the parent keeps `depth` fetches of
// `block_bytes` in flight for `seconds` — next to the same pattern through
// DataPlaneServer / DataPlaneClient, so the ratio comes from one run.
//
// Both functions fork the node process. Call them before this process has
// created any UCX context of its own (a forked child must not inherit UCX
// state); `strata-bench` runs one subcommand per process, so that holds.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/status.h"

namespace strata::bench {

enum class UcxFetchPattern : uint8_t {
  kRma,            // ucp_get_nbx from the node's registered buffer
  kActiveMessage,  // request AM, node replies with an AM from the buffer
};

struct RawUcxOptions {
  UcxFetchPattern pattern = UcxFetchPattern::kRma;
  uint64_t block_bytes = 227'840;  // one 256-token V4.1 block
  uint64_t blocks = 256;           // distinct blocks in the node's buffer
  uint32_t depth = 16;             // fetches in flight
  double seconds = 2.0;
  std::string tls;  // UCX_TLS for both processes; empty = the environment's
  // The node's buffer is allocated by UCX (DataPlaneServer::StartWithOwnRegion);
  // needed for native RMA over shm with UCX 1.13.
  bool ucx_allocated = false;
  // kActiveMessage: the node replies eagerly (UCX streams fragments from the
  // buffer) instead of by rendezvous; over TCP either may be faster.
  bool eager_replies = false;
};

// GB/s (1e9 bytes per second) of raw UCX fetches.
Result<double> RawUcxFetchGbps(const RawUcxOptions& options);

// The raw node kept running, so that raw measurements can be interleaved
// with others (on a noisy machine, a ratio of two measurements taken
// minutes apart drifts). Start forks: call it before this process creates
// a UCX context or gRPC threads.
class RawUcxServer {
 public:
  static Result<std::unique_ptr<RawUcxServer>> Start(const RawUcxOptions& options);
  ~RawUcxServer();
  // One measurement of `options.seconds` (sets UCX_TLS to options.tls).
  Result<double> FetchGbps();

 private:
  struct Child;
  RawUcxServer(const RawUcxOptions& options, std::unique_ptr<Child> child);
  RawUcxOptions options_;
  std::unique_ptr<Child> child_;
};
// GB/s of the same pattern through the data plane: each DataPlaneClient::Read
// call carries `depth` ops; kRma / kActiveMessage force the client's mode.
Result<double> DataPlaneFetchGbps(const RawUcxOptions& options);

struct UcxBenchOptions {
  uint64_t block_bytes = 227'840;
  uint32_t depth = 16;
  double seconds = 2.0;
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--block-bytes", block_bytes, "Bytes per fetch")
        ->check(CLI::Range(uint64_t{1}, uint64_t{64} << 20));
    app.add_option("--depth", depth, "Fetches in flight")->check(CLI::Range(1u, 1024u));
    app.add_option("--seconds", seconds, "Seconds per measurement")->check(CLI::Range(0.1, 60.0));
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

// shm (RMA, active messages) and tcp (active messages): raw UCX vs the data
// plane, with their ratio.
int RunUcxBench(const UcxBenchOptions& options);

}  // namespace strata::bench

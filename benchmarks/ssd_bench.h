// `strata-bench ssd`: the SSD tier next to fio on the same file system, in
// the same run, with the same block size and queue depth.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::bench {

struct SsdBenchOptions {
  std::string dir = "/var/tmp/strata-ssd-bench";  // a disk-backed file system
  uint64_t size_mib = 1024;                       // working set per pattern
  uint64_t block_bytes = 227840;                  // one V4.1 global-KV block
  uint32_t queue_depth = 32;
  uint32_t batch = 1024;          // entries per SsdTier batch (one fdatasync each)
  uint32_t promote_blocks = 200;  // store-level promotions timed
  int rounds = 3;                 // SsdTier and fio alternate; medians reported
  std::string fio = "fio";
  bool json = false;

  void Register(CLI::App& app) {
    app.add_option("--dir", dir, "Directory on the file system under test (O_DIRECT)");
    app.add_option("--size-mib", size_mib, "Bytes moved per pattern, MiB")
        ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 20));
    app.add_option("--block-bytes", block_bytes, "Block (payload) size")
        ->check(CLI::Range(uint64_t{512}, uint64_t{64} << 20));
    app.add_option("--queue-depth", queue_depth, "I/Os in flight")->check(CLI::Range(1u, 4096u));
    app.add_option("--batch", batch, "Entries per SsdTier batch")->check(CLI::Range(1u, 65536u));
    app.add_option("--promote-blocks", promote_blocks, "Promotions timed through the store")
        ->check(CLI::Range(10u, 100000u));
    app.add_option("--rounds", rounds, "Alternating SsdTier/fio rounds (medians)")
        ->check(CLI::Range(1, 100));
    app.add_option("--fio", fio, "fio binary");
    app.add_flag("--json", json, "Print one JSON object instead of a table");
  }
};

int RunSsdBench(const SsdBenchOptions& options);

}  // namespace strata::bench

// Drives a real store (in-process, or a node) with a trace: per request, match by
// chain keys -> fetch the hit (full-payload mode) -> commit every missed
// block, at a given capacity in tokens. Hash ids map to chain keys as if
// each id were the block's content, so shared ids share keys. With an SSD
// tier (two-tier mode) every commit is written back and a match promotes
// SSD-only blocks into DRAM, as a node does for a remote match.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/layout.h"
#include "strata/status.h"
#include "strata/trace/trace.h"

namespace strata::trace {

struct ReplayOptions {
  uint64_t capacity_tokens = 3'000'000;
  std::string policy = "deadline";
  // false: metadata-only entries (a 65-byte payload per block, for policy
  // studies at full speed); true: 890 B/token V4.1 global KV per block,
  // fetched on every hit.
  bool full_payload = false;
  // Two-tier mode when > 0: an SSD tier of this many tokens (inclusive of
  // DRAM: every committed block is written back), in a fresh directory
  // under `ssd_dir` (which must support O_DIRECT), removed afterwards.
  uint64_t ssd_capacity_tokens = 0;
  std::string ssd_dir = "/var/tmp";
  std::string ssd_policy = "lru";  // the SSD tier's eviction policy
  // Replay against a node instead ("strata://host:port"; empty: an
  // in-process store built from the options above). The node must know the
  // replay's layout (FormatLayoutSpec(ReplayLayout(full_payload)) in its
  // `extra_layouts`); its own configuration sets the capacity, the policy
  // and any SSD tier, so `policy` must stay at its default and
  // `ssd_capacity_tokens` at 0 (the other SSD options are not used), and
  // `capacity_tokens` only caps the blocks one request commits. A node's
  // SSD tier writes back in its own time, so only a fresh DRAM-only node
  // repeats the in-process figures exactly.
  std::string store_uri;
  std::string token;  // for store_uri; empty: $STRATA_TOKEN
  // Called every `progress_every` requests with (done, total).
  std::function<void(size_t, size_t)> progress;
  size_t progress_every = 1000;
};

struct ReplayResult {
  uint64_t hit_tokens = 0;
  uint64_t input_tokens = 0;
  uint64_t block_ops = 0;  // lookups + inserts
  uint64_t lookups = 0;
  uint64_t inserts = 0;
  uint64_t fetched_bytes = 0;
  uint64_t committed_bytes = 0;
  uint64_t evictions = 0;       // DRAM (in-process only: a node reports its own)
  uint64_t ssd_promotions = 0;  // blocks read from SSD into DRAM (two-tier mode)
  uint64_t ssd_evictions = 0;
  double seconds = 0;

  double hit_ratio() const {
    return input_tokens == 0 ? 0
                             : static_cast<double>(hit_tokens) / static_cast<double>(input_tokens);
  }
  double ops_per_s() const { return seconds > 0 ? static_cast<double>(block_ops) / seconds : 0; }
};

// The layout replayed blocks use: a real header and checksum around one
// byte of body (metadata-only), or 890 B/token V4.1 global KV (full payload),
// kTraceBlockTokens tokens per block either way.
Layout ReplayLayout(bool full_payload);
// DRAM bytes a node needs to hold `capacity_tokens` of replay blocks (its
// allocation granule is 4 KiB).
uint64_t ReplayNodeDramBytes(uint64_t capacity_tokens, bool full_payload);

Result<ReplayResult> ReplayThroughStore(const std::vector<TraceRequest>& requests,
                                        const ReplayOptions& options);

}  // namespace strata::trace

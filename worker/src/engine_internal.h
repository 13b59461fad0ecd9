// The engine's private types (Engine::Sequence, Engine::AbandonedFetch)
// and the helpers its files share: engine.cc (admission, fetches, commits,
// a request's end) and engine_step.cc (one step: schedule -> forward ->
// postprocess).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "kv_transfer.h"
#include "strata/kernels/formats.h"
#include "strata/layout.h"
#include "strata/worker/engine.h"

namespace strata::worker {

inline double SecondsBetween(Nanos a, Nanos b) { return static_cast<double>(b - a) / 1e9; }

// key[0]'s namespace with no store: the keys are never sent anywhere.
inline constexpr std::string_view kNoStoreNamespace = "local";

inline constexpr uint32_t kMainBytes = kernels::kMainKv.Bytes();
inline constexpr uint32_t kIndexBytes = kernels::kIndexerKey.Bytes();
inline constexpr uint32_t kSlotBytes = kernels::kSwaFp8.Bytes();
inline constexpr uint32_t kEntryBytes = kMainBytes + kIndexBytes;

// Pool pages a fetch leaves free for commit staging (a commit takes one page
// and gives it back at once): fetches of waiting requests never starve the
// commits of running ones.
inline constexpr uint32_t kStagingPages = 2;
inline uint32_t StagingPages(const BlockPool& pool) {
  return std::min(kStagingPages, pool.capacity() / 4);
}

// The lineage of a prefix (SwaShape::lineage): each global KV block's entry
// checksum chained onto the digest of the blocks before it. An SWA state
// carries the lineage of the blocks it was computed over, so it is paired
// only with those exact bytes.
inline uint64_t ExtendLineage(uint64_t lineage, uint64_t block_checksum) {
  const uint64_t words[2] = {lineage, block_checksum};
  return Checksum64(std::as_bytes(std::span(words)));
}

// How many (state, prefix) pairs Engine::stale_swa_ remembers, and how
// many prefixes Engine::replays_ counts.
inline constexpr size_t kStaleSwaPairs = 4096;
inline constexpr size_t kReplayedPrefixes = 4096;

// Notes `key`, just added to `remembered`, as the newest in `order`, and
// forgets the oldest once there are more than `cap`.
template <typename Remembered>
void RememberNewest(Remembered& remembered, std::deque<uint64_t>& order, uint64_t key, size_t cap) {
  order.push_back(key);
  if (order.size() > cap) {
    remembered.erase(order.front());
    order.pop_front();
  }
}

enum class Phase : uint8_t { kQueued, kPrefill, kDecode };

struct Engine::Sequence {
  Request req;
  Phase phase = Phase::kQueued;
  Nanos arrival = 0;
  SequenceState state;
  std::vector<uint32_t> tokens;  // prompt, then generated tokens
  std::vector<ChainKey> keys;    // key[0..n]
  int64_t cursor = 0;            // tokens whose global KV / rings are written
  int64_t replay_begin = -1;     // pending encoder replay [replay_begin, hit boundary)
  bool use_store = true;         // false after a fallback to full recompute
  uint64_t committed_upto = 0;   // GLOBAL_KV blocks [0, committed_upto) are in the store
  // Blocks [0, stored_upto) are in the store as far as this run knows:
  // fetched, or committed (now or before a restart). SWA state is only
  // committed over such a prefix; over a block the store refused, no match
  // could ever reach it.
  uint32_t stored_upto = 0;
  bool first_token_out = false;
  std::vector<uint32_t> generated;
  RequestStats stats;

  bool no_reads = false;  // a restart's admission: the prefix is computed
  // The prefix from the HBM tier, held until it is loaded (LoadLocalPrefix).
  std::vector<PrefixCache::Hit> local;
  std::optional<PrefixCache::Hit> local_swa;
  uint32_t local_blocks = 0;  // blocks [0, local_blocks) came from the HBM tier

  // The fetch in flight (DESIGN §9 step 1), of blocks [local_blocks,
  // fetch_blocks) from the store.
  MatchResult match;
  uint32_t fetch_blocks = 0;  // planned usable prefix, HBM tier and store
  bool fetch_swa = false;     // exact path: SWA state at the hit boundary
  uint64_t swa_checksum = 0;  // that state's (StaleSwaKey)
  std::vector<uint32_t> fetch_pages;
  std::vector<std::byte> swa_buffer;
  std::unique_ptr<FetchJob> fetch;
  uint64_t fetch_health_epoch = 0;  // StoreHealth::epoch() when it started
  std::vector<bool> group_loaded;
  bool swa_loaded = false;
  bool fetch_failed = false;  // a layer found its layer group missing
  bool swa_stale = false;     // the fetched SWA state descends from other global KV
  // Digest of global KV blocks [0, lineage_blocks) as this run has them:
  // fetched (the store's checksums) or computed and sealed here.
  uint64_t lineage = 0;
  uint32_t lineage_blocks = 0;
  bool done = false;            // finished; removed at the end of the step
  uint32_t deferred_pages = 0;  // queued: its fetch needs this many pages free
};

// A transfer its request no longer follows, with what it still holds: the
// job, its own page references, the SWA buffer it writes into and the
// match's lease.
struct Engine::AbandonedFetch {
  std::vector<uint32_t> pages;
  std::vector<std::byte> swa_buffer;
  LeaseId lease = 0;
  uint64_t health_epoch = 0;      // StoreHealth::epoch() when it started
  std::unique_ptr<FetchJob> job;  // last: destroyed (joined) before the buffer
};

}  // namespace strata::worker

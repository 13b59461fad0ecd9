// Requests and results of the store contract (DESIGN §3): match, fetch,
// commit (reserve + publish), abort. Shared by every Store (in-process,
// remote, cluster), so they all look the same to a caller.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/chain_key.h"
#include "strata/clock.h"
#include "strata/layout.h"
#include "strata/status.h"

namespace strata {

class CopyPool;  // copy_pool.h

// Who is calling. Comes from credentials (a bearer token on the wire, the
// embedding process in-process), never from a request body.
enum class Role : uint8_t { kRead = 1, kWrite = 2, kAdmin = 3 };  // each includes the ones below
struct Principal {
  std::string ns;
  Role role = Role::kWrite;
};

enum class Tier : uint8_t { kHbm = 0, kDram = 1, kSsd = 2 };
std::string_view TierName(Tier tier);

// A read or write lease; 0 means none.
using LeaseId = uint64_t;

// One entry pinned for a data-plane transfer (CacheStore::PinLeasedRange).
// Opaque: only the store that made it reads it.
struct RangePin {
  void* entry = nullptr;
  uint64_t generation = 0;
};

// Limits on one request; larger inputs get INVALID_ARGUMENT.
constexpr size_t kMaxPromptTokens = 1u << 20;       // 1,048,576 tokens
constexpr size_t kMaxBlocksPerCall = 4096;          // keys per match/commit
constexpr size_t kMaxReleasesPerMatch = 64;         // leases a match may end first
constexpr uint64_t kMaxPayloadBytes = 64ull << 20;  // one entry
constexpr uint32_t kMinBlockTokens = 1;
constexpr uint32_t kMaxBlockTokens = 65536;
constexpr Nanos kMaxLeaseTtl = Minutes(10);
// Entry TTLs and the longest lease life: far below where now + it
// overflows the clock.
constexpr Nanos kMaxEntryTtl = Hours(24 * 365 * 10);
constexpr uint32_t kMaxPinTtlSeconds = 30 * 24 * 3600;  // an admin pin

// ---- match ------------------------------------------------------------------

struct MatchRequest {
  ModelId model_id;
  std::string extra;                  // feeds key[0], see chain_key.h
  std::span<const uint32_t> tokens;   // borrowed for the call
  std::span<const MultimodalRef> mm;  // sorted by position
  uint32_t block_tokens = 256;
  bool want_swa = true;
  // Take a read lease on every hit (and the SWA entry) so they cannot be
  // evicted before the fetch; lease_ttl 0 means the store's default (10 s).
  bool take_lease = false;
  Nanos lease_ttl = 0;
};

// The same, by chain keys key[1..n] already derived by the caller.
struct MatchKeysRequest {
  ModelId model_id;
  ChainKey root;  // key[0], reported back as prefix_key when nothing hits
  std::span<const ChainKey> keys;
  uint32_t block_tokens = 256;
  bool want_swa = true;
  bool take_lease = false;
  Nanos lease_ttl = 0;
  // Look every key up on its own: a miss does not end the lookup, and
  // `blocks` are the hits in request order (identified by key), not a
  // leading run. For a cluster, where a node holds only some of a prompt's
  // blocks; SWA state is searched below the last hits as usual.
  bool independent_keys = false;
  // With take_lease: SSD-only hits are read into DRAM before the answer and
  // leased like DRAM hits (Tier::kDram, with a location). A node does this
  // for remote callers, which can only read DRAM. A block that cannot be
  // promoted (no DRAM room, corrupt) ends the hit run.
  bool promote_ssd = false;
};

struct BlockMatch {
  ChainKey key;
  Tier tier = Tier::kDram;
  uint32_t layout_id = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // entry checksum (xxh3 of the payload header)
  // Where the bytes sit in the serving node's DRAM arena (offset from its
  // start); meaningful only while the match's lease holds the entry. Remote
  // clients read from there over the data plane.
  uint64_t location = 0;
};

struct SwaMatch {
  uint32_t boundary_blocks = 0;  // state after this many blocks
  BlockMatch entry;
};

struct MatchResult {
  ModelId model_id;
  uint32_t block_tokens = 0;
  uint32_t prompt_blocks = 0;      // full blocks in the prompt
  std::vector<BlockMatch> blocks;  // leading run of GLOBAL_KV hits, from block 0
  ChainKey prefix_key;             // key[blocks.size()]: parent of the first missing block
  std::optional<SwaMatch> swa;     // deepest boundary <= blocks.size() with SWA state
  LeaseId lease = 0;               // read lease over blocks and swa; release with Abort
  Nanos lease_expiry = 0;

  uint64_t hit_tokens() const { return uint64_t{block_tokens} * blocks.size(); }
};

// ---- fetch ------------------------------------------------------------------

struct FetchEvent {
  enum class Type : uint8_t {
    kGroupReady,      // `group` of `block` arrived and passed its checksum
    kLayerGroupDone,  // `group` is ready in every block of the usable prefix
    kBlockReady,      // every group of `block` is ready
    // The SWA state arrived and passed its checksums. It comes ahead of the
    // bodies (a worker needs it, with layer group 0, before layer 0), so it
    // is only good with the prefix under it: a fetch that then ends short of
    // the SWA boundary voids it (FetchOutcome::swa_ready false).
    kSwaReady,
  };
  Type type;
  uint32_t block = 0;
  uint32_t group = 0;
};

struct FetchRequest {
  const MatchResult* match = nullptr;
  // One buffer per block to fetch (a prefix of match->blocks), each at least
  // that block's payload_bytes.
  std::vector<std::span<std::byte>> block_buffers;
  // The match's SWA state, which needs the blocks up to its boundary in
  // block_buffers (it is only good with that prefix); empty: skip it.
  std::span<std::byte> swa_buffer;
  // Called as bytes become usable, from the thread doing the transfer.
  std::function<void(const FetchEvent&)> on_event;
};

struct FetchOutcome {
  uint32_t blocks_ready = 0;  // usable prefix: blocks [0, blocks_ready) are verified
  bool swa_ready = false;     // verified, and the prefix up to its boundary arrived
  uint64_t bytes = 0;
  Status status;  // first failure that cut the prefix short, OK otherwise
};

// The option checks every match makes (a node checks them as it decodes a
// request, before the request changes anything): block_tokens within
// kMinBlockTokens..kMaxBlockTokens, a lease ttl within 0..kMaxLeaseTtl, and
// at most kMaxBlocksPerCall blocks.
Status CheckMatchOptions(uint32_t block_tokens, Nanos lease_ttl, size_t blocks);

// The argument checks every Store::Fetch makes: a match, no more buffers
// than hit blocks, each big enough, and an SWA buffer that fits, with the
// blocks up to the SWA boundary asked for too. Sets *want_swa (an SWA
// buffer was given and the match has SWA state).
Status CheckFetchRequest(const FetchRequest& req, bool* want_swa);

// The body half of a verified fetch, for a store that can address the
// stored bytes (in-process, or a node's arena mapped into this process):
// copies layer group g of every block before group g + 1 of any, hashing
// each group as it is copied, and reports kGroupReady, kLayerGroupDone and
// kBlockReady. The blocks' headers are verified already. Returns how many
// leading blocks arrived whole; on a checksum failure `*failure` names the
// block and group where the prefix stopped. `after_group(g)` runs after
// each pass. With a `pool`, a large copy is split across its threads (the
// events still come from the calling thread, in the same order).
struct VerifiedCopy {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  const PayloadHeader* header = nullptr;
};
struct CopyFailure {
  size_t block = 0;
  size_t group = 0;
};
size_t CopyVerifiedBodies(std::span<const VerifiedCopy> blocks,
                          const std::function<void(const FetchEvent&)>& on_event, uint64_t* bytes,
                          std::optional<CopyFailure>* failure,
                          const std::function<void(size_t group)>& after_group = nullptr,
                          CopyPool* pool = nullptr);

// Completes once; Wait() may be called from any thread, any number of times.
class FetchFuture {
 public:
  FetchFuture() : state_(std::make_shared<State>()) {}
  static FetchFuture Ready(FetchOutcome outcome);

  // A copy, so it outlives the future (a reference into a temporary
  // future would dangle).
  FetchOutcome Wait() const;
  bool IsReady() const;
  void Complete(FetchOutcome outcome);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    FetchOutcome outcome;
  };
  std::shared_ptr<State> state_;
};

// ---- commit -----------------------------------------------------------------

struct CommitBlock {
  ChainKey key;
  StateKind kind = StateKind::kGlobalKv;
  uint32_t layout_id = 0;
  uint64_t payload_bytes = 0;
  // GLOBAL_KV: key of the previous block (key[i] for block i); absent for
  // block 0. A block is only published when its parent is present, so a
  // stored descendant always has its ancestors.
  std::optional<ChainKey> parent;
};

enum class ReserveState : uint8_t {
  kReserved,        // write the payload into `buffer`, then publish
  kAlreadyPresent,  // committed already; nothing to write (idempotent commit)
  kInFlight,        // another writer holds it; nothing to write
};

struct ReservedBlock {
  ReserveState state = ReserveState::kReserved;
  // Only for kReserved; valid until publish or abort, and no longer than the
  // write lease: an expired reservation's space goes to other entries
  // (renew the lease for a long write; a stale write then fails the other
  // entry's checksum, and that entry is dropped).
  std::span<std::byte> buffer;
};

struct Reservation {
  LeaseId write_lease = 0;  // 0 when nothing needed writing
  Nanos expiry = 0;
  std::vector<ReservedBlock> blocks;
};

struct PublishResult {
  // Per block of the reservation: OK when visible (or already present),
  // else why it was dropped (CHECKSUM_MISMATCH, INVALID_ARGUMENT, NOT_FOUND
  // for a missing parent).
  std::vector<Status> blocks;
  uint32_t published = 0;
  // Cluster stores: per block, how many replicas hold it after the call
  // (writes are best effort: fewer than R when a replica failed, and
  // `blocks` says OK when at least one did). Empty for a single store.
  std::vector<uint32_t> replicas;
};

// One block for the single-call Commit: metadata, bytes and their checksum
// (the entry checksum returned by SealPayload).
struct CommitPayload {
  CommitBlock block;
  std::span<const std::byte> bytes;
  uint64_t checksum = 0;
};

// The blocks of a commit, each checked to carry the bytes it declares:
// what every Store::Commit reserves.
Result<std::vector<CommitBlock>> CommitBlocksOf(std::span<const CommitPayload> payloads);

}  // namespace strata

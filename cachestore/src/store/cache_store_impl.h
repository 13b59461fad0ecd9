// CacheStore::Impl: the in-process store's state, shared by the files of
// cachestore/src/store/ that implement it (one concept each).
//
// Locking, in the only order locks are ever nested:
//   structure_mu  ->  one shard's mutex  ->  leaf locks (arena, lease table,
//                                            layout and namespace tables)
//  - structure_mu guards everything that changes what exists: inserting and
//    erasing index entries, the eviction policy, the prefix tree, TTL queues
//    and the entry pool. Writers (reserve, publish, evict, delete) hold it.
//  - Each shard's shared_mutex guards its map. Readers (match, fetch) take
//    it shared, one shard at a time, and never hold structure_mu while
//    hashing or copying; so lookups of many clients run in parallel. A map
//    changes only under structure_mu *and* its shard's lock held
//    exclusively, so a thread holding structure_mu reads the maps without
//    shard locks (IndexedUnderStructureMu): the commit path does.
//  - A reader pins what it found (Entry::leases or ::readers) while holding
//    the shard lock; an eviction re-checks those counters under the same
//    shard lock held exclusively, so a pinned entry is never taken away.
//  - Entries are recycled, never freed, while the store lives (EntryPool):
//    a reader that lets go of a pin re-checks the generation under
//    structure_mu before acting on the entry.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/container/inlined_vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "eviction/entry.h"
#include "eviction/eviction_policy.h"
#include "eviction/tenant_share_policy.h"
#include "ssd/ssd_tier.h"
#include "store/dram_arena.h"
#include "store/lease_table.h"
#include "strata/cache_store.h"
#include "util/copy_pool.h"
#include "util/mutex.h"

namespace strata {

class FetchPrefix;

inline constexpr size_t kMaxVictimScan = 4096;
// How many boundaries below the hit run match looks for SWA state. Bounded
// replay makes a far-back state worth little next to replaying W tokens.
inline constexpr uint32_t kSwaSearchBoundaries = 16;
// SSD entries promoted into DRAM per read batch: enough to keep the SSD's
// queue full, few enough that one batch's DRAM stays small.
inline constexpr size_t kPromoteBatch = 64;
// How long a promotion waits for another caller's promotion of an earlier
// block of its chain before publishing its own (unlinked) anyway.
inline constexpr auto kParentPromotionWait = std::chrono::seconds(2);

inline bool RoleAllows(const Principal& p, Role needed) {
  return static_cast<uint8_t>(p.role) >= static_cast<uint8_t>(needed);
}

inline Status CheckCaller(const Principal& p, Role needed) {
  STRATA_RETURN_IF_ERROR(ValidateNamespace(p.ns));
  if (!RoleAllows(p, needed)) {
    return PermissionDenied("caller in namespace '" + p.ns + "' lacks the required role");
  }
  return Status::Ok();
}

inline double SecondsSince(const Clock& clock, Nanos start) {
  return static_cast<double>(clock.Now() - start) / kNanosPerSecond;
}

struct CacheStore::Impl {
  struct alignas(64) Shard {
    mutable SharedMutex mu;
    // Open addressing: a lookup is one probe of inline keys, not a chase
    // through heap nodes (the node-based map was 20% of a metadata replay).
    absl::flat_hash_map<EntryKey, Entry*, EntryKeyHash> map ABSL_GUARDED_BY(mu);
  };
  struct Metrics {
    Counter* match_requests;
    Counter* match_tokens;
    Counter* hit_tokens;
    Counter* hit_bytes;
    Histogram* lookup_seconds;
    Counter* fetch_bytes;
    Histogram* fetch_seconds;
    Histogram* first_group_seconds;
    Counter* commit_bytes;
    Counter* commit_entries;
    Counter* evictions[static_cast<size_t>(EvictReason::kCount)];
    Counter* checksum_failures;
    Counter* leases_expired_read;
    Counter* leases_expired_write;
    Gauge* leases_live_read;
    Gauge* leases_live_write;
    Gauge* used_bytes;
    Gauge* capacity_bytes;
    Gauge* entries_global;
    Gauge* entries_swa;
  };

  CacheStoreOptions opts;
  const Clock* clock = nullptr;
  std::unique_ptr<MetricsRegistry> owned_metrics;
  MetricsRegistry* registry = nullptr;
  Metrics m{};
  std::unique_ptr<DramArena> arena;
  std::unique_ptr<CopyPool> copy_pool;  // Fetch's verified copies

  mutable Mutex structure_mu;
  std::unique_ptr<EvictionPolicy> policy ABSL_GUARDED_BY(structure_mu);
  TenantSharePolicy* shares = nullptr;  // `policy`, when committed shares are on
  EntryPool pool ABSL_GUARDED_BY(structure_mu);
  // Per kind, in expiry order.
  Entry* ttl_head[2] ABSL_GUARDED_BY(structure_mu) = {nullptr, nullptr};
  Entry* ttl_tail[2] ABSL_GUARDED_BY(structure_mu) = {nullptr, nullptr};
  uint64_t reserved_entries ABSL_GUARDED_BY(structure_mu) = 0;
  uint64_t reserved_bytes ABSL_GUARDED_BY(structure_mu) = 0;  // their extents
  // Deleted while pinned: out of the index (the key is free for a new
  // entry), freed by their last unpin.
  absl::flat_hash_set<Entry*> deleting ABSL_GUARDED_BY(structure_mu);
  // Their keys, counted: no SSD copy of one is promoted meanwhile (a
  // write-back pinning a deleted entry writes its copy, then erases it).
  absl::flat_hash_map<EntryKey, uint32_t, EntryKeyHash> deleting_keys ABSL_GUARDED_BY(structure_mu);
  std::atomic<uint64_t> payload_bytes{0};
  std::atomic<uint64_t> evictions[static_cast<size_t>(EvictReason::kCount)] = {};

  std::unique_ptr<Shard[]> shards;
  uint32_t shard_mask = 0;
  LeaseTable leases;

  mutable SharedMutex layouts_mu;
  // Never erased: pointers stay valid.
  std::unordered_map<uint32_t, Layout> layouts ABSL_GUARDED_BY(layouts_mu);

  mutable SharedMutex ns_mu;
  std::unordered_map<std::string, uint32_t> ns_ids ABSL_GUARDED_BY(ns_mu);
  std::vector<std::string> ns_names ABSL_GUARDED_BY(ns_mu);
  // By namespace id (grown under ns_mu; elements never move): the extents
  // its read leases pin, each entry once, kept as an entry's lease count
  // goes 0 -> 1 and back. Signed: a release may subtract before the add of
  // the grant it follows lands.
  std::deque<std::atomic<int64_t>> ns_lease_pinned;
  // By namespace id, likewise: what it stores and looked up, for the Stats
  // its tenant sees (NamespaceUsage). Signed: an add may land after the
  // subtraction of a later change.
  struct NamespaceCounters {
    std::atomic<int64_t> global_kv_entries{0};
    std::atomic<int64_t> swa_entries{0};
    std::atomic<int64_t> used_bytes{0};  // committed entries' extents
    std::atomic<uint64_t> match_requests{0};
    std::atomic<uint64_t> match_tokens{0};
    std::atomic<uint64_t> hit_tokens{0};
    std::atomic<uint64_t> hit_bytes{0};
    std::atomic<uint64_t> evictions[static_cast<size_t>(EvictReason::kCount)] = {};
  };
  std::deque<NamespaceCounters> ns_counters;

  std::thread maintenance;
  Mutex maintenance_mu;
  std::condition_variable maintenance_cv;
  bool stopping ABSL_GUARDED_BY(maintenance_mu) = false;
  uint64_t maintenance_runs ABSL_GUARDED_BY(maintenance_mu) = 0;

  // ---- SSD tier (see ssd_tier.h) -------------------------------------------
  std::unique_ptr<SsdTier> ssd;
  mutable Mutex wb_mu;
  std::condition_variable wb_cv;       // work queued, or stopping
  std::condition_variable wb_idle_cv;  // queue drained
  std::deque<EntryRef> wb_queue ABSL_GUARDED_BY(wb_mu);
  size_t wb_busy ABSL_GUARDED_BY(wb_mu) = 0;  // entries taken, not yet written
  bool wb_stopping ABSL_GUARDED_BY(wb_mu) = false;
  std::thread wb_thread;
  std::atomic<uint64_t> wb_dropped{0};
  std::atomic<uint64_t> promotions_done{0};
  Counter* ssd_promotions = nullptr;
  Counter* ssd_wb_dropped = nullptr;
  Gauge* ssd_wb_pending = nullptr;
  // One SSD read per entry however many fetches want it at once.
  struct Promotion {
    Mutex mu;
    std::condition_variable cv;
    bool done ABSL_GUARDED_BY(mu) = false;
    Status status ABSL_GUARDED_BY(mu);
  };
  Mutex promo_mu;
  std::unordered_map<EntryKey, std::shared_ptr<Promotion>, EntryKeyHash> promotions
      ABSL_GUARDED_BY(promo_mu);
  // Admin calls that read the SSD tier (a list page, evict by filter) do so
  // before they take structure_mu: a scan under it would stall every
  // commit meanwhile. An entry written back after the scan read the tier
  // and dropped from DRAM (evicted, expired, corrupt) before the call's
  // DRAM pass would then be missed by both, so while scans run, entries
  // that leave DRAM keeping an SSD copy are logged, and each scan reads
  // its part of the log back by key (ScanSsdThenLock). All structure_mu.
  std::deque<EntryKey> demoted ABSL_GUARDED_BY(structure_mu);
  // Log position of demoted.front().
  uint64_t demoted_base ABSL_GUARDED_BY(structure_mu) = 0;
  // Per running scan: the position it reads on from.
  std::multiset<uint64_t> scan_starts ABSL_GUARDED_BY(structure_mu);
  std::function<void()> after_ssd_scan;            // test hook, set before any call
  std::function<void()> before_write_back;         // test hook, set before any call
  std::function<void()> after_write_back_write;    // test hook, likewise
  std::function<void()> before_promotion_publish;  // test hook, likewise

  uint64_t DemotedEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu) {
    return demoted_base + demoted.size();
  }
  void LogLeftDram(const EntryKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu) {
    if (!scan_starts.empty() && SsdAdmits(k.kind)) demoted.push_back(k);
  }
  // A scan moves its read position from `from` to `to` (kNoScan: none).
  static constexpr uint64_t kNoScan = UINT64_MAX;
  void MoveSsdScan(uint64_t from, uint64_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  std::string NamespaceName(uint32_t id) const;

  bool SsdAdmits(StateKind kind) const {
    return ssd != nullptr && (kind == StateKind::kGlobalKv || opts.ssd_swa_state);
  }

  // Queues a committed entry for write-back; drops it (counted) when full.
  void EnqueueWriteBack(Entry* e);

  void WriteBackLoop();

  // Writes a batch of DRAM entries to the SSD tier, each pinned as a reader
  // meanwhile. Entries gone since they were queued are skipped. Each is
  // verified first: the SSD tier checksums what it is given, so bytes that
  // went bad in DRAM after their publish would otherwise become an SSD copy
  // that passes every later check (and a DRAM checksum failure deliberately
  // keeps the SSD copy, as the good one).
  void WriteBack(const std::vector<EntryRef>& batch);

  // Deletes entries (and their subtrees) whose bytes failed verification:
  // never served again. The caller still holds, and drops, its pins.
  void DropCorrupt(const std::vector<EntryRef>& corrupt);

  // Whether a committed, unexpired entry is under `k` now (no pin).
  bool InDram(const EntryKey& k, Nanos now) const;

  // A committed entry under `k`, pinned as a reader; none if absent.
  EntryRef PinReader(const EntryKey& k, Nanos now);

  // The entry pinned as a reader, from DRAM, or promoted from the SSD tier
  // (one read shared by every concurrent caller). NOT_FOUND on a miss.
  Result<EntryRef> PinOrPromote(const EntryKey& k, const ModelId& model,
                                const std::optional<ChainKey>& parent, Nanos now);

  // PinOrPromote for several entries (parents[i]: the chain parent of
  // keys[i], linked when in DRAM). The SSD-only ones are read in batches
  // (one io_uring submission each) rather than one after another, and
  // published in order, so a block promoted with its parent links to it.
  std::vector<Result<EntryRef>> PinOrPromoteMany(std::span<const EntryKey> keys,
                                                 std::span<const std::optional<ChainKey>> parents,
                                                 const ModelId& model, Nanos now);

  // Pins (promoting from the SSD tier where needed) the global KV entries of
  // match.blocks[b] for b in `which`; each block's chain parent is the
  // block before it.
  std::vector<Result<EntryRef>> PromoteBlocks(uint32_t ns, const MatchResult& match,
                                              std::span<const size_t> which, Nanos now);

  // Promotes keys[i] for i in `which` (in order): reserves a DRAM entry for
  // each, reads them all in one SSD batch, then publishes them pinned for
  // the caller. Results go to results[i].
  void PromoteBatch(std::span<const EntryKey> keys,
                    std::span<const std::optional<ChainKey>> parents, const ModelId& model,
                    Nanos now, std::span<const size_t> which,
                    std::vector<Result<EntryRef>>& results);

  SsdKey SsdKeyOf(const EntryKey& k, const ModelId& model) const {
    return {NamespaceName(k.ns), model, k.chain, k.kind};
  }

  // Reserves a DRAM entry for an SSD entry (invisible while its bytes
  // arrive). nullptr: the key is in DRAM already (committed meanwhile).
  Result<Entry*> Stage(const EntryKey& k, const ModelId& model, Nanos now);

  // Publishes a staged entry once its read finished (`read`), pinned as a
  // reader for the caller; erases it when the read failed.
  Result<EntryRef> Publish(Entry* e, const Status& read, const std::optional<ChainKey>& parent,
                           Nanos now);

  // ---- small lookups ------------------------------------------------------

  Shard& ShardFor(const EntryKey& k) const { return shards[EntryKeyHash{}(k)&shard_mask]; }

  const Layout* FindLayout(uint32_t id) const;

  std::optional<uint32_t> FindNamespace(const std::string& ns) const;

  NamespaceCounters& CountersOf(uint32_t ns);
  const NamespaceCounters& CountersOf(uint32_t ns) const;

  std::atomic<int64_t>* LeasePinnedBytes(uint32_t ns);

  uint64_t ReadPinnedBytes(uint32_t ns) const;

  uint64_t HeldBytesLimit() const;

  // What namespace `ns` (interned) may hold through leases; the grant checks it.
  LeaseLimits LeaseLimitsFor(uint32_t ns) {
    return {opts.max_leased_entries_per_namespace, HeldBytesLimit(), LeasePinnedBytes(ns)};
  }

  // Why `entries` more leased entries and `bytes` more held bytes would
  // take namespace `ns` past its lease limits; empty if they would not.
  // For early refusals, before anything is pinned or reserved (and before
  // a reservation evicts other entries to make room); LeaseTable::Grant
  // makes the exact check.
  std::string PastLeaseLimits(uint32_t ns, uint64_t entries, uint64_t bytes) const;

  // What namespace `ns` (interned) holds through leases and pins, against
  // its limits.
  LeaseHolding HoldingOf(uint32_t ns) const;

  // What a reservation of `blocks` would take now: the entries and extent
  // bytes of those not present, in flight or repeated in the batch; and
  // what making room for them must not evict (`keep`, sorted): the blocks
  // found present (the caller will not send them) and the stored parents
  // the batch names (its Publish needs each). Changes nothing.
  struct ReserveNeed {
    uint64_t entries = 0;
    uint64_t bytes = 0;
    absl::InlinedVector<const Entry*, 8> keep;  // most batches keep one parent
  };
  ReserveNeed ComputeReserveNeed(uint32_t ns, std::span<const CommitBlock> blocks, Nanos now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Bytes of the tier no eviction can free now: reservations, and entries
  // read leases pin.
  uint64_t UnevictableBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // How many more entries namespace `ns` may lease now: a leased match
  // stops its hit run there (a shorter prefix, not a refusal). Advisory;
  // LeaseTable::Grant makes the exact check. RESOURCE_EXHAUSTED if not one.
  Result<uint64_t> LeaseRoom(const std::string& ns) const;

  // A lease or pin refused for namespace `ns`'s limits, and what to do
  // about it.
  static Status LeaseRefused(const std::string& ns, const std::string& why);

  uint32_t InternNamespace(const std::string& ns);

  // The id an admin listing or eviction looks for in DRAM; none if there is
  // nothing to look at. With an SSD tier a namespace this process never
  // interned may still have copies: an id no DRAM entry has stands for it
  // (interning would keep a mistyped name in Namespaces() until restart).
  std::optional<uint32_t> NamespaceForAdmin(const std::string& ns) const;
  static constexpr uint32_t kUnseenNamespace = UINT32_MAX;
  // Replaces kUnseenNamespace with the namespace's id if it has one now.
  // Under structure_mu: no DRAM entry of it can appear until that is let go.
  void ResolveUnseen(const std::string& ns, uint32_t* id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  Nanos TtlFor(StateKind kind) const {
    return kind == StateKind::kGlobalKv ? opts.global_kv_ttl : opts.swa_ttl;
  }

  // A committed, unexpired entry under `k`, or nullptr. Caller holds the
  // shard lock.
  Entry* FindVisible(const Shard& shard, const EntryKey& k, Nanos now) const
      ABSL_SHARED_LOCKS_REQUIRED(shard.mu);
  static Entry* VisibleOrNull(Entry* e, Nanos now);

  // The entry indexed under `k`, or nullptr, for a caller holding
  // structure_mu, without its shard's lock: every insert into or erase from
  // a shard's map, and every change of an entry's state or expiry, happens
  // under structure_mu, so nothing changes them meanwhile (matches and
  // fetches only read). Spares the commit path a lock round trip per block.
  // The thread-safety analysis cannot see that rule: it skips the body.
  Entry* IndexedUnderStructureMu(const EntryKey& k) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  Entry* VisibleUnderStructureMu(const EntryKey& k, Nanos now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu) {
    return VisibleOrNull(IndexedUnderStructureMu(k), now);
  }

  // ---- structure changes (structure_mu held) --------------------------------

  void TtlUnlink(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  void TtlAppend(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  void TreeLink(Entry* child, Entry* parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  void TreeUnlink(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // An entry of namespace `ns` left DRAM for `reason`: the node's counters
  // and the namespace's.
  void CountEviction(EvictReason reason, uint32_t ns);

  void CountEntry(const Entry* e, int delta);

  // Removes an entry with no pins from every structure and frees its bytes.
  // Removes an entry that nobody can pin any more (reserved, or found
  // unpinned under its shard lock) from every structure and frees its bytes.
  void EraseEntry(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Takes `e` out of the index; a kDeleting entry left it when it turned
  // so, and its key may name a newer entry now. Caller holds the shard
  // lock exclusively.
  static void Unindex(Shard& shard, const Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    if (e->state.load() != EntryState::kDeleting) shard.map.erase(e->key);
  }

  // Turns a pinned entry kDeleting: invisible and out of the index at once,
  // so the key can be stored again while the pins last. Caller holds the
  // shard lock exclusively.
  void MarkDeleting(Shard& shard, Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu, shard.mu);

  // Erases a reserved entry whose write lease ended or whose commit failed.
  // A data-plane receive may still pin it (PinLeasedRange): then it turns
  // kDeleting, invisible, and the last Unpin frees it, so bytes still landing
  // never land in an entry that reused the extent.
  void EraseReserved(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Erases `e` unless a lease or reader holds it. The check and the removal
  // from the index share one exclusive critical section: once the lock is
  // dropped no reader can find the entry, so none can pin it in between.
  bool EraseIfUnpinned(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // The rest of an erase, after the entry left the index.
  void ForgetUnindexed(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Deletes one committed entry without children; a pinned one becomes
  // kDeleting and goes when its last pin does.
  void DeleteLeaf(Entry* e, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Deletes `root` and every descendant, leaves first. Iterative: chains
  // can be far deeper than the stack. Returns how many entries went.
  uint64_t DeleteSubtree(Entry* root, EvictReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  bool Evictable(const Entry& e, Nanos now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Evicts one victim, never one of `keep` (sorted); false when nothing may
  // go. `room`: the namespace it makes room for, when committed shares are
  // on (TenantSharePolicy).
  bool EvictOne(EvictReason reason, Nanos now, uint64_t incoming_bytes = 0,
                std::span<const Entry* const> keep = {},
                std::optional<TenantSharePolicy::Room> room = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  uint64_t EvictToWatermark(Nanos now, std::span<const Entry* const> keep = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // An extent of `bytes` for namespace `room.ns`, which already has
  // `room.bytes` of them in the making; evicts to make room.
  std::optional<Extent> AllocateExtent(uint64_t bytes, Nanos now, TenantSharePolicy::Room room,
                                       std::span<const Entry* const> keep = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Why no extent of `bytes` could be had for namespace `room.ns`.
  std::string NoRoom(uint64_t bytes, const TenantSharePolicy::Room& room) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // ---- pins ---------------------------------------------------------------

  // Called after dropping a lease or reader pin: finishes a deferred delete.
  void MaybeReclaim(const EntryRef& ref);

  // Drops one pin. The decrement and the state check happen under the shard
  // lock: a delete holds it exclusively while it reads the pins and marks
  // the entry kDeleting, so either it sees this pin gone and erases, or this
  // sees kDeleting and reclaims. Never neither.
  void Unpin(const EntryRef& ref, bool lease);

  void EndLease(LeaseRecord& rec, bool expired);

  Status ValidateCommitBlock(const CommitBlock& b) const;

  void MaintenanceLoop();

  MaintenanceReport RunMaintenance();

  // The SSD pass (TTL expiry in expiry order, eviction to the watermarks):
  // every 10th background run (about a second), every explicit one.
  void MaybeRunSsdMaintenance(bool background);

  // ---- fetch (fetch.cc): CacheStore::Fetch's steps --------------------------

  // One fetch between its steps: what it was asked for, what it pinned,
  // and what failed verification.
  struct FetchRun {
    const FetchRequest& req;
    const MatchResult& match;
    uint32_t ns = 0;
    size_t n = 0;  // block buffers asked for
    bool want_swa = false;
    Nanos start = 0;
    FetchPrefix& prefix;
    FetchOutcome& out;
    std::vector<EntryRef> pinned{};        // the blocks, in order
    EntryRef swa_ref{};                    // the SWA entry, when pinned
    std::vector<Entry*> corrupt{};         // failed verification: dropped
    std::vector<PayloadHeader> headers{};  // of the blocks, once verified
  };

  // 1. Pins what the fetch will read: through the lease, or by looking keys
  // up. An error fails the fetch (the lease is not live, or a write lease).
  Status PinFetched(FetchRun& f);
  Status PinFetchedThroughLease(FetchRun& f);
  // The lease holds the DRAM blocks only; lines them up with the match and
  // promotes the SSD-only ones in between.
  void PromoteAroundLease(FetchRun& f);
  void PinFetchedByKey(FetchRun& f);

  // 2. Copies and checks each usable block's header.
  void VerifyFetchedHeaders(FetchRun& f);

  // 3. Copies and verifies the SWA state while its prefix stands; whether
  // it verified.
  bool CopyFetchedSwa(FetchRun& f);

  // 4. Copies and verifies the usable blocks' bodies.
  void CopyFetchedBodies(FetchRun& f);

  // 5. Drops what failed verification and lets go of every pin.
  void ReleaseFetched(FetchRun& f);

  // ---- commit (commit.cc): CacheStore::Reserve's and ::Publish's steps -----

  // Each block valid, and no larger than the whole tier.
  Status CheckReserveBlocks(std::span<const CommitBlock> blocks) const;
  // Refuses a reservation past the namespace's lease limits, or one that
  // would not fit even if every evictable entry went.
  Status CheckReserveNeed(const std::string& caller_ns, uint32_t ns, const ReserveNeed& need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Reserves an entry for each block not present or in flight, into `rec`
  // and `out`; on no room, erases those reserved and fails.
  Status ReserveEntries(uint32_t ns, const ModelId& model, std::span<const CommitBlock> blocks,
                        Nanos now, const ReserveNeed& need, LeaseRecord& rec, Reservation& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Erases the entries a failed reservation reserved.
  void UndoReservation(const LeaseRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Grants the write lease over the reserved entries; erases them if refused.
  Status GrantWriteLease(const std::string& caller_ns, uint32_t ns, LeaseRecord& rec,
                         Reservation& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // Takes write lease `lease` for a publish of `checksums` blocks: its
  // record, and the batch size it was granted with in `batch`.
  Result<LeaseRecord> TakeLeaseToPublish(uint32_t ns, LeaseId lease, Nanos now, size_t checksums,
                                         uint32_t* batch);
  // Each reserved entry's payload against its checksum (stored in it).
  std::vector<Status> VerifyReserved(const LeaseRecord& rec, std::span<const uint64_t> checksums);
  // Commits the entries that verified and whose parents are stored, erases
  // the rest (their failures in `out`); the committed ones.
  std::vector<Entry*> PublishReserved(uint32_t ns, const LeaseRecord& rec, Nanos now,
                                      std::vector<Status>& verdict, PublishResult& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Tells the eviction policy about the published entries and their
  // ancestors.
  void OrderPublished(const std::vector<Entry*>& published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);

  // ---- admin (admin.cc): CacheStore::Evict's steps -------------------------

  // Adds the committed entry under `k` to `roots`; false if there is none.
  bool FindEvictRoot(const EntryKey& k, Nanos now, std::vector<Entry*>& roots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Every committed entry of namespace `ns` the filter picks, but those
  // pinned or with a pinned descendant (counted in `report`).
  std::vector<Entry*> EvictRootsByFilter(uint32_t ns, const EntryFilter& filter, Nanos now,
                                         EvictReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  std::vector<Entry*> CloseOverDescendants(const std::vector<Entry*>& roots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Counts and lists the entries that go in `report`; their descriptions,
  // to erase their SSD copies by, when there is an SSD tier.
  std::vector<EntryInfo> ReportEvicted(const std::vector<Entry*>& affected, const std::string& ns,
                                       const EvictRequest& req, EvictReport& report) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  void DeleteRoots(const std::vector<Entry*>& roots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Deletes again the entries of `ssd_copies` found back in DRAM. Takes
  // structure_mu.
  void DeleteRepublished(uint32_t ns, const std::vector<EntryInfo>& ssd_copies, Nanos now);

  // ---- opening (cache_store.cc): CacheStore::Open's steps, run while Open
  // holds structure_mu (nobody else sees the store yet) ---------------------

  void InstallPolicy(std::unique_ptr<EvictionPolicy> base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  void RegisterMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  Status OpenSsdTier() ABSL_EXCLUSIVE_LOCKS_REQUIRED(structure_mu);
  // Open's last step, once the store owns this (structure_mu still held by
  // Open, through a pointer the analysis does not follow).
  void StartThreads();
};

// Finds a committed entry for an admin call; NOT_FOUND otherwise.
template <typename ImplT, typename Fn>
Status WithEntry(ImplT& s, const Principal& caller, const ChainKey& key, StateKind kind, Fn fn) {
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  const std::string what = std::string(StateKindName(kind)) + " entry " + key.ToHex();
  if (!ns.has_value()) return NotFound("no " + what);
  MutexLock lock(s.structure_mu);
  const EntryKey k{*ns, kind, key};
  Entry* e = nullptr;
  {
    auto& shard = s.ShardFor(k);
    ReaderLock slock(shard.mu);
    e = s.FindVisible(shard, k, s.clock->Now());
  }
  if (e == nullptr) return NotFound("no " + what);
  if constexpr (std::is_same_v<decltype(fn(e)), Status>) {
    return fn(e);
  } else {
    fn(e);
    return Status::Ok();
  }
}

}  // namespace strata

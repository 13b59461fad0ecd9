// CacheStore: the in-process store over the DRAM tier (DESIGN §3-§5).
// Multi-tenant: every call names the caller's Principal. Thread-safe; see
// "Locking" in cache_store.cc.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/arena_options.h"
#include "strata/clock.h"
#include "strata/layout.h"
#include "strata/metrics.h"
#include "strata/ssd_options.h"
#include "strata/status.h"
#include "strata/store_types.h"

namespace strata {

struct CacheStoreOptions {
  DramArenaOptions dram;
  // Eviction starts above high x capacity and stops below low x capacity.
  double high_watermark = 0.95;
  double low_watermark = 0.85;
  Nanos global_kv_ttl = Hours(72);
  Nanos swa_ttl = Minutes(10);
  Nanos default_read_lease_ttl = Seconds(10);
  Nanos default_write_lease_ttl = Seconds(30);
  // A lease renewed again and again still ends by this long after it was
  // granted (a renewal past it is refused): a client stuck renewing cannot
  // hold entries or reserved space for ever.
  Nanos max_lease_life = Hours(1);
  // Entries held by one namespace's live leases, read and write, at most
  // (each takes a pin and a little memory until the lease ends): a match
  // taking a lease or a reserve past it gets RESOURCE_EXHAUSTED, so no
  // tenant pins the whole store or grows the node without bound.
  uint64_t max_leased_entries_per_namespace = uint64_t{1} << 20;
  // The share of the DRAM tier one namespace's live leases may hold at once
  // (bytes of the entries its read leases pin and its write leases
  // reserve), in (0, 1]: past it a leased match or a reserve gets
  // RESOURCE_EXHAUSTED, so one tenant cannot leave the others no room to
  // commit. Admin pins of a namespace count with its leases (Pin refuses
  // past the share too). 1 = no limit but the tier's.
  double max_held_share_per_namespace = 1.0;
  // The share of the DRAM tier's committed bytes each namespace is owed, in
  // (0, 1]. Room for a namespace past its share is made from its own
  // entries first, and room for any other from the namespaces past theirs,
  // before the eviction policy chooses among everyone's; a namespace past
  // its share whose own entries are all pinned or leased gets
  // RESOURCE_EXHAUSTED rather than evict a tenant within its share. Within
  // a namespace the policy's order holds as far as its scan reaches, then
  // LRU (TenantSharePolicy). 1 = off: the policy alone decides.
  double committed_share_per_namespace = 1.0;
  std::string eviction_policy = "lru";  // "aslru", "deadline": docs/eviction-policy.md
  uint32_t index_shards = 64;           // a power of two
  // Threads that share one large fetch's verified copy, the caller
  // included; 0 = min(2, hardware threads).
  uint32_t copy_threads = 0;
  // Background expiry of leases and TTLs and watermark eviction; 0 leaves
  // it to explicit RunMaintenance() calls (tests with a ManualClock).
  Nanos maintenance_interval = 100 * kNanosPerMilli;
  const Clock* clock = nullptr;        // default: SteadyClock
  MetricsRegistry* metrics = nullptr;  // default: the store's own registry
  std::vector<Layout> extra_layouts;   // besides the built-in V4.1 layouts
  // The SSD tier (DESIGN §4); none when unset. Committed entries are written
  // back asynchronously; SSD-only blocks match as Tier::kSsd and a fetch
  // promotes them into DRAM.
  std::optional<SsdTierOptions> ssd;
  enum class SsdAdmission : uint8_t {
    kAllGlobalKv,  // every committed GLOBAL_KV entry
    kHitOnce,      // GLOBAL_KV entries once a match has hit them
  };
  SsdAdmission ssd_admission = SsdAdmission::kAllGlobalKv;
  bool ssd_swa_state = false;            // also write SWA state back (admitted like global KV)
  uint32_t ssd_writeback_batch = 32;     // entries per SSD write batch
  uint32_t ssd_writeback_queue = 65536;  // pending entries; more are dropped (counted)
};

enum class EvictReason : uint8_t { kCapacity, kWatermark, kTtl, kExplicit, kChecksum, kCount };
std::string_view EvictReasonName(EvictReason reason);

struct EntryInfo {
  ChainKey key;
  StateKind kind = StateKind::kGlobalKv;
  std::string ns;
  ModelId model_id;
  uint32_t layout_id = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
  Tier tier = Tier::kDram;
  Nanos commit_time = 0;
  Nanos expiry = 0;
  Nanos pinned_until = 0;
  uint32_t live_leases = 0;
  uint64_t hits = 0;
  bool has_parent = false;
  uint32_t children = 0;
};

// Which entries an admin listing or eviction covers, within the caller's
// namespace. Unset fields match everything.
struct EntryFilter {
  std::optional<ModelId> model_id;
  std::optional<StateKind> kind;
  Nanos older_than = 0;  // committed at least this long ago
  std::optional<bool> pinned;
  // kDram: entries in DRAM (an SSD copy or not); kSsd: SSD-only entries.
  std::optional<Tier> tier;
};

// A page of entries in (chain key, kind) order; `after` resumes a listing.
struct EntryCursor {
  ChainKey key;
  StateKind kind = StateKind::kGlobalKv;
};
struct EntryPage {
  std::vector<EntryInfo> entries;
  std::optional<EntryCursor> next;  // absent on the last page
};

struct EvictRequest {
  // With a root: that entry and, for GLOBAL_KV, every descendant (an
  // explicit eviction, pins notwithstanding). Without: every entry matching
  // the filter, and the descendants of GLOBAL_KV ones, except pinned entries
  // and their ancestors (a pinned entry must stay reachable).
  std::optional<EntryCursor> root;
  EntryFilter filter;
  bool dry_run = false;
  uint32_t max_listed = 1000;  // entries reported back, at most
};
struct EvictReport {
  uint64_t evicted = 0;         // gone now (or would go, on a dry run)
  uint64_t deferred = 0;        // leased or being read: invisible now, freed when released
  uint64_t skipped_pinned = 0;  // kept: pinned, or an ancestor of a pinned entry
  uint64_t bytes = 0;
  std::vector<EntryInfo> entries;  // the first max_listed affected entries
};

struct StoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;     // granule-rounded extents, committed and reserved
  uint64_t payload_bytes = 0;  // exact payload bytes of those extents
  uint64_t global_kv_entries = 0;
  uint64_t swa_entries = 0;
  uint64_t reserved_entries = 0;
  uint64_t deleting_entries = 0;
  uint64_t read_leases = 0;
  uint64_t write_leases = 0;
  std::array<uint64_t, static_cast<size_t>(EvictReason::kCount)> evictions{};
  bool huge_pages = false;
  // The SSD tier (all zero without one).
  bool ssd_enabled = false;
  SsdTierStats ssd;
  uint64_t ssd_writeback_pending = 0;  // queued or being written
  uint64_t ssd_writeback_dropped = 0;  // queue full
  uint64_t ssd_promotions = 0;         // SSD reads into DRAM
};

// What one namespace's live leases and pins hold against its limits
// (max_leased_entries_per_namespace, max_held_share_per_namespace).
struct LeaseHolding {
  // DRAM its read leases pin (each entry once), its write leases reserve,
  // and its admins pin: one cap on all three.
  uint64_t held_bytes = 0;
  uint64_t limit_bytes = 0;
  uint64_t leased_entries = 0;  // per lease: an entry in two leases counts twice
  uint64_t leased_entries_limit = 0;
};

// One namespace's own figures, what its tenant's Stats show: a tenant
// never sees another's, nor the node-wide totals (the operator's).
struct NamespaceStats {
  uint64_t global_kv_entries = 0;  // committed, in DRAM
  uint64_t swa_entries = 0;
  uint64_t used_bytes = 0;  // their extents
  uint64_t match_requests = 0;
  uint64_t match_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t hit_bytes = 0;
  std::array<uint64_t, static_cast<size_t>(EvictReason::kCount)>
      evictions{};  // of its DRAM entries
  LeaseHolding lease;
};

struct MaintenanceReport {
  uint64_t expired_read_leases = 0;
  uint64_t expired_write_leases = 0;
  uint64_t ttl_expired = 0;
  uint64_t evicted = 0;
};

class CacheStore {
 public:
  static Result<std::unique_ptr<CacheStore>> Open(CacheStoreOptions options);
  // Stops maintenance, ends every lease and reservation, frees the arena.
  ~CacheStore();
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;

  // ---- the contract -------------------------------------------------------
  Result<MatchResult> Match(const Principal& caller, const MatchRequest& request);
  // Match by chain keys the caller derived itself (ChainKeys::ForPrompt):
  // what a remote client sends instead of the tokens.
  Result<MatchResult> MatchKeys(const Principal& caller, const MatchKeysRequest& request);
  // Runs the transfer on the calling thread; the future is ready on return.
  FetchFuture Fetch(const Principal& caller, const FetchRequest& request);
  // Phase one of a commit: space for every block that needs it, all or
  // nothing, held by a write lease (ttl 0: the default).
  Result<Reservation> Reserve(const Principal& caller, const ModelId& model,
                              std::span<const CommitBlock> blocks, Nanos write_lease_ttl = 0);
  // Phase two: verifies each written payload against its checksum (one per
  // reservation block; ignored for blocks not reserved) and makes the good
  // ones visible. Ends the write lease.
  Result<PublishResult> Publish(const Principal& caller, LeaseId write_lease,
                                std::span<const uint64_t> checksums);
  // Reserve + copy + Publish in one call.
  Result<PublishResult> Commit(const Principal& caller, const ModelId& model,
                               std::span<const CommitPayload> payloads);
  // Extends a live lease to now + ttl (0: the default read or write lease
  // ttl, by the lease's kind; a write lease needs the write role);
  // RESOURCE_EXHAUSTED past max_lease_life after its grant. *applied_ttl,
  // if given, gets the ttl used.
  Status RenewLease(const Principal& caller, LeaseId lease, Nanos ttl,
                    Nanos* applied_ttl = nullptr);
  // Ends a read lease or drops a reservation (which needs the write role).
  // Unknown or ended leases are fine: abort is safe to repeat.
  Status Abort(const Principal& caller, LeaseId lease);

  // ---- admin --------------------------------------------------------------
  // Deletes an entry and, for GLOBAL_KV, every descendant (they could never
  // be matched again). Entries under a lease go when the lease ends.
  Status Delete(const Principal& caller, const ChainKey& key, StateKind kind);
  // Keeps an entry from eviction for `ttl`; RESOURCE_EXHAUSTED when the
  // namespace's pins and leases together would pass
  // max_held_share_per_namespace of the tier. A pin renewed counts once.
  Status Pin(const Principal& caller, const ChainKey& key, StateKind kind, Nanos ttl);
  Status Unpin(const Principal& caller, const ChainKey& key, StateKind kind);
  Result<EntryInfo> Inspect(const Principal& caller, const ChainKey& key, StateKind kind);
  Status RegisterLayout(const Layout& layout);

  // Admin listing and eviction by filter (role admin). A page holds about
  // `limit` entries: fewer, even none, while `next` is set (it stops where
  // its read of the SSD tier did), or more when copies of one (key, kind)
  // under several models would be split. Read on until `next` is absent.
  Result<EntryPage> ListEntries(const Principal& caller, const EntryFilter& filter,
                                const std::optional<EntryCursor>& after, uint32_t limit);
  Result<EvictReport> Evict(const Principal& caller, const EvictRequest& request);
  // Namespaces that have used this store (stored or looked anything up), for
  // cluster-wide admin views.
  std::vector<std::string> Namespaces() const;

  // ---- serving over a data plane (strata-node) -----------------------------
  // The DRAM arena: the node registers it once with the data plane, and
  // BlockMatch::location and reserved buffers are offsets into it.
  std::span<std::byte> ArenaRegion() const;
  // What the data plane asks before it moves any byte: OK when `lease` is a
  // live lease of the caller's namespace, a write lease iff `write`, holding
  // an entry whose payload covers [offset, offset+length) of the arena. The
  // entry is then pinned until ReleaseRangePin, so a transfer that outlives
  // its lease (expired or released meanwhile) still reads or writes bytes of
  // that entry, never of whatever would reuse them. Release every pin once.
  Result<RangePin> PinLeasedRange(const Principal& caller, LeaseId lease, uint64_t offset,
                                  uint64_t length, bool write);
  void ReleaseRangePin(const RangePin& pin);

  MaintenanceReport RunMaintenance();
  // Waits until every entry queued for SSD write-back has been written (or
  // failed). No-op without an SSD tier.
  void FlushWriteBack();
  StoreStats Stats() const;
  // The caller's namespace's leases against its limits.
  LeaseHolding Holding(const Principal& caller) const;
  // The caller's namespace's own figures (counted since the store opened).
  NamespaceStats NamespaceUsage(const Principal& caller) const;
  MetricsRegistry& metrics() { return *metrics_; }
  const Clock& clock() const { return *clock_; }

  // Test hook: the stored bytes of a committed entry, to corrupt them.
  std::span<std::byte> MutablePayloadForTesting(const Principal& caller, const ChainKey& key,
                                                StateKind kind);
  // Test hook: walks every structure and checks the invariants (occupancy
  // equals the sum of live extents, the tree is consistent, no leased or
  // reserved entry is in the policy).
  Status CheckInvariantsForTesting() const;
  // Test hook: runs in ListEntries and Evict by filter after they read the
  // SSD tier and before they take the store's structure lock. Set it before
  // any call that could run it.
  void SetAfterSsdScanHookForTesting(std::function<void()> hook);
  // Test hook: runs on the write-back thread before it takes each batch
  // from its queue (so what is queued while it runs joins that batch, up to
  // ssd_writeback_batch). Set it before any commit.
  void SetBeforeWriteBackHookForTesting(std::function<void()> hook);
  // Test hook: runs on the write-back thread once a batch is on the SSD
  // tier, before the copies of entries deleted meanwhile are erased.
  void SetAfterWriteBackWriteHookForTesting(std::function<void()> hook);
  // Test hook: runs after an SSD promotion's read batch, before its entries
  // are published. Set it before any call that could promote.
  void SetBeforePromotionPublishHookForTesting(std::function<void()> hook);

 private:
  struct Impl;
  class PrefixLookup;
  explicit CacheStore(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  const Clock* clock_;
  MetricsRegistry* metrics_;
};

}  // namespace strata

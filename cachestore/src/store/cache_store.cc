// CacheStore implementation.
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
#include "strata/cache_store.h"

#include "ssd/ssd_tier.h"
#include "store/dram_arena.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/container/inlined_vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <shared_mutex>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "eviction/entry.h"
#include "eviction/eviction_policy.h"
#include "eviction/tenant_share_policy.h"
#include "store/lease_table.h"
#include "util/copy_pool.h"

namespace strata {
namespace {

constexpr size_t kMaxVictimScan = 4096;
// How many boundaries below the hit run match looks for SWA state. Bounded
// replay makes a far-back state worth little next to replaying W tokens.
constexpr uint32_t kSwaSearchBoundaries = 16;
// SSD entries promoted into DRAM per read batch: enough to keep the SSD's
// queue full, few enough that one batch's DRAM stays small.
constexpr size_t kPromoteBatch = 64;
// How long a promotion waits for another caller's promotion of an earlier
// block of its chain before publishing its own (unlinked) anyway.
constexpr auto kParentPromotionWait = std::chrono::seconds(2);

bool RoleAllows(const Principal& p, Role needed) {
  return static_cast<uint8_t>(p.role) >= static_cast<uint8_t>(needed);
}

Status CheckCaller(const Principal& p, Role needed) {
  STRATA_RETURN_IF_ERROR(ValidateNamespace(p.ns));
  if (!RoleAllows(p, needed)) {
    return PermissionDenied("caller in namespace '" + p.ns + "' lacks the required role");
  }
  return Status::Ok();
}

double SecondsSince(const Clock& clock, Nanos start) {
  return static_cast<double>(clock.Now() - start) / kNanosPerSecond;
}

}  // namespace

std::string_view EvictReasonName(EvictReason reason) {
  switch (reason) {
    case EvictReason::kCapacity:
      return "capacity";
    case EvictReason::kWatermark:
      return "watermark";
    case EvictReason::kTtl:
      return "ttl";
    case EvictReason::kExplicit:
      return "explicit";
    case EvictReason::kChecksum:
      return "checksum";
    case EvictReason::kCount:
      break;
  }
  return "unknown";
}

struct CacheStore::Impl {
  struct alignas(64) Shard {
    mutable std::shared_mutex mu;
    // Open addressing: a lookup is one probe of inline keys, not a chase
    // through heap nodes (the node-based map was 20% of a metadata replay).
    absl::flat_hash_map<EntryKey, Entry*, EntryKeyHash> map;
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

  mutable std::mutex structure_mu;
  std::unique_ptr<EvictionPolicy> policy;   // structure_mu
  TenantSharePolicy* shares = nullptr;      // `policy`, when committed shares are on
  EntryPool pool;                           // structure_mu
  Entry* ttl_head[2] = {nullptr, nullptr};  // structure_mu; per kind, expiry order
  Entry* ttl_tail[2] = {nullptr, nullptr};
  uint64_t reserved_entries = 0;  // structure_mu
  uint64_t reserved_bytes = 0;    // structure_mu; their extents
  // Deleted while pinned: out of the index (the key is free for a new
  // entry), freed by their last unpin.
  absl::flat_hash_set<Entry*> deleting;  // structure_mu
  // Their keys, counted: no SSD copy of one is promoted meanwhile (a
  // write-back pinning a deleted entry writes its copy, then erases it).
  absl::flat_hash_map<EntryKey, uint32_t, EntryKeyHash> deleting_keys;  // structure_mu
  std::atomic<uint64_t> payload_bytes{0};
  std::atomic<uint64_t> evictions[static_cast<size_t>(EvictReason::kCount)] = {};

  std::unique_ptr<Shard[]> shards;
  uint32_t shard_mask = 0;
  LeaseTable leases;

  mutable std::shared_mutex layouts_mu;
  std::unordered_map<uint32_t, Layout> layouts;  // never erased: pointers stay valid

  mutable std::shared_mutex ns_mu;
  std::unordered_map<std::string, uint32_t> ns_ids;
  std::vector<std::string> ns_names;
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
  std::mutex maintenance_mu;
  std::condition_variable maintenance_cv;
  bool stopping = false;
  uint64_t maintenance_runs = 0;  // maintenance_mu

  // ---- SSD tier (see ssd_tier.h) -------------------------------------------
  std::unique_ptr<SsdTier> ssd;
  mutable std::mutex wb_mu;
  std::condition_variable wb_cv;       // work queued, or stopping
  std::condition_variable wb_idle_cv;  // queue drained
  std::deque<EntryRef> wb_queue;       // wb_mu
  size_t wb_busy = 0;                  // wb_mu; entries taken, not yet written
  bool wb_stopping = false;            // wb_mu
  std::thread wb_thread;
  std::atomic<uint64_t> wb_dropped{0};
  std::atomic<uint64_t> promotions_done{0};
  Counter* ssd_promotions = nullptr;
  Counter* ssd_wb_dropped = nullptr;
  Gauge* ssd_wb_pending = nullptr;
  // One SSD read per entry however many fetches want it at once.
  struct Promotion {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  std::mutex promo_mu;
  std::unordered_map<EntryKey, std::shared_ptr<Promotion>, EntryKeyHash> promotions;  // promo_mu
  // Admin calls that read the SSD tier (a list page, evict by filter) do so
  // before they take structure_mu: a scan under it would stall every
  // commit meanwhile. An entry written back after the scan read the tier
  // and dropped from DRAM (evicted, expired, corrupt) before the call's
  // DRAM pass would then be missed by both, so while scans run, entries
  // that leave DRAM keeping an SSD copy are logged, and each scan reads
  // its part of the log back by key (ScanSsdThenLock). All structure_mu.
  std::deque<EntryKey> demoted;
  uint64_t demoted_base = 0;                     // log position of demoted.front()
  std::multiset<uint64_t> scan_starts;           // per running scan: the position it reads on from
  std::function<void()> after_ssd_scan;          // test hook, set before any call
  std::function<void()> before_write_back;       // test hook, set before any call
  std::function<void()> after_write_back_write;  // test hook, likewise
  std::function<void()> before_promotion_publish;  // test hook, likewise

  uint64_t DemotedEndLocked() const { return demoted_base + demoted.size(); }
  void LogLeftDramLocked(const EntryKey& k) {
    if (!scan_starts.empty() && SsdAdmits(k.kind)) demoted.push_back(k);
  }
  // A scan moves its read position from `from` to `to` (kNoScan: none).
  static constexpr uint64_t kNoScan = UINT64_MAX;
  void MoveSsdScanLocked(uint64_t from, uint64_t to) {
    if (from != kNoScan) scan_starts.erase(scan_starts.find(from));
    if (to != kNoScan) scan_starts.insert(to);
    const uint64_t keep = scan_starts.empty() ? DemotedEndLocked() : *scan_starts.begin();
    for (; demoted_base < keep; ++demoted_base) demoted.pop_front();
  }

  std::string NamespaceName(uint32_t id) const {
    std::shared_lock lock(ns_mu);
    return id < ns_names.size() ? ns_names[id] : std::string();
  }

  bool SsdAdmits(StateKind kind) const {
    return ssd != nullptr && (kind == StateKind::kGlobalKv || opts.ssd_swa_state);
  }

  // Queues a committed entry for write-back; drops it (counted) when full.
  void EnqueueWriteBack(Entry* e) {
    {
      std::lock_guard lock(wb_mu);
      if (wb_queue.size() >= opts.ssd_writeback_queue) {
        wb_dropped.fetch_add(1);
        ssd_wb_dropped->Increment();
        return;
      }
      wb_queue.push_back({e, e->generation});
      ssd_wb_pending->Set(static_cast<int64_t>(wb_queue.size() + wb_busy));
    }
    wb_cv.notify_one();
  }

  void WriteBackLoop() {
    std::unique_lock lock(wb_mu);
    while (true) {
      wb_cv.wait(lock, [&] { return wb_stopping || !wb_queue.empty(); });
      if (wb_queue.empty()) return;  // stopping, and drained
      if (before_write_back) {       // before the batch is taken: a test's gate holds all it queues
        lock.unlock();
        before_write_back();
        lock.lock();
      }
      std::vector<EntryRef> batch;
      while (!wb_queue.empty() && batch.size() < opts.ssd_writeback_batch) {
        batch.push_back(wb_queue.front());
        wb_queue.pop_front();
      }
      wb_busy = batch.size();
      lock.unlock();
      WriteBack(batch);
      lock.lock();
      wb_busy = 0;
      ssd_wb_pending->Set(static_cast<int64_t>(wb_queue.size()));
      if (wb_queue.empty()) wb_idle_cv.notify_all();
    }
  }

  // Writes a batch of DRAM entries to the SSD tier, each pinned as a reader
  // meanwhile. Entries gone since they were queued are skipped. Each is
  // verified first: the SSD tier checksums what it is given, so bytes that
  // went bad in DRAM after their publish would otherwise become an SSD copy
  // that passes every later check (and a DRAM checksum failure deliberately
  // keeps the SSD copy, as the good one).
  void WriteBack(const std::vector<EntryRef>& batch) {
    std::vector<EntryRef> pinned;
    std::vector<SsdWrite> writes;
    {
      std::lock_guard lock(structure_mu);  // generations are read under it
      for (const EntryRef& ref : batch) {
        Entry* e = ref.entry;
        Shard& shard = ShardFor(e->key);
        std::shared_lock slock(shard.mu);
        if (e->generation != ref.generation || e->state.load() != EntryState::kCommitted) continue;
        e->readers.fetch_add(1);
        pinned.push_back(ref);
      }
    }
    const Nanos to_tier = ssd->Now() - clock->Now();
    // The copy's checksum is taken before the verification: bytes that
    // change after it fail the copy's first read, never pass it.
    std::vector<EntryRef> corrupt;
    std::vector<uint64_t> sums;
    for (size_t i = 0; i < pinned.size();) {
      const Entry* e = pinned[i].entry;
      const std::span<const std::byte> bytes = arena->Bytes(e->extent, e->payload_bytes);
      const uint64_t sum = Checksum64(bytes);
      if (VerifyPayload(*FindLayout(e->layout_id), bytes, e->checksum).ok()) {
        sums.push_back(sum);
        ++i;
        continue;
      }
      corrupt.push_back(pinned[i]);
      pinned.erase(pinned.begin() + static_cast<ptrdiff_t>(i));
    }
    DropCorrupt(corrupt);
    for (const EntryRef& ref : corrupt) Unpin(ref, /*lease=*/false);
    for (size_t i = 0; i < pinned.size(); ++i) {
      const Entry* e = pinned[i].entry;
      SsdWrite w;
      w.key = {NamespaceName(e->key.ns), e->model_id, e->key.chain, e->key.kind};
      w.payload = arena->Bytes(e->extent, e->payload_bytes);
      w.readable_bytes = e->extent.length;  // 4 KiB granules: written in place
      w.entry_checksum = e->checksum;
      w.layout_id = e->layout_id;
      w.commit_time = e->commit_time + to_tier;  // a copy, not a new entry
      w.data_checksum = sums[i];
      writes.push_back(std::move(w));
    }
    if (!writes.empty()) (void)ssd->WriteBatch(writes);  // failures are counted by the tier
    if (after_write_back_write) after_write_back_write();
    // Our reader pin kept capacity eviction away, so an entry deleted while
    // it was written went on purpose (Delete, Evict, TTL, checksum). Its
    // SSD copy goes too: the delete's own SSD erase may have run before the
    // copy existed. A delete after this check finds the copy and erases it.
    for (size_t i = 0; i < pinned.size(); ++i) {
      if (pinned[i].entry->state.load() == EntryState::kDeleting) (void)ssd->Erase(writes[i].key);
    }
    for (const EntryRef& ref : pinned) Unpin(ref, /*lease=*/false);
  }

  // Deletes entries (and their subtrees) whose bytes failed verification:
  // never served again. The caller still holds, and drops, its pins.
  void DropCorrupt(const std::vector<EntryRef>& corrupt) {
    if (corrupt.empty()) return;
    m.checksum_failures->Increment(corrupt.size());
    std::lock_guard lock(structure_mu);
    for (const EntryRef& ref : corrupt) {
      Entry* e = ref.entry;
      if (e->generation == ref.generation && e->state.load() == EntryState::kCommitted) {
        DeleteSubtreeLocked(e, EvictReason::kChecksum);
      }
    }
  }

  // Whether a committed, unexpired entry is under `k` now (no pin).
  bool InDram(const EntryKey& k, Nanos now) const {
    const Shard& shard = ShardFor(k);
    std::shared_lock lock(shard.mu);
    return FindVisibleLocked(shard, k, now) != nullptr;
  }

  // A committed entry under `k`, pinned as a reader; none if absent.
  EntryRef PinReader(const EntryKey& k, Nanos now) {
    Shard& shard = ShardFor(k);
    std::shared_lock lock(shard.mu);
    Entry* e = FindVisibleLocked(shard, k, now);
    if (e == nullptr) return {};
    e->readers.fetch_add(1);
    return {e, e->generation};
  }

  // The entry pinned as a reader, from DRAM, or promoted from the SSD tier
  // (one read shared by every concurrent caller). NOT_FOUND on a miss.
  Result<EntryRef> PinOrPromote(const EntryKey& k, const ModelId& model,
                                const std::optional<ChainKey>& parent, Nanos now) {
    return std::move(PinOrPromoteMany({&k, 1}, {&parent, 1}, model, now).front());
  }

  // PinOrPromote for several entries (parents[i]: the chain parent of
  // keys[i], linked when in DRAM). The SSD-only ones are read in batches
  // (one io_uring submission each) rather than one after another, and
  // published in order, so a block promoted with its parent links to it.
  std::vector<Result<EntryRef>> PinOrPromoteMany(std::span<const EntryKey> keys,
                                                 std::span<const std::optional<ChainKey>> parents,
                                                 const ModelId& model, Nanos now) {
    std::vector<Result<EntryRef>> results(keys.size(), NotFound("not stored"));
    std::vector<bool> leads(keys.size(), false);  // promotions this call runs
    std::vector<std::shared_ptr<Promotion>> promos(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (EntryRef ref = PinReader(keys[i], now); ref.entry != nullptr) {
        results[i] = ref;
        continue;
      }
      if (!SsdAdmits(keys[i].kind)) continue;
      std::lock_guard lock(promo_mu);
      auto [it, inserted] = promotions.try_emplace(keys[i]);
      if (inserted) {
        it->second = std::make_shared<Promotion>();
        leads[i] = true;
      }
      promos[i] = it->second;
    }
    // Promotes a run of leads in batches and hands each result to whoever
    // waits for it.
    std::vector<size_t> run;
    auto promote_run = [&] {
      for (size_t first = 0; first < run.size(); first += kPromoteBatch) {
        const size_t last = std::min(run.size(), first + kPromoteBatch);
        PromoteBatch(keys, parents, model, now, std::span(run).subspan(first, last - first),
                     results);
      }
      for (size_t i : run) {
        Promotion& p = *promos[i];
        {
          std::lock_guard lock(p.mu);
          p.done = true;
          p.status = results[i].ok() ? Status::Ok() : results[i].status();
        }
        p.cv.notify_all();
        std::lock_guard lock(promo_mu);
        promotions.erase(keys[i]);
        promos[i].reset();  // done: what is left are other callers' promotions
      }
      run.clear();
    };
    // Leads are promoted in runs split where another caller's promotion
    // comes before a later lead: that one is waited for first, so a block is
    // never published before a parent still on its way (it could not be
    // linked to it). The wait is bounded: callers that list shared keys in
    // different orders cannot wait for each other for good.
    size_t last_lead = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (leads[i]) last_lead = i;
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (leads[i]) {
        run.push_back(i);
      } else if (promos[i] != nullptr && i < last_lead) {
        promote_run();
        Promotion& p = *promos[i];
        std::unique_lock lock(p.mu);
        p.cv.wait_for(lock, kParentPromotionWait, [&] { return p.done; });
      }
    }
    promote_run();
    // Entries another caller was promoting: wait for that read.
    for (size_t i = 0; i < keys.size(); ++i) {
      if (promos[i] == nullptr) continue;
      Promotion& p = *promos[i];
      std::unique_lock lock(p.mu);
      p.cv.wait(lock, [&] { return p.done; });
      if (!p.status.ok()) {
        results[i] = p.status;
        continue;
      }
      lock.unlock();
      EntryRef ref = PinReader(keys[i], now);
      results[i] = ref.entry != nullptr
                       ? Result<EntryRef>(ref)
                       : NotFound("promoted entry was evicted before it could be read");
    }
    return results;
  }

  // Pins (promoting from the SSD tier where needed) the global KV entries of
  // match.blocks[b] for b in `which`; each block's chain parent is the
  // block before it.
  std::vector<Result<EntryRef>> PromoteBlocks(uint32_t ns, const MatchResult& match,
                                              std::span<const size_t> which, Nanos now) {
    std::vector<EntryKey> keys;
    std::vector<std::optional<ChainKey>> parents;
    for (size_t b : which) {
      keys.push_back({ns, StateKind::kGlobalKv, match.blocks[b].key});
      parents.push_back(b > 0 ? std::optional<ChainKey>(match.blocks[b - 1].key) : std::nullopt);
    }
    return PinOrPromoteMany(keys, parents, match.model_id, now);
  }

  // Promotes keys[i] for i in `which` (in order): reserves a DRAM entry for
  // each, reads them all in one SSD batch, then publishes them pinned for
  // the caller. Results go to results[i].
  void PromoteBatch(std::span<const EntryKey> keys,
                    std::span<const std::optional<ChainKey>> parents, const ModelId& model,
                    Nanos now, std::span<const size_t> which,
                    std::vector<Result<EntryRef>>& results) {
    std::vector<Entry*> staged(which.size(), nullptr);
    std::vector<SsdRead> reads;  // one per staged entry, in order
    for (size_t w = 0; w < which.size(); ++w) {
      Result<Entry*> e = Stage(keys[which[w]], model, now);
      if (!e.ok()) {
        results[which[w]] = e.status();
        continue;
      }
      if (*e == nullptr) {  // committed meanwhile: serve the DRAM copy
        EntryRef ref = PinReader(keys[which[w]], now);
        if (ref.entry == nullptr) {
          results[which[w]] = NotFound("entry is being committed");
        } else {
          results[which[w]] = ref;
        }
        continue;
      }
      staged[w] = *e;
      // The whole granule-rounded extent: with 4 KiB granules it is read
      // into directly (O_DIRECT), no bounce copy.
      reads.push_back(
          {SsdKeyOf(keys[which[w]], model), arena->Bytes((*e)->extent, (*e)->extent.length)});
    }
    const std::vector<Status> read = reads.empty() ? std::vector<Status>() : ssd->ReadBatch(reads);
    if (before_promotion_publish && !reads.empty()) before_promotion_publish();
    std::vector<const SsdKey*> used;
    for (size_t w = 0, r = 0; w < which.size(); ++w) {
      if (staged[w] == nullptr) continue;
      const size_t i = which[w];
      const SsdRead& done = reads[r];
      results[i] = Publish(staged[w], read[r++], parents[i], now);
      if (results[i].ok()) used.push_back(&done.key);
    }
    // Served from SSD: a use of each SSD copy, which now shadows DRAM.
    // Root last, so an ancestor stays younger than its descendants there.
    for (size_t u = used.size(); u-- > 0;) ssd->Touch(*used[u], SsdTouch::kUse);
  }

  SsdKey SsdKeyOf(const EntryKey& k, const ModelId& model) const {
    return {NamespaceName(k.ns), model, k.chain, k.kind};
  }

  // Reserves a DRAM entry for an SSD entry (invisible while its bytes
  // arrive). nullptr: the key is in DRAM already (committed meanwhile).
  Result<Entry*> Stage(const EntryKey& k, const ModelId& model, Nanos now) {
    const std::optional<SsdEntryMeta> meta = ssd->Lookup(SsdKeyOf(k, model));
    if (!meta.has_value()) return NotFound("not stored");
    const Layout* layout = FindLayout(meta->layout_id);
    if (layout == nullptr || layout->kind != k.kind ||
        layout->PayloadBytes() != meta->payload_bytes) {
      return NotFound("SSD entry has an unknown layout " + std::to_string(meta->layout_id));
    }
    std::lock_guard lock(structure_mu);
    if (deleting_keys.contains(k)) {
      return Unavailable("an entry under this key is being deleted");
    }
    Shard& shard = ShardFor(k);
    {
      std::shared_lock slock(shard.mu);
      if (shard.map.count(k) != 0) return nullptr;
    }
    std::optional<Extent> extent = AllocateLocked(meta->payload_bytes, now, {k.ns, 0});
    if (!extent.has_value()) {
      return ResourceExhausted("cannot promote an SSD entry: " +
                               NoRoomLocked(meta->payload_bytes, {k.ns, 0}));
    }
    Entry* e = pool.Acquire();
    e->key = k;
    e->ns_lease_pinned_bytes = LeasePinnedBytes(k.ns);
    e->model_id = model;
    e->layout_id = meta->layout_id;
    e->payload_bytes = meta->payload_bytes;
    e->checksum = meta->entry_checksum;
    // Kept by the copy; never in the future (the tier's wall clock may step).
    e->commit_time = std::min(meta->commit_time + (clock->Now() - ssd->Now()), now);
    e->extent = *extent;
    e->state.store(EntryState::kReserved);
    {
      std::unique_lock slock(shard.mu);
      shard.map.emplace(k, e);
    }
    ++reserved_entries;
    reserved_bytes += e->extent.length;
    payload_bytes.fetch_add(e->payload_bytes);
    m.used_bytes->Set(static_cast<int64_t>(arena->used_bytes()));
    return e;
  }

  // Publishes a staged entry once its read finished (`read`), pinned as a
  // reader for the caller; erases it when the read failed.
  Result<EntryRef> Publish(Entry* e, const Status& read, const std::optional<ChainKey>& parent,
                           Nanos now) {
    const EntryKey& k = e->key;
    std::lock_guard lock(structure_mu);
    if (!read.ok()) {
      EraseLocked(e);
      return read;
    }
    // An admin delete or evict erases the SSD copy and then the DRAM entry:
    // a promotion that read the copy before must not bring it back.
    if (!ssd->Contains(SsdKeyOf(k, e->model_id))) {
      EraseLocked(e);
      return NotFound("entry was deleted while being promoted");
    }
    Entry* parent_entry = nullptr;
    if (parent.has_value() && k.kind == StateKind::kGlobalKv) {
      const EntryKey pk{k.ns, StateKind::kGlobalKv, *parent};
      Shard& pshard = ShardFor(pk);
      std::shared_lock slock(pshard.mu);
      parent_entry = FindVisibleLocked(pshard, pk, now);
    }
    // A block whose parent did not make it into DRAM (its read failed, or
    // another caller's promotion of it is late) would be published unlinked,
    // outside the prefix tree: evictable before its parent and missed by a
    // delete of it. The prefix is cut here instead.
    if (parent.has_value() && k.kind == StateKind::kGlobalKv && parent_entry == nullptr) {
      EraseLocked(e);
      return NotFound("its parent block is not in DRAM");
    }
    {
      Shard& shard = ShardFor(k);
      std::unique_lock slock(shard.mu);
      e->expiry = now + TtlFor(k.kind);
      e->readers.fetch_add(1);  // the caller's pin
      e->state.store(EntryState::kCommitted);
    }
    --reserved_entries;
    reserved_bytes -= e->extent.length;
    CountEntry(e, +1);
    if (parent_entry != nullptr) TreeLink(e, parent_entry);
    TtlAppend(e);
    policy->OnInsert(e);
    // Keep the ancestor younger than its new child (prefix-safe LRU).
    if (parent_entry != nullptr) policy->OnAccess(parent_entry);
    promotions_done.fetch_add(1);
    ssd_promotions->Increment();
    return EntryRef{e, e->generation};
  }

  // ---- small lookups ------------------------------------------------------

  Shard& ShardFor(const EntryKey& k) const { return shards[EntryKeyHash{}(k)&shard_mask]; }

  const Layout* FindLayout(uint32_t id) const {
    std::shared_lock lock(layouts_mu);
    auto it = layouts.find(id);
    return it == layouts.end() ? nullptr : &it->second;
  }

  std::optional<uint32_t> FindNamespace(const std::string& ns) const {
    std::shared_lock lock(ns_mu);
    auto it = ns_ids.find(ns);
    if (it == ns_ids.end()) return std::nullopt;
    return it->second;
  }

  NamespaceCounters& CountersOf(uint32_t ns) {
    std::shared_lock lock(ns_mu);
    return ns_counters[ns];
  }
  const NamespaceCounters& CountersOf(uint32_t ns) const {
    std::shared_lock lock(ns_mu);
    return ns_counters[ns];
  }

  std::atomic<int64_t>* LeasePinnedBytes(uint32_t ns) {
    std::shared_lock lock(ns_mu);
    return &ns_lease_pinned[ns];
  }

  uint64_t ReadPinnedBytes(uint32_t ns) const {
    std::shared_lock lock(ns_mu);
    return ns < ns_lease_pinned.size()
               ? static_cast<uint64_t>(std::max<int64_t>(ns_lease_pinned[ns].load(), 0))
               : 0;
  }

  uint64_t HeldBytesLimit() const {
    return static_cast<uint64_t>(opts.max_held_share_per_namespace *
                                 static_cast<double>(arena->capacity_bytes()));
  }

  // What namespace `ns` (interned) may hold through leases; the grant checks it.
  LeaseLimits LeaseLimitsFor(uint32_t ns) {
    return {opts.max_leased_entries_per_namespace, HeldBytesLimit(), LeasePinnedBytes(ns)};
  }

  // Why `entries` more leased entries and `bytes` more held bytes would
  // take namespace `ns` past its lease limits; empty if they would not.
  // For early refusals, before anything is pinned or reserved (and before
  // a reservation evicts other entries to make room); LeaseTable::Grant
  // makes the exact check.
  std::string PastLeaseLimits(uint32_t ns, uint64_t entries, uint64_t bytes) const {
    const LeaseHolding h = HoldingOf(ns);
    if (h.leased_entries + entries > h.leased_entries_limit) {
      return "its leases hold " + std::to_string(h.leased_entries) + " entries; " +
             std::to_string(entries) + " more would pass the " +
             std::to_string(h.leased_entries_limit) + " allowed";
    }
    if (h.held_bytes + bytes <= h.limit_bytes) return {};
    return "its leases and pins hold " + std::to_string(h.held_bytes) +
           " bytes of the DRAM tier; " + std::to_string(bytes) + " more would pass the " +
           std::to_string(h.limit_bytes) + " allowed (max_held_share_per_namespace)";
  }

  // What namespace `ns` (interned) holds through leases and pins, against
  // its limits.
  LeaseHolding HoldingOf(uint32_t ns) const {
    const HeldByLeases by_leases = leases.held(ns, clock->Now());
    return {
        .held_bytes = ReadPinnedBytes(ns) + by_leases.reserved_bytes + by_leases.admin_pinned_bytes,
        .limit_bytes = HeldBytesLimit(),
        .leased_entries = by_leases.entries,
        .leased_entries_limit = opts.max_leased_entries_per_namespace};
  }

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
  ReserveNeed ReserveNeedLocked(uint32_t ns, std::span<const CommitBlock> blocks, Nanos now) const {
    absl::flat_hash_set<EntryKey, EntryKeyHash> seen;
    seen.reserve(blocks.size());
    ReserveNeed need;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CommitBlock& b = blocks[i];
      // A parent earlier in the batch is looked up as a block of it.
      if (b.parent.has_value() && (i == 0 || blocks[i - 1].key != *b.parent)) {
        const EntryKey pk{ns, StateKind::kGlobalKv, *b.parent};
        if (const Entry* p = VisibleUnderStructureMu(pk, now)) need.keep.push_back(p);
      }
      const EntryKey k{ns, b.kind, b.key};
      if (!seen.insert(k).second) continue;  // in flight by then
      if (const Entry* e = IndexedUnderStructureMu(k)) {
        // Present, or in flight; an expired one is replaced.
        if (e->state.load() != EntryState::kCommitted) continue;
        if (e->expiry > now) {
          need.keep.push_back(e);
          continue;
        }
      }
      ++need.entries;
      need.bytes += arena->ExtentBytes(b.payload_bytes);
    }
    std::sort(need.keep.begin(), need.keep.end());
    need.keep.erase(std::unique(need.keep.begin(), need.keep.end()), need.keep.end());
    return need;
  }

  // Bytes of the tier no eviction can free now: reservations, and entries
  // read leases pin.
  uint64_t UnevictableBytesLocked() const {
    uint64_t bytes = reserved_bytes;
    std::shared_lock lock(ns_mu);
    for (const std::atomic<int64_t>& pinned : ns_lease_pinned) {
      bytes += static_cast<uint64_t>(std::max<int64_t>(pinned.load(), 0));
    }
    return bytes;
  }

  // How many more entries namespace `ns` may lease now: a leased match
  // stops its hit run there (a shorter prefix, not a refusal). Advisory;
  // LeaseTable::Grant makes the exact check. RESOURCE_EXHAUSTED if not one.
  Result<uint64_t> LeaseRoom(const std::string& ns) const {
    const std::optional<uint32_t> id = FindNamespace(ns);
    if (!id.has_value()) return opts.max_leased_entries_per_namespace;
    if (std::string why = PastLeaseLimits(*id, 1, 0); !why.empty()) return LeaseRefused(ns, why);
    const LeaseHolding h = HoldingOf(*id);
    return h.leased_entries_limit - h.leased_entries;
  }

  // A lease or pin refused for namespace `ns`'s limits, and what to do
  // about it.
  static Status LeaseRefused(const std::string& ns, const std::string& why) {
    return ResourceExhausted("namespace '" + ns + "': " + why +
                             ": end leases (Abort) and unpin entries you are done with");
  }

  uint32_t InternNamespace(const std::string& ns) {
    if (auto id = FindNamespace(ns)) return *id;
    std::unique_lock lock(ns_mu);
    auto [it, inserted] = ns_ids.emplace(ns, static_cast<uint32_t>(ns_names.size()));
    if (inserted) {
      ns_names.push_back(ns);
      ns_lease_pinned.emplace_back(0);
      ns_counters.emplace_back();
    }
    return it->second;
  }

  // The id an admin listing or eviction looks for in DRAM; none if there is
  // nothing to look at. With an SSD tier a namespace this process never
  // interned may still have copies: an id no DRAM entry has stands for it
  // (interning would keep a mistyped name in Namespaces() until restart).
  std::optional<uint32_t> NamespaceForAdmin(const std::string& ns) const {
    const std::optional<uint32_t> id = FindNamespace(ns);
    if (id.has_value() || ssd == nullptr) return id;
    return kUnseenNamespace;
  }
  static constexpr uint32_t kUnseenNamespace = UINT32_MAX;
  // Replaces kUnseenNamespace with the namespace's id if it has one now.
  // Under structure_mu: no DRAM entry of it can appear until that is let go.
  void ResolveUnseenLocked(const std::string& ns, uint32_t* id) const {
    if (*id != kUnseenNamespace) return;
    if (const std::optional<uint32_t> found = FindNamespace(ns)) *id = *found;
  }

  Nanos TtlFor(StateKind kind) const {
    return kind == StateKind::kGlobalKv ? opts.global_kv_ttl : opts.swa_ttl;
  }

  // A committed, unexpired entry under `k`, or nullptr. Caller holds the
  // shard lock.
  Entry* FindVisibleLocked(const Shard& shard, const EntryKey& k, Nanos now) const {
    auto it = shard.map.find(k);
    return it == shard.map.end() ? nullptr : VisibleOrNull(it->second, now);
  }
  static Entry* VisibleOrNull(Entry* e, Nanos now) {
    if (e == nullptr || e->state.load() != EntryState::kCommitted || e->expiry <= now) {
      return nullptr;
    }
    return e;
  }

  // The entry indexed under `k`, or nullptr, for a caller holding
  // structure_mu, without its shard's lock: every insert into or erase from
  // a shard's map, and every change of an entry's state or expiry, happens
  // under structure_mu, so nothing changes them meanwhile (matches and
  // fetches only read). Spares the commit path a lock round trip per block.
  Entry* IndexedUnderStructureMu(const EntryKey& k) const {
    const Shard& shard = ShardFor(k);
    auto it = shard.map.find(k);
    return it == shard.map.end() ? nullptr : it->second;
  }
  Entry* VisibleUnderStructureMu(const EntryKey& k, Nanos now) const {
    return VisibleOrNull(IndexedUnderStructureMu(k), now);
  }

  // ---- structure changes (structure_mu held) --------------------------------

  void TtlUnlink(Entry* e) {
    if (!e->in_ttl) return;
    const int q = static_cast<int>(e->key.kind) - 1;
    (e->ttl_prev ? e->ttl_prev->ttl_next : ttl_head[q]) = e->ttl_next;
    (e->ttl_next ? e->ttl_next->ttl_prev : ttl_tail[q]) = e->ttl_prev;
    e->ttl_prev = e->ttl_next = nullptr;
    e->in_ttl = false;
  }

  void TtlAppend(Entry* e) {
    const int q = static_cast<int>(e->key.kind) - 1;
    e->ttl_prev = ttl_tail[q];
    e->ttl_next = nullptr;
    (ttl_tail[q] ? ttl_tail[q]->ttl_next : ttl_head[q]) = e;
    ttl_tail[q] = e;
    e->in_ttl = true;
  }

  void TreeLink(Entry* child, Entry* parent) {
    child->parent = parent;
    child->prev_sibling = nullptr;
    child->next_sibling = parent->first_child;
    if (parent->first_child) parent->first_child->prev_sibling = child;
    parent->first_child = child;
  }

  void TreeUnlink(Entry* e) {
    if (e->parent == nullptr) return;
    (e->prev_sibling ? e->prev_sibling->next_sibling : e->parent->first_child) = e->next_sibling;
    if (e->next_sibling) e->next_sibling->prev_sibling = e->prev_sibling;
    e->parent = e->prev_sibling = e->next_sibling = nullptr;
  }

  // An entry of namespace `ns` left DRAM for `reason`: the node's counters
  // and the namespace's.
  void CountEviction(EvictReason reason, uint32_t ns) {
    const auto r = static_cast<size_t>(reason);
    evictions[r].fetch_add(1);
    m.evictions[r]->Increment();
    CountersOf(ns).evictions[r].fetch_add(1, std::memory_order_relaxed);
  }

  void CountEntry(const Entry* e, int delta) {
    const bool global = e->key.kind == StateKind::kGlobalKv;
    (global ? m.entries_global : m.entries_swa)->Add(delta);
    NamespaceCounters& c = CountersOf(e->key.ns);
    (global ? c.global_kv_entries : c.swa_entries).fetch_add(delta, std::memory_order_relaxed);
    c.used_bytes.fetch_add(delta * static_cast<int64_t>(e->extent.length),
                           std::memory_order_relaxed);
  }

  // Removes an entry with no pins from every structure and frees its bytes.
  // Removes an entry that nobody can pin any more (reserved, or found
  // unpinned under its shard lock) from every structure and frees its bytes.
  void EraseLocked(Entry* e) {
    {
      Shard& shard = ShardFor(e->key);
      std::unique_lock lock(shard.mu);
      UnindexLocked(shard, e);
    }
    ForgetUnindexedLocked(e);
  }

  // Takes `e` out of the index; a kDeleting entry left it when it turned
  // so, and its key may name a newer entry now. Caller holds the shard
  // lock exclusively.
  static void UnindexLocked(Shard& shard, const Entry* e) {
    if (e->state.load() != EntryState::kDeleting) shard.map.erase(e->key);
  }

  // Turns a pinned entry kDeleting: invisible and out of the index at once,
  // so the key can be stored again while the pins last. Caller holds the
  // shard lock exclusively.
  void MarkDeletingLocked(Shard& shard, Entry* e) {
    shard.map.erase(e->key);
    e->state.store(EntryState::kDeleting);
    deleting.insert(e);
    ++deleting_keys[e->key];
  }

  // Erases a reserved entry whose write lease ended or whose commit failed.
  // A data-plane receive may still pin it (PinLeasedRange): then it turns
  // kDeleting, invisible, and the last Unpin frees it, so bytes still landing
  // never land in an entry that reused the extent.
  void EraseReservedLocked(Entry* e) {
    {
      Shard& shard = ShardFor(e->key);
      std::unique_lock lock(shard.mu);
      if (e->readers.load() != 0) {
        MarkDeletingLocked(shard, e);
        --reserved_entries;
        reserved_bytes -= e->extent.length;
        return;
      }
      shard.map.erase(e->key);
    }
    ForgetUnindexedLocked(e);
  }

  // Erases `e` unless a lease or reader holds it. The check and the removal
  // from the index share one exclusive critical section: once the lock is
  // dropped no reader can find the entry, so none can pin it in between.
  bool EraseIfUnpinnedLocked(Entry* e) {
    {
      Shard& shard = ShardFor(e->key);
      std::unique_lock lock(shard.mu);
      if (e->leases.load() != 0 || e->readers.load() != 0) return false;
      UnindexLocked(shard, e);
    }
    ForgetUnindexedLocked(e);
    return true;
  }

  // The rest of an erase, after the entry left the index.
  void ForgetUnindexedLocked(Entry* e) {
    if (e->pinned_until.load() != 0) leases.DropPin(e);  // deleted while an admin pinned it
    const EntryState state = e->state.load();
    if (state == EntryState::kCommitted) CountEntry(e, -1);
    if (state == EntryState::kReserved) {
      --reserved_entries;
      reserved_bytes -= e->extent.length;
    }
    if (state == EntryState::kDeleting) {
      deleting.erase(e);
      auto it = deleting_keys.find(e->key);
      if (--it->second == 0) deleting_keys.erase(it);
    }
    policy->OnErase(e);
    TtlUnlink(e);
    TreeUnlink(e);
    payload_bytes.fetch_sub(e->payload_bytes);
    arena->Free(e->extent);
    m.used_bytes->Set(static_cast<int64_t>(arena->used_bytes()));
    pool.Release(e);
  }

  // Deletes one committed entry without children; a pinned one becomes
  // kDeleting and goes when its last pin does.
  void DeleteLeafLocked(Entry* e, EvictReason reason) {
    // An explicit delete erases the SSD copy too; the others leave it.
    if (reason != EvictReason::kExplicit) LogLeftDramLocked(e->key);
    TreeUnlink(e);
    policy->OnErase(e);
    TtlUnlink(e);
    CountEviction(reason, e->key.ns);
    Shard& shard = ShardFor(e->key);
    std::unique_lock lock(shard.mu);
    if (e->leases.load() != 0 || e->readers.load() != 0) {
      // Pinned: invisible from now on, freed by the last Unpin.
      if (e->state.load() == EntryState::kCommitted) {
        MarkDeletingLocked(shard, e);
        CountEntry(e, -1);
      }
      return;
    }
    shard.map.erase(e->key);
    lock.unlock();
    ForgetUnindexedLocked(e);
  }

  // Deletes `root` and every descendant, leaves first. Iterative: chains
  // can be far deeper than the stack. Returns how many entries went.
  uint64_t DeleteSubtreeLocked(Entry* root, EvictReason reason) {
    uint64_t n = 0;
    Entry* e = root;
    while (true) {
      while (e->first_child != nullptr) e = e->first_child;
      Entry* up = e == root ? nullptr : e->parent;
      DeleteLeafLocked(e, reason);
      ++n;
      if (up == nullptr) return n;
      e = up;
    }
  }

  bool EvictableLocked(const Entry& e, Nanos now) const {
    return e.state.load() == EntryState::kCommitted && e.leases.load() == 0 &&
           e.readers.load() == 0 && e.first_child == nullptr && e.pinned_until.load() <= now;
  }

  // Evicts one victim, never one of `keep` (sorted); false when nothing may
  // go. `room`: the namespace it makes room for, when committed shares are
  // on (TenantSharePolicy).
  bool EvictOneLocked(EvictReason reason, Nanos now, uint64_t incoming_bytes = 0,
                      std::span<const Entry* const> keep = {},
                      std::optional<TenantSharePolicy::Room> room = std::nullopt) {
    auto evictable = [&](const Entry& e) {
      return EvictableLocked(e, now) && !std::binary_search(keep.begin(), keep.end(), &e);
    };
    Entry* victim = shares != nullptr ? shares->PickVictimFor(room, evictable, kMaxVictimScan,
                                                              reserved_bytes + incoming_bytes)
                                      : policy->PickVictim(evictable, kMaxVictimScan,
                                                           reserved_bytes + incoming_bytes);
    if (victim == nullptr) return false;
    const EntryKey key = victim->key;
    const ModelId model = victim->model_id;
    const auto hits = static_cast<uint32_t>(
        std::min<uint64_t>(victim->hits.load(std::memory_order_relaxed), UINT32_MAX));
    // A reader may have pinned it since PickVictim looked.
    if (!EraseIfUnpinnedLocked(victim)) {
      policy->OnAccess(victim);
      return true;  // not evicted, but progress: try the next one
    }
    // Leaving DRAM renews the SSD copy: hits served from DRAM never reach
    // it, so it would otherwise age from its write and be evicted first
    // exactly when the block was hot. For the SSD tier's deadline policy
    // this starts the copy's holding time, classed by the DRAM hits.
    if (SsdAdmits(key.kind)) {
      ssd->Touch(SsdKeyOf(key, model), SsdTouch::kRenew, hits);
      LogLeftDramLocked(key);
    }
    CountEviction(reason, key.ns);
    return true;
  }

  uint64_t EvictToWatermarkLocked(Nanos now, std::span<const Entry* const> keep = {}) {
    const uint64_t cap = arena->capacity_bytes();
    if (arena->used_bytes() <= static_cast<uint64_t>(opts.high_watermark * cap)) return 0;
    const uint64_t target = static_cast<uint64_t>(opts.low_watermark * cap);
    uint64_t n = 0;
    while (arena->used_bytes() > target && EvictOneLocked(EvictReason::kWatermark, now, 0, keep)) {
      ++n;
    }
    return n;
  }

  // An extent of `bytes` for namespace `room.ns`, which already has
  // `room.bytes` of them in the making; evicts to make room.
  std::optional<Extent> AllocateLocked(uint64_t bytes, Nanos now, TenantSharePolicy::Room room,
                                       std::span<const Entry* const> keep = {}) {
    room.bytes += bytes;
    for (size_t attempt = 0; attempt < kMaxVictimScan; ++attempt) {
      if (auto extent = arena->Allocate(bytes)) return extent;
      if (!EvictOneLocked(EvictReason::kCapacity, now, bytes, keep, room)) break;
    }
    return std::nullopt;
  }

  // Why no extent of `bytes` could be had for namespace `room.ns`.
  std::string NoRoomLocked(uint64_t bytes, const TenantSharePolicy::Room& room) const {
    std::string why = "no room for " + std::to_string(bytes) + " bytes in the DRAM tier";
    if (shares != nullptr && shares->PassesShare({room.ns, room.bytes + bytes})) {
      return why + ": the namespace has its share (" + std::to_string(shares->share_bytes()) +
             " bytes, committed_share_per_namespace) and none of its entries can be evicted "
             "now (pinned, leased or in use); other tenants' entries are theirs";
    }
    return why + " (all remaining entries are pinned, leased or in use)";
  }

  // ---- pins ---------------------------------------------------------------

  // Called after dropping a lease or reader pin: finishes a deferred delete.
  void MaybeReclaim(const EntryRef& ref) {
    Entry* e = ref.entry;
    if (e->state.load() != EntryState::kDeleting) return;
    std::lock_guard lock(structure_mu);
    if (e->generation != ref.generation || e->state.load() != EntryState::kDeleting) return;
    EraseIfUnpinnedLocked(e);
  }

  // Drops one pin. The decrement and the state check happen under the shard
  // lock: a delete holds it exclusively while it reads the pins and marks
  // the entry kDeleting, so either it sees this pin gone and erases, or this
  // sees kDeleting and reclaims. Never neither.
  void Unpin(const EntryRef& ref, bool lease) {
    Entry* e = ref.entry;
    bool deleting;
    {
      Shard& shard = ShardFor(e->key);
      std::shared_lock lock(shard.mu);
      if (!lease) {
        e->readers.fetch_sub(1);
      } else if (e->leases.fetch_sub(1) == 1) {
        e->ns_lease_pinned_bytes->fetch_sub(static_cast<int64_t>(e->extent.length));
      }
      deleting = e->state.load() == EntryState::kDeleting;
    }
    if (deleting) MaybeReclaim(ref);
  }

  void EndLease(LeaseRecord& rec, bool expired) {
    if (rec.write) {
      m.leases_live_write->Add(-1);
      if (expired) m.leases_expired_write->Increment();
      std::lock_guard lock(structure_mu);
      for (const EntryRef& ref : rec.entries) {
        if (ref.entry->generation == ref.generation &&
            ref.entry->state.load() == EntryState::kReserved) {
          EraseReservedLocked(ref.entry);
        }
      }
      return;
    }
    m.leases_live_read->Add(-1);
    if (expired) m.leases_expired_read->Increment();
    for (const EntryRef& ref : rec.entries) Unpin(ref, /*lease=*/true);
  }

  Status ValidateCommitBlock(const CommitBlock& b, const Layout** layout_out) const {
    const Layout* layout = FindLayout(b.layout_id);
    if (layout == nullptr) {
      return InvalidArgument("unknown layout id " + std::to_string(b.layout_id));
    }
    if (layout->kind != b.kind) {
      return InvalidArgument("layout " + std::to_string(b.layout_id) + " is for " +
                             std::string(StateKindName(layout->kind)) + ", block is " +
                             std::string(StateKindName(b.kind)));
    }
    if (b.payload_bytes == 0 || b.payload_bytes > kMaxPayloadBytes ||
        b.payload_bytes != layout->PayloadBytes()) {
      return InvalidArgument("payload of " + std::to_string(b.payload_bytes) + " bytes; layout " +
                             std::to_string(layout->id) + " needs " +
                             std::to_string(layout->PayloadBytes()));
    }
    if (b.kind == StateKind::kSwaState && b.parent.has_value()) {
      return InvalidArgument("SWA_STATE entries have no parent");
    }
    *layout_out = layout;
    return Status::Ok();
  }

  void MaintenanceLoop() {
    std::unique_lock lock(maintenance_mu);
    while (!stopping) {
      maintenance_cv.wait_for(lock, std::chrono::nanoseconds(opts.maintenance_interval));
      if (stopping) break;
      lock.unlock();
      RunMaintenance();
      MaybeRunSsdMaintenance(/*background=*/true);
      lock.lock();
    }
  }

  MaintenanceReport RunMaintenance() {
    MaintenanceReport report;
    const Nanos now = clock->Now();
    for (LeaseRecord& rec : leases.TakeExpired(now)) {
      (rec.write ? report.expired_write_leases : report.expired_read_leases)++;
      EndLease(rec, /*expired=*/true);
    }
    std::lock_guard lock(structure_mu);
    for (Entry*& head : ttl_head) {  // DeleteSubtreeLocked advances head
      while (head != nullptr && head->expiry <= now) {
        report.ttl_expired += DeleteSubtreeLocked(head, EvictReason::kTtl);
      }
    }
    report.evicted = EvictToWatermarkLocked(now);
    return report;
  }

  // The SSD pass (TTL expiry in expiry order, eviction to the watermarks):
  // every 10th background run (about a second), every explicit one.
  void MaybeRunSsdMaintenance(bool background) {
    if (ssd == nullptr) return;
    {
      std::lock_guard lock(maintenance_mu);
      if (background && maintenance_runs++ % 10 != 0) return;
    }
    ssd->RunMaintenance();
  }
};

// ---------------------------------------------------------------------------

CacheStore::CacheStore(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), clock_(impl_->clock), metrics_(impl_->registry) {}

Result<std::unique_ptr<CacheStore>> CacheStore::Open(CacheStoreOptions options) {
  if (!(options.low_watermark > 0 && options.low_watermark <= options.high_watermark &&
        options.high_watermark <= 1.0)) {
    return InvalidArgument("watermarks need 0 < low <= high <= 1");
  }
  if (options.index_shards == 0 || (options.index_shards & (options.index_shards - 1)) != 0) {
    return InvalidArgument("index_shards must be a power of two");
  }
  if (options.global_kv_ttl <= 0 || options.swa_ttl <= 0 || options.global_kv_ttl > kMaxEntryTtl ||
      options.swa_ttl > kMaxEntryTtl) {
    return InvalidArgument("TTLs must be in (0, 10 years]");
  }
  if (options.default_read_lease_ttl <= 0 || options.default_read_lease_ttl > kMaxLeaseTtl ||
      options.default_write_lease_ttl <= 0 || options.default_write_lease_ttl > kMaxLeaseTtl) {
    return InvalidArgument("default lease TTLs must be in (0, 10m]");
  }
  if (!(options.max_held_share_per_namespace > 0 && options.max_held_share_per_namespace <= 1)) {
    return InvalidArgument("max_held_share_per_namespace must be in (0, 1]");
  }
  if (!(options.committed_share_per_namespace > 0 && options.committed_share_per_namespace <= 1)) {
    return InvalidArgument("committed_share_per_namespace must be in (0, 1]");
  }
  if (options.max_lease_life < kMaxLeaseTtl || options.max_lease_life > kMaxEntryTtl) {
    // Else a lease could be granted for longer than it may live.
    return InvalidArgument(
        "max_lease_life must be at least the longest lease TTL (10m), at most 10 years");
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->clock = options.clock ? options.clock : SteadyClock::Default();
  if (options.metrics == nullptr) {
    impl->owned_metrics = std::make_unique<MetricsRegistry>();
    impl->registry = impl->owned_metrics.get();
  } else {
    impl->registry = options.metrics;
  }
  auto arena = DramArena::Create(options.dram);
  if (!arena.ok()) return arena.status();
  impl->arena = std::move(arena).value();
  impl->copy_pool = std::make_unique<CopyPool>(options.copy_threads);
  auto policy = MakeEvictionPolicy(options.eviction_policy, impl->arena->capacity_bytes());
  if (!policy.ok()) return policy.status();
  impl->policy = std::move(policy).value();
  if (options.committed_share_per_namespace < 1) {
    auto shares = std::make_unique<TenantSharePolicy>(
        std::move(impl->policy), static_cast<uint64_t>(options.committed_share_per_namespace *
                                                       impl->arena->capacity_bytes()));
    impl->shares = shares.get();
    impl->policy = std::move(shares);
  }
  impl->shards = std::make_unique<Impl::Shard[]>(options.index_shards);
  impl->shard_mask = options.index_shards - 1;

  MetricsRegistry& r = *impl->registry;
  Impl::Metrics& m = impl->m;
  const auto latency = MetricsRegistry::ExponentialBuckets(1e-6, 2, 24);
  const MetricLabels dram{{"tier", "dram"}};
  m.match_requests = r.GetCounter("strata_match_requests_total", "Match calls.");
  m.match_tokens = r.GetCounter("strata_match_prompt_tokens_total", "Prompt tokens matched.");
  m.hit_tokens = r.GetCounter("strata_hit_tokens_total", "Prompt tokens found cached.");
  m.hit_bytes = r.GetCounter("strata_hit_bytes_total", "Payload bytes of cached hits.");
  m.lookup_seconds =
      r.GetHistogram("strata_lookup_latency_seconds", "Match latency, hashing included.", latency);
  m.fetch_bytes = r.GetCounter("strata_fetch_bytes_total", "Verified bytes fetched.");
  m.fetch_seconds = r.GetHistogram("strata_fetch_latency_seconds", "Fetch latency.", latency);
  m.first_group_seconds = r.GetHistogram("strata_fetch_first_layer_ready_seconds",
                                         "Time until layer group 0 is usable.", latency);
  m.commit_bytes = r.GetCounter("strata_commit_bytes_total", "Payload bytes published.");
  m.commit_entries = r.GetCounter("strata_commit_entries_total", "Entries published.");
  for (size_t i = 0; i < static_cast<size_t>(EvictReason::kCount); ++i) {
    m.evictions[i] =
        r.GetCounter("strata_evictions_total", "Entries removed, by reason.",
                     {{"tier", "dram"}, {"reason", std::string(EvictReasonName(EvictReason(i)))}});
  }
  m.checksum_failures =
      r.GetCounter("strata_checksum_failures_total", "Payloads that failed verification.");
  m.leases_expired_read =
      r.GetCounter("strata_leases_expired_total", "Leases that timed out.", {{"type", "read"}});
  m.leases_expired_write =
      r.GetCounter("strata_leases_expired_total", "Leases that timed out.", {{"type", "write"}});
  m.leases_live_read = r.GetGauge("strata_leases_live", "Live leases.", {{"type", "read"}});
  m.leases_live_write = r.GetGauge("strata_leases_live", "Live leases.", {{"type", "write"}});
  m.used_bytes = r.GetGauge("strata_tier_used_bytes", "Bytes allocated in the tier.", dram);
  m.capacity_bytes = r.GetGauge("strata_tier_capacity_bytes", "Tier capacity.", dram);
  m.entries_global =
      r.GetGauge("strata_entries", "Committed entries.", {{"tier", "dram"}, {"kind", "global_kv"}});
  m.entries_swa =
      r.GetGauge("strata_entries", "Committed entries.", {{"tier", "dram"}, {"kind", "swa_state"}});
  m.capacity_bytes->Set(static_cast<int64_t>(impl->arena->capacity_bytes()));

  std::vector<Layout> layouts = {MakeGlobalKvLayout(kV41GlobalKvLayoutId),
                                 MakeSwaLayout(kV41SwaLayoutId)};
  layouts.insert(layouts.end(), options.extra_layouts.begin(), options.extra_layouts.end());
  if (options.ssd.has_value()) {
    if (options.ssd_writeback_batch == 0 || options.ssd_writeback_queue == 0) {
      return InvalidArgument("SSD write-back batch and queue must be positive");
    }
    SsdTierOptions ssd_opts = *options.ssd;
    if (ssd_opts.metrics == nullptr) ssd_opts.metrics = impl->registry;
    auto ssd = SsdTier::Open(std::move(ssd_opts));
    if (!ssd.ok()) return ssd.status();
    impl->ssd = std::move(ssd).value();
    impl->ssd_promotions =
        r.GetCounter("strata_ssd_promotions_total", "SSD entries read into the DRAM tier.");
    impl->ssd_wb_dropped = r.GetCounter("strata_ssd_writeback_dropped_total",
                                        "Entries not written back: the queue was full.");
    impl->ssd_wb_pending =
        r.GetGauge("strata_ssd_writeback_pending", "Entries queued for SSD write-back.");
  }
  std::unique_ptr<CacheStore> store(new CacheStore(std::move(impl)));
  for (const Layout& l : layouts) STRATA_RETURN_IF_ERROR(store->RegisterLayout(l));
  if (store->impl_->ssd != nullptr) {
    Impl* p = store->impl_.get();
    p->wb_thread = std::thread([p] { p->WriteBackLoop(); });
  }
  if (options.maintenance_interval > 0) {
    Impl* p = store->impl_.get();
    p->maintenance = std::thread([p] { p->MaintenanceLoop(); });
  }
  return store;
}

CacheStore::~CacheStore() {
  {
    std::lock_guard lock(impl_->maintenance_mu);
    impl_->stopping = true;
  }
  impl_->maintenance_cv.notify_all();
  if (impl_->maintenance.joinable()) impl_->maintenance.join();
  // Write back what is queued, so a clean restart keeps it.
  {
    std::lock_guard lock(impl_->wb_mu);
    impl_->wb_stopping = true;
  }
  impl_->wb_cv.notify_all();
  if (impl_->wb_thread.joinable()) impl_->wb_thread.join();
  // No call may be in flight now; end every lease so nothing stays pinned,
  // then the arena and pool go with impl_.
  for (LeaseRecord& rec : impl_->leases.TakeAll()) impl_->EndLease(rec, /*expired=*/false);
}

Status CacheStore::RegisterLayout(const Layout& layout) {
  STRATA_RETURN_IF_ERROR(layout.Validate());
  if (layout.PayloadBytes() > kMaxPayloadBytes) {
    return InvalidArgument("layout " + std::to_string(layout.id) + " exceeds the payload limit");
  }
  std::unique_lock lock(impl_->layouts_mu);
  auto [it, inserted] = impl_->layouts.emplace(layout.id, layout);
  if (!inserted) {
    const Layout& old = it->second;
    bool same = old.kind == layout.kind && old.block_tokens == layout.block_tokens &&
                old.groups.size() == layout.groups.size();
    for (size_t g = 0; same && g < old.groups.size(); ++g) {
      same = old.groups[g].bytes == layout.groups[g].bytes;
    }
    if (!same) return AlreadyExists("layout id " + std::to_string(layout.id) + " is taken");
  }
  return Status::Ok();
}

// ---- match ------------------------------------------------------------------

// One match in progress: looks blocks up in order, pins them if asked, then
// touches, leases and accounts for them. Shared by Match and MatchKeys.
class CacheStore::PrefixLookup {
 public:
  PrefixLookup(Impl& s, const Principal& caller, const ModelId& model, uint32_t block_tokens,
               uint32_t prompt_blocks, bool lease, Nanos lease_ttl, bool promote_ssd = false)
      : s_(s),
        // Interned even before it stores anything: its lookups are counted
        // (NamespaceUsage), and with an SSD tier it may have entries this
        // process never saw committed (written before a restart). Callers'
        // namespaces come from their credentials, so they are few.
        ns_(s.InternNamespace(caller.ns)),
        ns_name_(caller.ns),
        lease_(lease),
        promote_(lease && promote_ssd && s.ssd != nullptr),
        lease_ttl_(lease_ttl > 0 ? lease_ttl : s.opts.default_read_lease_ttl),
        start_(s.clock->Now()) {
    result_.model_id = model;
    result_.block_tokens = block_tokens;
    result_.prompt_blocks = prompt_blocks;
    hits_.reserve(prompt_blocks);
    result_.blocks.reserve(prompt_blocks);
  }

  // Promote SSD-only blocks of a run together (see Visit) rather than one
  // synchronous read each. Not with independent keys, where a block that
  // fails to promote leaves a hole instead of ending the prefix.
  void BatchPromotions() { batch_ = promote_; }

  // Leases at most `room` entries (Impl::LeaseRoom): the hit run ends there.
  void LimitLeasedEntries(uint64_t room) { lease_room_ = room; }

  // Looks up the next block; false (stop) on a miss.
  bool Visit(const ChainKey& key) {
    if (stopped_) return false;
    if (lease_ && hits_.size() + deferred_.size() >= lease_room_) return false;
    const EntryKey k{ns_, StateKind::kGlobalKv, key};
    // A DRAM block after a run of SSD-only ones: promote the run first, so
    // pins and the prefix stay in order.
    if (!deferred_.empty() && s_.InDram(k, start_) && !Flush()) return false;
    std::optional<BlockMatch> e = Pin(k);
    // The parent is the key just before this one, if that one hit (with
    // independent keys an earlier miss breaks the chain).
    const std::optional<ChainKey> parent = previous_hit_;
    previous_hit_.reset();
    if (!e.has_value() && batch_) {
      if (!s_.SsdAdmits(k.kind) || !s_.ssd->Contains(s_.SsdKeyOf(k, result_.model_id))) {
        return false;
      }
      deferred_.push_back({k, parent, result_.blocks.size()});
      result_.blocks.push_back({key, Tier::kSsd, 0, 0, 0, 0});  // filled by Flush
      previous_hit_ = key;
      return true;
    }
    if (!e.has_value() && promote_) {
      e = PromoteAndPin(k, parent);
      if (!e.has_value()) return false;
    }
    if (!e.has_value()) {
      std::optional<SsdEntryMeta> meta = LookupSsd(k);
      if (!meta.has_value()) return false;
      result_.blocks.push_back(
          {key, Tier::kSsd, meta->layout_id, meta->payload_bytes, meta->entry_checksum, 0});
      previous_hit_ = key;
      return true;
    }
    result_.blocks.push_back(*e);
    previous_hit_ = key;
    return true;
  }

  // Promotes the deferred SSD-only blocks in one go and pins them. The
  // first that fails ends the prefix there; false if one did.
  bool Flush() {
    if (deferred_.empty()) return !stopped_;
    std::vector<EntryKey> keys;
    std::vector<std::optional<ChainKey>> parents;
    for (const Deferred& d : deferred_) {
      keys.push_back(d.key);
      parents.push_back(d.parent);
    }
    std::vector<Result<EntryRef>> promoted =
        s_.PinOrPromoteMany(keys, parents, result_.model_id, start_);
    for (size_t i = 0; i < deferred_.size(); ++i) {
      std::optional<BlockMatch> e;
      if (promoted[i].ok()) {
        if (!stopped_) e = Pin(deferred_[i].key);
        s_.Unpin(*promoted[i], /*lease=*/false);  // the lease's pin holds it now
      }
      if (stopped_) continue;
      if (!e.has_value()) {
        result_.blocks.resize(deferred_[i].index);
        stopped_ = true;
        continue;
      }
      result_.blocks[deferred_[i].index] = *e;
    }
    deferred_.clear();
    return !stopped_;
  }

  // The deepest SWA state at or below the hit run.
  void FindSwa() {
    Flush();
    if (lease_ && hits_.size() >= lease_room_) return;
    const uint32_t hit = static_cast<uint32_t>(result_.blocks.size());
    const uint32_t lowest = hit > kSwaSearchBoundaries ? hit - kSwaSearchBoundaries : 1;
    for (uint32_t b = hit; b >= lowest && b > 0; --b) {
      const EntryKey k{ns_, StateKind::kSwaState, result_.blocks[b - 1].key};
      std::optional<BlockMatch> e = Pin(k);
      if (!e.has_value() && promote_) {
        // A leased remote answer carries DRAM locations only: an SWA state
        // that cannot be promoted is skipped for a lower boundary.
        e = PromoteAndPin(k, std::nullopt);
        if (!e.has_value()) continue;
      }
      if (e.has_value()) {
        result_.swa = SwaMatch{b, *e};
        return;
      }
      if (std::optional<SsdEntryMeta> meta = LookupSsd(k)) {
        result_.swa = SwaMatch{
            b,
            {k.chain, Tier::kSsd, meta->layout_id, meta->payload_bytes, meta->entry_checksum, 0}};
        return;
      }
    }
  }

  // Drops the pins of a match that failed half way.
  void Abandon() {
    if (!lease_) return;
    for (const EntryRef& ref : hits_) s_.Unpin(ref, /*lease=*/true);
  }

  // RESOURCE_EXHAUSTED, with every pin dropped, if the lease would take the
  // caller's namespace past its lease limits.
  Result<MatchResult> Finish(const ChainKey& root, uint64_t prompt_tokens) {
    Flush();
    if (lease_ && !hits_.empty()) {
      LeaseRecord rec;
      rec.ns = ns_;
      rec.granted = start_;
      rec.expiry = start_ + lease_ttl_;
      rec.entries = hits_;
      // This match's pins are counted already, so leases granted at once
      // see each other's and cannot pass the share together. Counted live
      // before the grant: once granted it may end (and be counted out) at
      // once.
      s_.m.leases_live_read->Add(1);
      Result<LeaseId> lease = s_.leases.Grant(rec, s_.LeaseLimitsFor(ns_));
      if (!lease.ok()) {
        s_.m.leases_live_read->Add(-1);
        Abandon();
        return Impl::LeaseRefused(ns_name_, lease.status().message());
      }
      result_.lease = *lease;
      result_.lease_expiry = start_ + lease_ttl_;
    }
    // SSD-only hits, root last too (the SSD tier breaks ties by touch order).
    for (size_t i = ssd_hits_.size(); i-- > 0;) s_.ssd->Touch(ssd_hits_[i]);
    result_.prefix_key = result_.blocks.empty() ? root : result_.blocks.back().key;
    if (!hits_.empty()) {
      // Touch root-last so ancestors stay younger than descendants (the SWA
      // entry, if any, is last in `hits_` and touched first).
      std::lock_guard lock(s_.structure_mu);
      for (size_t i = hits_.size(); i-- > 0;) {
        const EntryRef& ref = hits_[i];
        if (ref.entry->generation == ref.generation && ref.entry->in_policy) {
          s_.policy->OnHit(ref.entry);
        }
      }
    }
    uint64_t hit_bytes = 0;
    for (const BlockMatch& b : result_.blocks) hit_bytes += b.payload_bytes;
    s_.m.match_requests->Increment();
    s_.m.match_tokens->Increment(prompt_tokens);
    s_.m.hit_tokens->Increment(result_.hit_tokens());
    s_.m.hit_bytes->Increment(hit_bytes);
    Impl::NamespaceCounters& c = s_.CountersOf(ns_);
    c.match_requests.fetch_add(1, std::memory_order_relaxed);
    c.match_tokens.fetch_add(prompt_tokens, std::memory_order_relaxed);
    c.hit_tokens.fetch_add(result_.hit_tokens(), std::memory_order_relaxed);
    c.hit_bytes.fetch_add(hit_bytes, std::memory_order_relaxed);
    s_.m.lookup_seconds->Observe(SecondsSince(*s_.clock, start_));
    return std::move(result_);
  }

 private:
  // Counts a hit on the DRAM entry under `k` (leasing it when asked) and
  // describes it. The description is taken under the shard lock: without a
  // lease nothing stops eviction from reusing the entry right after.
  std::optional<BlockMatch> Pin(const EntryKey& k) {
    Impl::Shard& shard = s_.ShardFor(k);
    std::shared_lock lock(shard.mu);
    Entry* e = s_.FindVisibleLocked(shard, k, start_);
    if (e == nullptr) return std::nullopt;
    if (lease_ && e->leases.fetch_add(1) == 0) {
      e->ns_lease_pinned_bytes->fetch_add(static_cast<int64_t>(e->extent.length));
    }
    const uint64_t earlier_hits = e->hits.fetch_add(1, std::memory_order_relaxed);
    hits_.push_back({e, e->generation});
    if (earlier_hits == 0 && s_.SsdAdmits(k.kind) &&
        s_.opts.ssd_admission == CacheStoreOptions::SsdAdmission::kHitOnce) {
      s_.EnqueueWriteBack(e);
    }
    return BlockMatch{k.chain,          Tier::kDram, e->layout_id,
                      e->payload_bytes, e->checksum, e->extent.offset};
  }

  // Reads an SSD-only entry into DRAM and pins it like a DRAM hit. The
  // promotion's reader pin keeps the entry alive until the lease holds it.
  std::optional<BlockMatch> PromoteAndPin(const EntryKey& k,
                                          const std::optional<ChainKey>& parent) {
    if (!s_.SsdAdmits(k.kind)) return std::nullopt;
    Result<EntryRef> promoted = s_.PinOrPromote(k, result_.model_id, parent, start_);
    if (!promoted.ok()) return std::nullopt;
    std::optional<BlockMatch> e = Pin(k);
    s_.Unpin(*promoted, /*lease=*/false);
    return e;
  }

  // An SSD-only entry: a hit, reported as Tier::kSsd and promoted by fetch.
  // Not leased (the SSD tier evicts by days-long TTL and watermarks; a block
  // gone by fetch time cuts the prefix there).
  std::optional<SsdEntryMeta> LookupSsd(const EntryKey& k) {
    if (!s_.SsdAdmits(k.kind)) return std::nullopt;
    const SsdKey key{ns_name_, result_.model_id, k.chain, k.kind};
    std::optional<SsdEntryMeta> meta = s_.ssd->Lookup(key);
    if (meta.has_value()) ssd_hits_.push_back(key);  // touched by Finish
    return meta;
  }

  Impl& s_;
  const uint32_t ns_;
  const std::string ns_name_;
  const bool lease_;
  const bool promote_;
  bool batch_ = false;    // see BatchPromotions
  bool stopped_ = false;  // a deferred promotion failed: the prefix ends there
  // SSD-only blocks waiting for Flush, and their places in result_.blocks.
  struct Deferred {
    EntryKey key;
    std::optional<ChainKey> parent;
    size_t index;
  };
  std::vector<Deferred> deferred_;
  std::optional<ChainKey> previous_hit_;  // the last visited key, if it hit
  uint64_t lease_room_ = UINT64_MAX;      // see LimitLeasedEntries
  const Nanos lease_ttl_;
  const Nanos start_;
  std::vector<EntryRef> hits_;
  std::vector<SsdKey> ssd_hits_;  // SSD-only hits, in chain order
  MatchResult result_;
};

Result<MatchResult> CacheStore::Match(const Principal& caller, const MatchRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  if (req.tokens.size() > kMaxPromptTokens) {
    return InvalidArgument("prompt of " + std::to_string(req.tokens.size()) +
                           " tokens exceeds the limit of " + std::to_string(kMaxPromptTokens));
  }
  const size_t blocks = req.block_tokens == 0 ? 0 : req.tokens.size() / req.block_tokens;
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, blocks));
  const ChainRoot root{caller.ns, req.model_id, req.extra};
  STRATA_RETURN_IF_ERROR(ValidateChainInputs(root, req.mm));
  PrefixLookup lookup(*impl_, caller, req.model_id, req.block_tokens, static_cast<uint32_t>(blocks),
                      req.take_lease, req.lease_ttl);
  if (req.take_lease) {
    Result<uint64_t> room = impl_->LeaseRoom(caller.ns);
    if (!room.ok()) return room.status();
    lookup.LimitLeasedEntries(*room);
  }
  // Hash block by block and stop at the first miss: the rest of the prompt
  // cannot hit and need not be hashed.
  auto keys = ChainKeys::ForPrompt(root, req.tokens, req.block_tokens, req.mm,
                                   [&](size_t, const ChainKey& key) { return lookup.Visit(key); });
  if (!keys.ok()) {
    lookup.Abandon();
    return keys.status();
  }
  if (req.want_swa) lookup.FindSwa();
  return lookup.Finish(ChainKeys::Root(root), req.tokens.size());
}

Result<MatchResult> CacheStore::MatchKeys(const Principal& caller, const MatchKeysRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, req.keys.size()));
  PrefixLookup lookup(*impl_, caller, req.model_id, req.block_tokens,
                      static_cast<uint32_t>(req.keys.size()), req.take_lease, req.lease_ttl,
                      req.promote_ssd);
  if (req.take_lease) {
    Result<uint64_t> room = impl_->LeaseRoom(caller.ns);
    if (!room.ok()) return room.status();
    lookup.LimitLeasedEntries(*room);
  }
  if (!req.independent_keys) lookup.BatchPromotions();
  for (const ChainKey& key : req.keys) {
    if (!lookup.Visit(key) && !req.independent_keys) break;
  }
  if (req.want_swa) lookup.FindSwa();
  return lookup.Finish(req.root, uint64_t{req.block_tokens} * req.keys.size());
}

// ---- fetch ------------------------------------------------------------------

FetchFuture CacheStore::Fetch(const Principal& caller, const FetchRequest& req) {
  Impl& s = *impl_;
  FetchOutcome out;
  auto fail = [&](Status st) {
    out.status = std::move(st);
    return FetchFuture::Ready(std::move(out));
  };
  if (Status st = CheckCaller(caller, Role::kRead); !st.ok()) return fail(st);
  bool want_swa = false;
  if (Status st = CheckFetchRequest(req, &want_swa); !st.ok()) return fail(st);
  const MatchResult& match = *req.match;
  const size_t n = req.block_buffers.size();
  if (n == 0 && !want_swa) return FetchFuture::Ready(std::move(out));  // nothing asked for
  const Nanos start = s.clock->Now();
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value()) return fail(NotFound("nothing stored for namespace '" + caller.ns + "'"));

  // 1. Pin what we will read: through the lease, or by looking keys up.
  std::vector<EntryRef> pinned;  // blocks first, then the SWA entry
  pinned.reserve(n + 1);
  EntryRef swa_ref;
  Status pin_status;
  if (match.lease != 0) {
    bool write_lease = false;
    pin_status = s.leases.WithLive(*ns, match.lease, start, [&](const LeaseRecord& rec) {
      write_lease = rec.write;
      if (write_lease) return;  // reserved bytes are nobody's to read
      for (const EntryRef& ref : rec.entries) {
        const Entry* e = ref.entry;
        const bool is_swa = e->key.kind == StateKind::kSwaState;
        if (is_swa ? !want_swa : pinned.size() >= n) continue;
        ref.entry->readers.fetch_add(1);
        (is_swa ? swa_ref : pinned.emplace_back()) = ref;
      }
    });
    if (!pin_status.ok()) return fail(pin_status);
    if (write_lease) {
      return fail(InvalidArgument("lease " + std::to_string(match.lease) + " is a write lease"));
    }
    if (s.ssd != nullptr) {
      // The lease holds the DRAM blocks only; line them up with the match
      // and promote the SSD-only ones in between.
      std::vector<EntryRef> leased = std::move(pinned);
      pinned.clear();
      std::vector<std::optional<EntryRef>> slots(n);
      std::vector<size_t> missing;
      size_t j = 0;
      for (size_t b = 0; b < n; ++b) {
        if (j < leased.size() && leased[j].entry->key.chain == match.blocks[b].key) {
          slots[b] = leased[j++];
        } else {
          missing.push_back(b);
        }
      }
      for (; j < leased.size(); ++j) s.Unpin(leased[j], /*lease=*/false);
      std::vector<Result<EntryRef>> promoted = s.PromoteBlocks(*ns, match, missing, start);
      for (size_t b = 0, m = 0; b < n; ++b) {
        if (!slots[b].has_value()) {
          Result<EntryRef>& ref = promoted[m++];
          if (!ref.ok()) {
            if (pin_status.ok()) {
              pin_status = NotFound("block " + std::to_string(b) +
                                    " is no longer stored: " + ref.status().message());
            }
            continue;
          }
          slots[b] = *ref;
        }
        // Past the first gap nothing is served: drop the pins.
        if (pin_status.ok()) {
          pinned.push_back(*slots[b]);
        } else {
          s.Unpin(*slots[b], /*lease=*/false);
        }
      }
      if (want_swa && swa_ref.entry == nullptr) {
        Result<EntryRef> ref = s.PinOrPromote({*ns, StateKind::kSwaState, match.swa->entry.key},
                                              match.model_id, std::nullopt, start);
        if (ref.ok()) swa_ref = *ref;
      }
    }
  } else {
    auto pin = [&](StateKind kind, const ChainKey& key) -> EntryRef {
      const EntryKey k{*ns, kind, key};
      if (s.ssd != nullptr) {
        Result<EntryRef> ref = s.PinOrPromote(k, match.model_id, std::nullopt, start);
        return ref.ok() ? *ref : EntryRef{};
      }
      return s.PinReader(k, start);
    };
    if (s.ssd == nullptr) {
      for (size_t b = 0; b < n; ++b) {
        EntryRef ref = s.PinReader({*ns, StateKind::kGlobalKv, match.blocks[b].key}, start);
        if (ref.entry == nullptr) {
          pin_status = NotFound("block " + std::to_string(b) + " is no longer stored");
          break;
        }
        pinned.push_back(ref);
      }
    } else {
      // The SSD-only blocks are read together.
      std::vector<size_t> all(n);
      for (size_t b = 0; b < n; ++b) all[b] = b;
      std::vector<Result<EntryRef>> refs = s.PromoteBlocks(*ns, match, all, start);
      for (size_t b = 0; b < n; ++b) {
        if (!refs[b].ok()) {
          if (pin_status.ok()) {
            pin_status = NotFound("block " + std::to_string(b) + " is no longer stored");
          }
        } else if (pin_status.ok()) {
          pinned.push_back(*refs[b]);
        } else {
          s.Unpin(*refs[b], /*lease=*/false);  // past the first gap
        }
      }
    }
    if (want_swa) swa_ref = pin(StateKind::kSwaState, match.swa->entry.key);
  }

  // 2. Headers: each must hash to its entry checksum and match its layout.
  uint32_t usable = static_cast<uint32_t>(pinned.size());
  Status status = pin_status;
  std::vector<Entry*> corrupt;
  std::vector<PayloadHeader> headers(pinned.size());
  auto cut = [&](uint32_t b, Status why) {
    if (b < usable) {
      usable = b;
      status = std::move(why);
    }
  };
  for (uint32_t b = 0; b < usable; ++b) {
    Entry* e = pinned[b].entry;
    if (e->key.chain != match.blocks[b].key || e->payload_bytes > req.block_buffers[b].size()) {
      // A match result altered by the caller, or a lease from another match.
      cut(b, InvalidArgument("block " + std::to_string(b) + " does not match its lease entry"));
      break;
    }
    const Layout* layout = s.FindLayout(e->layout_id);
    const std::span<const std::byte> src = s.arena->Bytes(e->extent, e->payload_bytes);
    const uint32_t hb = layout->HeaderBytes();
    std::byte* dst = req.block_buffers[b].data();
    Result<PayloadHeader> header = InvalidArgument("unverified");
    if (CopyAndChecksum(dst, src.data(), hb) == e->checksum) {
      header = ParsePayloadHeader({dst, e->payload_bytes});
    }
    Status st =
        header.ok()
            ? CheckHeaderMatchesLayout(*header, *layout)
            : ChecksumMismatch("block " + std::to_string(b) + ": header fails the entry checksum");
    if (!st.ok()) {
      corrupt.push_back(e);
      cut(b, st);
      break;
    }
    headers[b] = std::move(header).value();
    out.bytes += hb;
  }

  // 3. The SWA state first: a worker needs it, with layer group 0, before
  // it runs layer 0, so it must not wait behind every block's body. It is
  // only good with the prefix under it: a body that fails later, short of
  // its boundary, voids it (out.swa_ready below).
  auto prefix_intact = [&] { return want_swa && usable >= match.swa->boundary_blocks; };
  bool swa_verified = false;
  if (swa_ref.entry != nullptr && (swa_ref.entry->key.chain != match.swa->entry.key ||
                                   swa_ref.entry->payload_bytes > req.swa_buffer.size())) {
    if (status.ok()) status = InvalidArgument("SWA entry does not match the lease");
  } else if (swa_ref.entry != nullptr && prefix_intact()) {
    Entry* e = swa_ref.entry;
    const Layout* layout = s.FindLayout(e->layout_id);
    std::memcpy(req.swa_buffer.data(), s.arena->Bytes(e->extent, e->payload_bytes).data(),
                e->payload_bytes);
    Status st = VerifyPayload(*layout, req.swa_buffer.first(e->payload_bytes), e->checksum);
    if (st.ok()) {
      swa_verified = true;
      if (req.on_event) req.on_event({FetchEvent::Type::kSwaReady, 0, 0});
    } else {
      corrupt.push_back(e);
      if (status.ok()) status = st;
    }
  } else if (want_swa && swa_ref.entry == nullptr && status.ok()) {
    status = NotFound("SWA state is no longer stored");
  }

  // 4. Bodies, layer group by layer group across blocks, so layer group 0
  // of the whole prefix is usable before group 1 starts.
  std::vector<VerifiedCopy> copies(usable);
  for (uint32_t b = 0; b < usable; ++b) {
    const Entry* e = pinned[b].entry;
    copies[b] = {s.arena->Bytes(e->extent, e->payload_bytes).data(), req.block_buffers[b].data(),
                 &headers[b]};
  }
  std::optional<CopyFailure> failure;
  const auto arrived = static_cast<uint32_t>(CopyVerifiedBodies(
      copies, req.on_event, &out.bytes, &failure,
      [&](size_t g) {
        if (g == 0) s.m.first_group_seconds->Observe(SecondsSince(*s.clock, start));
      },
      s.copy_pool.get()));
  if (failure.has_value()) {
    corrupt.push_back(pinned[failure->block].entry);
    cut(arrived, ChecksumMismatch("block " + std::to_string(failure->block) + ", layer group " +
                                  std::to_string(failure->group) + " fails its checksum"));
  }
  out.blocks_ready = usable;
  if (swa_verified && prefix_intact()) {
    out.swa_ready = true;
    out.bytes += swa_ref.entry->payload_bytes;
  }

  // 5. Let go, and drop whatever failed verification: never serve it again.
  std::vector<EntryRef> refs_to_drop;
  for (Entry* e : corrupt) {
    for (const EntryRef& ref : pinned) {
      if (ref.entry == e) refs_to_drop.push_back(ref);
    }
    if (swa_ref.entry == e) refs_to_drop.push_back(swa_ref);
  }
  s.DropCorrupt(refs_to_drop);
  for (const EntryRef& ref : pinned) s.Unpin(ref, /*lease=*/false);
  if (swa_ref.entry != nullptr) s.Unpin(swa_ref, /*lease=*/false);

  out.status = status;
  s.m.fetch_bytes->Increment(out.bytes);
  s.m.fetch_seconds->Observe(SecondsSince(*s.clock, start));
  return FetchFuture::Ready(std::move(out));
}

// ---- commit -----------------------------------------------------------------

Result<Reservation> CacheStore::Reserve(const Principal& caller, const ModelId& model,
                                        std::span<const CommitBlock> blocks, Nanos ttl) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kWrite));
  if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
    return InvalidArgument("commit needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("write lease ttl out of range");
  if (ttl == 0) ttl = s.opts.default_write_lease_ttl;
  std::vector<const Layout*> layouts(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    Status st = s.ValidateCommitBlock(blocks[i], &layouts[i]);
    if (!st.ok()) return Status(st.code(), "block " + std::to_string(i) + ": " + st.message());
    // Would never fit, whatever is evicted: say so, not "no room".
    if (blocks[i].payload_bytes > s.arena->capacity_bytes()) {
      return ResourceExhausted(
          "block " + std::to_string(i) + ": an entry of " +
          std::to_string(blocks[i].payload_bytes) + " bytes is larger than the whole DRAM tier (" +
          std::to_string(s.arena->capacity_bytes()) + " bytes): raise dram_bytes");
    }
  }
  const uint32_t ns = s.InternNamespace(caller.ns);
  const Nanos now = s.clock->Now();

  Reservation out;
  out.blocks.resize(blocks.size());
  LeaseRecord rec;
  rec.ns = ns;
  rec.write = true;
  rec.granted = now;
  rec.expiry = now + ttl;
  rec.batch_size = static_cast<uint32_t>(blocks.size());
  rec.entries.reserve(blocks.size());
  rec.positions.reserve(blocks.size());
  rec.parents.reserve(blocks.size());
  {
    std::lock_guard lock(s.structure_mu);
    // Refused before anything changes (an expired entry deleted, others
    // evicted to make room); the grant below makes the exact check.
    const Impl::ReserveNeed need = s.ReserveNeedLocked(ns, blocks, now);
    if (std::string why = s.PastLeaseLimits(ns, need.entries, need.bytes); !why.empty()) {
      return Impl::LeaseRefused(caller.ns, why);
    }
    // Nor does a batch that could not fit even if every evictable entry
    // went evict any of them first.
    const uint64_t capacity = s.arena->capacity_bytes();
    if (const uint64_t held = s.UnevictableBytesLocked();
        need.bytes > capacity - std::min(capacity, held)) {
      return ResourceExhausted("no room for " + std::to_string(need.bytes) +
                               " bytes in the DRAM tier: " + std::to_string(held) + " of its " +
                               std::to_string(capacity) +
                               " bytes are reserved or held by read leases");
    }
    auto undo = [&] {
      for (const EntryRef& ref : rec.entries) s.EraseLocked(ref.entry);
    };
    std::atomic<int64_t>* const ns_pinned = s.LeasePinnedBytes(ns);
    uint64_t batch_bytes = 0;  // extents reserved so far
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CommitBlock& b = blocks[i];
      const EntryKey k{ns, b.kind, b.key};
      if (Entry* existing = s.IndexedUnderStructureMu(k)) {
        const EntryState st = existing->state.load();
        if (st == EntryState::kCommitted && existing->expiry > now) {
          out.blocks[i].state = ReserveState::kAlreadyPresent;
          continue;
        }
        if (st == EntryState::kCommitted) {
          s.DeleteSubtreeLocked(existing, EvictReason::kTtl);  // expired: make room
        }
        if (s.IndexedUnderStructureMu(k) != nullptr) {
          out.blocks[i].state = ReserveState::kInFlight;
          continue;
        }
      }
      const TenantSharePolicy::Room room{ns, batch_bytes};
      std::optional<Extent> extent = s.AllocateLocked(b.payload_bytes, now, room, need.keep);
      if (!extent.has_value()) {
        const std::string why = s.NoRoomLocked(b.payload_bytes, room);
        undo();
        return ResourceExhausted(why);
      }
      batch_bytes += extent->length;
      Entry* e = s.pool.Acquire();
      e->key = k;
      e->ns_lease_pinned_bytes = ns_pinned;
      e->model_id = model;
      e->layout_id = b.layout_id;
      e->payload_bytes = b.payload_bytes;
      e->extent = *extent;
      e->state.store(EntryState::kReserved);
      {
        Impl::Shard& shard = s.ShardFor(k);
        std::unique_lock slock(shard.mu);
        shard.map.emplace(k, e);
      }
      ++s.reserved_entries;
      s.reserved_bytes += e->extent.length;
      s.payload_bytes.fetch_add(b.payload_bytes);
      rec.entries.push_back({e, e->generation});
      rec.positions.push_back(static_cast<uint32_t>(i));
      rec.parents.push_back(b.parent);
      out.blocks[i].state = ReserveState::kReserved;
      out.blocks[i].buffer = s.arena->Bytes(e->extent, e->payload_bytes);
    }
    if (!rec.entries.empty()) {
      // Granted under structure_mu, so a concurrent reservation's check
      // above counts this one's extents. Refused only if read leases
      // pinned more meanwhile (or deleting an expired block took later
      // blocks of the batch with it, which the check counted as present).
      const Nanos expiry = rec.expiry;
      s.m.leases_live_write->Add(1);  // before: it may end as soon as granted
      Result<LeaseId> lease = s.leases.Grant(rec, s.LeaseLimitsFor(ns));
      if (!lease.ok()) {
        s.m.leases_live_write->Add(-1);
        undo();  // no lease: nothing can have pinned them
        return Impl::LeaseRefused(caller.ns, lease.status().message());
      }
      out.expiry = expiry;
      out.write_lease = *lease;
    }
    s.m.used_bytes->Set(static_cast<int64_t>(s.arena->used_bytes()));
    s.EvictToWatermarkLocked(now, need.keep);
  }
  return out;
}

Result<PublishResult> CacheStore::Publish(const Principal& caller, LeaseId lease,
                                          std::span<const uint64_t> checksums) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kWrite));
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value()) return LeaseExpired("write lease " + std::to_string(lease) + " is not live");
  const Nanos now = s.clock->Now();
  uint32_t batch = 0;
  bool write = false;
  Status live = s.leases.WithLive(*ns, lease, now, [&](const LeaseRecord& rec) {
    batch = rec.batch_size;
    write = rec.write;
  });
  if (live.code() == StatusCode::kLeaseExpired) {
    // Too late: give the space back now rather than at the next sweep.
    std::optional<LeaseRecord> rec = s.leases.Take(*ns, lease);
    if (rec.has_value()) s.EndLease(*rec, /*expired=*/true);
  }
  STRATA_RETURN_IF_ERROR(live);
  if (!write) return InvalidArgument("lease " + std::to_string(lease) + " is a read lease");
  if (checksums.size() != batch) {
    return InvalidArgument("publish needs one checksum per reserved block: got " +
                           std::to_string(checksums.size()) + ", reservation has " +
                           std::to_string(batch));
  }
  std::optional<LeaseRecord> rec = s.leases.Take(*ns, lease);
  if (!rec.has_value()) return LeaseExpired("write lease " + std::to_string(lease) + " ended");
  if (rec->expiry <= now) {
    s.EndLease(*rec, /*expired=*/true);
    return LeaseExpired("write lease " + std::to_string(lease) + " expired before publish");
  }
  s.m.leases_live_write->Add(-1);

  // Verify outside the structure lock: reserved entries belong to this lease
  // alone, nothing else reads or frees them.
  const size_t n = rec->entries.size();
  std::vector<Status> verdict(n);
  const Layout* layout = nullptr;  // a batch is almost always of one layout
  for (size_t j = 0; j < n; ++j) {
    Entry* e = rec->entries[j].entry;
    const uint64_t sum = checksums[rec->positions[j]];
    if (layout == nullptr || layout->id != e->layout_id) layout = s.FindLayout(e->layout_id);
    verdict[j] = VerifyPayload(*layout, s.arena->Bytes(e->extent, e->payload_bytes), sum);
    if (verdict[j].code() == StatusCode::kChecksumMismatch) s.m.checksum_failures->Increment();
    e->checksum = sum;
  }

  PublishResult out;
  out.blocks.assign(batch, Status::Ok());
  std::lock_guard lock(s.structure_mu);
  std::vector<Entry*> published;
  published.reserve(n);
  for (size_t j = 0; j < n; ++j) {
    Entry* e = rec->entries[j].entry;
    const uint32_t pos = rec->positions[j];
    Entry* parent = nullptr;
    if (verdict[j].ok() && rec->parents[j].has_value()) {
      parent = s.VisibleUnderStructureMu({*ns, StateKind::kGlobalKv, *rec->parents[j]}, now);
      if (parent == nullptr) {
        verdict[j] = NotFound("block " + std::to_string(pos) +
                              ": its parent block is not stored (parents must be committed "
                              "first or earlier in the same batch)");
      }
    }
    if (!verdict[j].ok()) {
      out.blocks[pos] = verdict[j];
      s.EraseReservedLocked(e);
      continue;
    }
    {
      Impl::Shard& shard = s.ShardFor(e->key);
      std::unique_lock slock(shard.mu);
      e->commit_time = now;
      e->expiry = now + s.TtlFor(e->key.kind);
      e->state.store(EntryState::kCommitted);
    }
    --s.reserved_entries;
    s.reserved_bytes -= e->extent.length;
    s.CountEntry(e, +1);
    if (parent != nullptr) s.TreeLink(e, parent);
    s.TtlAppend(e);
    published.push_back(e);
    s.m.commit_bytes->Increment(e->payload_bytes);
    if (s.SsdAdmits(e->key.kind) &&
        s.opts.ssd_admission == CacheStoreOptions::SsdAdmission::kAllGlobalKv) {
      s.EnqueueWriteBack(e);
    }
  }
  // Newest blocks in, deepest first; then their existing ancestors touched
  // root-last, so along every chain an ancestor is younger than its
  // descendants and LRU's victim is always a leaf.
  for (size_t i = published.size(); i-- > 0;) s.policy->OnInsert(published[i]);
  for (Entry* e : published) {
    const bool attaches = e->parent != nullptr && std::find(published.begin(), published.end(),
                                                            e->parent) == published.end();
    // Bounded: ordering is an optimisation (leaf-only eviction is what keeps
    // the tree prefix-safe), and a chain grown block by block gets deep.
    size_t depth = 0;
    for (Entry* a = attaches ? e->parent : nullptr; a != nullptr && depth < kMaxBlocksPerCall;
         a = a->parent, ++depth) {
      s.policy->OnAccess(a);
    }
  }
  out.published = static_cast<uint32_t>(published.size());
  s.m.commit_entries->Increment(published.size());
  return out;
}

Result<PublishResult> CacheStore::Commit(const Principal& caller, const ModelId& model,
                                         std::span<const CommitPayload> payloads) {
  Result<std::vector<CommitBlock>> checked = CommitBlocksOf(payloads);
  if (!checked.ok()) return checked.status();
  const std::vector<CommitBlock>& blocks = *checked;
  Result<Reservation> reservation = Reserve(caller, model, blocks);
  if (!reservation.ok()) return reservation.status();
  std::vector<uint64_t> checksums(payloads.size(), 0);
  for (size_t i = 0; i < payloads.size(); ++i) {
    const ReservedBlock& rb = reservation->blocks[i];
    if (rb.state != ReserveState::kReserved) continue;
    std::memcpy(rb.buffer.data(), payloads[i].bytes.data(), payloads[i].bytes.size());
    checksums[i] = payloads[i].checksum;
  }
  if (reservation->write_lease == 0) {
    PublishResult nothing_to_do;
    nothing_to_do.blocks.assign(payloads.size(), Status::Ok());
    return nothing_to_do;
  }
  return Publish(caller, reservation->write_lease, checksums);
}

namespace {
// Whether `lease` is a write lease. Only a writer may act on one (`what`
// it tries names the attempt): a reader could otherwise drop another
// client's reservation or hold its space for ever.
Result<bool> CheckLeaseRole(const LeaseTable& leases, const Principal& caller, uint32_t ns,
                            LeaseId lease, const char* what) {
  const bool write = leases.IsWrite(ns, lease).value_or(false);
  if (write && !RoleAllows(caller, Role::kWrite)) {
    return PermissionDenied(std::string(what) + " write lease " + std::to_string(lease) +
                            " needs the write role");
  }
  return write;
}
}  // namespace

Status CacheStore::RenewLease(const Principal& caller, LeaseId lease, Nanos ttl,
                              Nanos* applied_ttl) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl out of range");
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value()) return LeaseExpired("lease " + std::to_string(lease) + " is not live");
  // A reservation renewed for ever holds unevictable space.
  const Result<bool> write = CheckLeaseRole(s.leases, caller, *ns, lease, "renewing");
  if (!write.ok()) return write.status();
  if (ttl == 0) ttl = *write ? s.opts.default_write_lease_ttl : s.opts.default_read_lease_ttl;
  const Nanos now = s.clock->Now();
  STRATA_RETURN_IF_ERROR(s.leases.Renew(*ns, lease, now, now + ttl, s.opts.max_lease_life));
  if (applied_ttl != nullptr) *applied_ttl = ttl;
  return Status::Ok();
}

Status CacheStore::Abort(const Principal& caller, LeaseId lease) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value() || lease == 0) return Status::Ok();
  STRATA_RETURN_IF_ERROR(CheckLeaseRole(s.leases, caller, *ns, lease, "dropping").status());
  std::optional<LeaseRecord> rec = s.leases.Take(*ns, lease);
  if (rec.has_value()) s.EndLease(*rec, /*expired=*/rec->expiry <= s.clock->Now());
  return Status::Ok();
}

// ---- admin ------------------------------------------------------------------

namespace {
// Every field of an entry (structure lock held: the tree links are read).
EntryInfo DescribeLocked(const Entry& e, const std::string& ns) {
  EntryInfo info;
  info.key = e.key.chain;
  info.kind = e.key.kind;
  info.ns = ns;
  info.model_id = e.model_id;
  info.layout_id = e.layout_id;
  info.payload_bytes = e.payload_bytes;
  info.checksum = e.checksum;
  info.commit_time = e.commit_time;
  info.expiry = e.expiry;
  info.pinned_until = e.pinned_until.load();
  info.live_leases = e.leases.load();
  info.hits = e.hits.load();
  info.has_parent = e.parent != nullptr;
  for (const Entry* c = e.first_child; c != nullptr; c = c->next_sibling) ++info.children;
  return info;
}

// Finds a committed entry for an admin call; NOT_FOUND otherwise.
template <typename ImplT, typename Fn>
Status WithEntry(ImplT& s, const Principal& caller, const ChainKey& key, StateKind kind, Fn fn) {
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  const std::string what = std::string(StateKindName(kind)) + " entry " + key.ToHex();
  if (!ns.has_value()) return NotFound("no " + what);
  std::lock_guard lock(s.structure_mu);
  const EntryKey k{*ns, kind, key};
  Entry* e = nullptr;
  {
    auto& shard = s.ShardFor(k);
    std::shared_lock slock(shard.mu);
    e = s.FindVisibleLocked(shard, k, s.clock->Now());
  }
  if (e == nullptr) return NotFound("no " + what);
  if constexpr (std::is_same_v<decltype(fn(e)), Status>) {
    return fn(e);
  } else {
    fn(e);
    return Status::Ok();
  }
}
}  // namespace

namespace {

// Admin pages follow (chain key, kind) order.
bool CursorLess(const ChainKey& a_key, StateKind a_kind, const ChainKey& b_key, StateKind b_kind) {
  const int c = std::memcmp(a_key.bytes.data(), b_key.bytes.data(), a_key.bytes.size());
  return c != 0 ? c < 0 : a_kind < b_kind;
}

// An SSD copy as admin calls show it: times become the store clock's, as
// DRAM entries' are.
EntryInfo DescribeSsdCopy(const SsdKey& key, const SsdEntryMeta& meta, Nanos now, Nanos shift) {
  EntryInfo info;
  info.key = key.chain;
  info.kind = key.kind;
  info.ns = key.ns;
  info.model_id = key.model_id;
  info.layout_id = meta.layout_id;
  info.payload_bytes = meta.payload_bytes;
  info.checksum = meta.entry_checksum;
  info.tier = Tier::kSsd;
  info.commit_time = std::min(meta.commit_time + shift, now);  // the wall clock may step
  info.expiry = meta.expiry + shift;
  return info;
}

// The SSD copies of one entry (any model): what admin calls act on when the
// entry is not in DRAM.
std::vector<EntryInfo> SsdCopies(const SsdTier* ssd, const Clock& clock, const std::string& ns,
                                 const EntryCursor& only) {
  std::vector<EntryInfo> out;
  if (ssd == nullptr) return out;
  const Nanos now = clock.Now();
  const Nanos shift = now - ssd->Now();
  for (const auto& [key, meta] : ssd->Find(ns, only.key, only.kind)) {
    out.push_back(DescribeSsdCopy(key, meta, now, shift));
  }
  return out;
}

// The SSD copies of namespace `ns` past `after` in (key, kind) order: every
// one (`limit` 0), read a page at a time so the tier's lock is never held
// for long, or one page of about `limit`. A page that may not be the last
// sets `*bound` to its last (key, kind): copies past it were not read.
std::vector<EntryInfo> SsdCopiesPast(const SsdTier* ssd, const Clock& clock, const std::string& ns,
                                     std::optional<EntryCursor> after, size_t limit,
                                     std::optional<EntryCursor>* bound) {
  constexpr size_t kPage = 1024;
  std::vector<EntryInfo> out;
  bound->reset();
  if (ssd == nullptr) return out;
  const Nanos now = clock.Now();
  const Nanos shift = now - ssd->Now();
  for (;;) {
    std::optional<SsdListCursor> from;
    if (after.has_value()) from = SsdListCursor{after->key, after->kind};
    const SsdListPage page = ssd->List(ns, from, limit == 0 ? kPage : limit);
    for (const auto& [key, meta] : page.entries)
      out.push_back(DescribeSsdCopy(key, meta, now, shift));
    if (!page.more || page.entries.empty()) return out;
    after = EntryCursor{page.entries.back().first.chain, page.entries.back().first.kind};
    if (limit != 0) {
      *bound = after;
      return out;
    }
  }
}

Status EraseSsdCopies(SsdTier* ssd, const std::vector<EntryInfo>& copies) {
  Status first;
  for (const EntryInfo& c : copies) {
    Status st = ssd->Erase({c.ns, c.model_id, c.key, c.kind});
    if (!st.ok() && st.code() != StatusCode::kNotFound && first.ok()) first = st;
  }
  return first;
}

// The SSD-only copies in namespace `ns` (id `ns_id`) that `wanted` accepts,
// for an admin call that goes on to a DRAM pass under structure_mu: every
// one past `after`, or with a `limit`, those of one page of about that many
// (`*bound` as in SsdCopiesPast; copies past it are left out). Reads
// the tier without the lock, then takes it through `lock` (held on return)
// and adds the copies of entries that left DRAM meanwhile, which the read
// may have missed (Impl::demoted): looked up without the lock for a few
// rounds while more arrive, then under it. Copies of committed DRAM
// entries are left out: the DRAM pass accounts for them. Reads nothing
// (and only locks) without an SSD tier or when `read_ssd` is false (the
// filter accepts no SSD copy). `now` is the caller's DRAM pass's: with
// ExpiredDram::kGone, a DRAM entry expired by then leaves its copy in.
enum class ExpiredDram {
  kGone,   // a listing: an expired DRAM entry, not swept yet, is not shown;
           // its SSD copy, kept longer, stands for it
  kThere,  // an eviction: its DRAM pass removes it and its SSD copy
};

template <typename ImplT, typename Pred>
std::vector<EntryInfo> ScanSsdThenLock(ImplT& s, const std::string& ns, uint32_t* ns_id,
                                       bool read_ssd, Nanos now,
                                       const std::optional<EntryCursor>& after, size_t limit,
                                       std::optional<EntryCursor>* bound, ExpiredDram expired_dram,
                                       Pred wanted, std::unique_lock<std::mutex>& lock) {
  bound->reset();
  if (s.ssd == nullptr || !read_ssd) {
    lock.lock();
    s.ResolveUnseenLocked(ns, ns_id);
    return {};
  }
  constexpr int kUnlockedRounds = 4;
  uint64_t from = 0;
  {
    std::lock_guard start_lock(s.structure_mu);
    from = s.DemotedEndLocked();
    s.MoveSsdScanLocked(ImplT::kNoScan, from);
  }
  // Ends the scan on every way out, with `lock` held or not.
  struct ScanEnd {
    ImplT& s;
    const uint64_t& from;
    std::unique_lock<std::mutex>& lock;
    ~ScanEnd() {
      const bool held = lock.owns_lock();
      if (!held) lock.lock();
      s.MoveSsdScanLocked(from, ImplT::kNoScan);
      if (!held) lock.unlock();
    }
  } end{s, from, lock};

  std::vector<EntryInfo> copies = SsdCopiesPast(s.ssd.get(), *s.clock, ns, after, limit, bound);
  if (s.after_ssd_scan) s.after_ssd_scan();
  std::unordered_set<EntryKey, EntryKeyHash> looked_up;
  lock.lock();
  for (int round = 0;; ++round) {
    // A namespace unseen at the start may have been interned since (and
    // DRAM entries made in it); none can be while the lock is held.
    s.ResolveUnseenLocked(ns, ns_id);
    std::vector<EntryKey> fresh;
    const uint64_t to = s.DemotedEndLocked();
    for (uint64_t i = from; i < to; ++i) {
      const EntryKey& k = s.demoted[i - s.demoted_base];
      if (k.ns == *ns_id && looked_up.insert(k).second) fresh.push_back(k);
    }
    s.MoveSsdScanLocked(from, to);
    from = to;
    if (fresh.empty()) break;
    const bool unlocked = round < kUnlockedRounds;
    if (unlocked) lock.unlock();
    for (const EntryKey& k : fresh) {
      if (bound->has_value() && CursorLess((*bound)->key, (*bound)->kind, k.chain, k.kind)) {
        continue;  // past the page read
      }
      for (EntryInfo& c : SsdCopies(s.ssd.get(), *s.clock, ns, EntryCursor{k.chain, k.kind})) {
        copies.push_back(std::move(c));
      }
    }
    if (!unlocked) break;  // nothing left DRAM meanwhile: the lock was held
    lock.lock();
  }
  // A copy the read saw can be logged too (it left DRAM afterwards).
  auto id = [](const EntryInfo& c) { return std::tie(c.key, c.kind, c.model_id); };
  std::sort(copies.begin(), copies.end(),
            [&](const EntryInfo& a, const EntryInfo& b) { return id(a) < id(b); });
  copies.erase(std::unique(copies.begin(), copies.end(),
                           [&](const EntryInfo& a, const EntryInfo& b) { return id(a) == id(b); }),
               copies.end());
  std::vector<EntryInfo> out;
  for (EntryInfo& c : copies) {
    if (!wanted(c)) continue;
    const EntryKey k{*ns_id, c.kind, c.key};
    auto& shard = s.ShardFor(k);
    std::shared_lock slock(shard.mu);
    auto it = shard.map.find(k);
    if (it == shard.map.end() || it->second->state.load() != EntryState::kCommitted ||
        (expired_dram == ExpiredDram::kGone && it->second->expiry <= now)) {
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

Status CacheStore::Delete(const Principal& caller, const ChainKey& key, StateKind kind) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kAdmin));
  auto delete_dram = [&] {
    return WithEntry(*impl_, caller, key, kind,
                     [&](Entry* e) { impl_->DeleteSubtreeLocked(e, EvictReason::kExplicit); });
  };
  Status found = delete_dram();
  if (!found.ok() && found.code() != StatusCode::kNotFound) return found;
  // The SSD copies too (any model), or the next match would find them there;
  // SSD-only descendants can no longer be reached (a match stops here).
  const std::vector<EntryInfo> copies =
      SsdCopies(impl_->ssd.get(), *impl_->clock, caller.ns, EntryCursor{key, kind});
  if (found.code() == StatusCode::kNotFound && copies.empty()) return found;
  Status erased = EraseSsdCopies(impl_->ssd.get(), copies);
  // A promotion that published from the SSD copy between the two steps put
  // the entry back in DRAM: delete it again. One that publishes later finds
  // the copy gone and gives up (Impl::Publish).
  if (!copies.empty()) (void)delete_dram();
  return erased;
}

Status CacheStore::Pin(const Principal& caller, const ChainKey& key, StateKind kind, Nanos ttl) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kAdmin));
  if (ttl <= 0 || ttl > Hours(24 * 30)) return InvalidArgument("pin ttl must be in (0, 30 days]");
  Impl& s = *impl_;
  const Nanos now = s.clock->Now();
  return WithEntry(s, caller, key, kind, [&](Entry* e) -> Status {
    // Pinned entries are never evicted: a namespace's pins count with its
    // leases against its share of the tier (max_held_share_per_namespace),
    // or one tenant could pin and lease the others out of room to commit.
    // (Structure lock held: the entry stays meanwhile.)
    Status held = s.leases.HoldPin(e, e->key.ns, e->extent.length, now, now + ttl,
                                   s.LeaseLimitsFor(e->key.ns));
    if (!held.ok()) return Impl::LeaseRefused(caller.ns, held.message());
    e->pinned_until.store(now + ttl);
    return Status::Ok();
  });
}

Status CacheStore::Unpin(const Principal& caller, const ChainKey& key, StateKind kind) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kAdmin));
  Impl& s = *impl_;
  return WithEntry(s, caller, key, kind, [&](Entry* e) {
    s.leases.DropPin(e);
    e->pinned_until.store(0);
  });
}

Result<EntryInfo> CacheStore::Inspect(const Principal& caller, const ChainKey& key,
                                      StateKind kind) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  EntryInfo info;
  Status found =
      WithEntry(*impl_, caller, key, kind, [&](Entry* e) { info = DescribeLocked(*e, caller.ns); });
  if (found.code() == StatusCode::kNotFound) {
    std::vector<EntryInfo> copies =
        SsdCopies(impl_->ssd.get(), *impl_->clock, caller.ns, EntryCursor{key, kind});
    if (!copies.empty()) return std::move(copies.front());
  }
  STRATA_RETURN_IF_ERROR(found);
  return info;
}

MaintenanceReport CacheStore::RunMaintenance() {
  MaintenanceReport report = impl_->RunMaintenance();
  impl_->MaybeRunSsdMaintenance(/*background=*/false);
  return report;
}

void CacheStore::FlushWriteBack() {
  Impl& s = *impl_;
  if (s.ssd == nullptr) return;
  std::unique_lock lock(s.wb_mu);
  s.wb_idle_cv.wait(lock, [&] { return s.wb_queue.empty() && s.wb_busy == 0; });
}

LeaseHolding CacheStore::Holding(const Principal& caller) const {
  const Impl& s = *impl_;
  if (const std::optional<uint32_t> ns = s.FindNamespace(caller.ns)) return s.HoldingOf(*ns);
  // A namespace never seen holds nothing.
  return {.limit_bytes = s.HeldBytesLimit(),
          .leased_entries_limit = s.opts.max_leased_entries_per_namespace};
}

NamespaceStats CacheStore::NamespaceUsage(const Principal& caller) const {
  const Impl& s = *impl_;
  NamespaceStats out;
  out.lease = Holding(caller);
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value()) return out;  // a namespace never seen stores nothing
  const Impl::NamespaceCounters& c = s.CountersOf(*ns);
  auto positive = [](const std::atomic<int64_t>& v) {
    return static_cast<uint64_t>(std::max<int64_t>(v.load(std::memory_order_relaxed), 0));
  };
  out.global_kv_entries = positive(c.global_kv_entries);
  out.swa_entries = positive(c.swa_entries);
  out.used_bytes = positive(c.used_bytes);
  out.match_requests = c.match_requests.load(std::memory_order_relaxed);
  out.match_tokens = c.match_tokens.load(std::memory_order_relaxed);
  out.hit_tokens = c.hit_tokens.load(std::memory_order_relaxed);
  out.hit_bytes = c.hit_bytes.load(std::memory_order_relaxed);
  for (size_t i = 0; i < out.evictions.size(); ++i) {
    out.evictions[i] = c.evictions[i].load(std::memory_order_relaxed);
  }
  return out;
}

StoreStats CacheStore::Stats() const {
  const Impl& s = *impl_;
  StoreStats st;
  st.capacity_bytes = s.arena->capacity_bytes();
  st.used_bytes = s.arena->used_bytes();
  st.payload_bytes = s.payload_bytes.load();
  st.global_kv_entries = static_cast<uint64_t>(s.m.entries_global->Value());
  st.swa_entries = static_cast<uint64_t>(s.m.entries_swa->Value());
  {
    std::lock_guard lock(s.structure_mu);
    st.reserved_entries = s.reserved_entries;
    st.deleting_entries = s.deleting.size();
  }
  st.read_leases = s.leases.live(/*write=*/false);
  st.write_leases = s.leases.live(/*write=*/true);
  for (size_t i = 0; i < st.evictions.size(); ++i) st.evictions[i] = s.evictions[i].load();
  st.huge_pages = s.arena->huge_pages();
  if (s.ssd != nullptr) {
    st.ssd_enabled = true;
    st.ssd = s.ssd->Stats();
    st.ssd_writeback_dropped = s.wb_dropped.load();
    st.ssd_promotions = s.promotions_done.load();
    std::lock_guard lock(s.wb_mu);
    st.ssd_writeback_pending = s.wb_queue.size() + s.wb_busy;
  }
  return st;
}

std::span<std::byte> CacheStore::MutablePayloadForTesting(const Principal& caller,
                                                          const ChainKey& key, StateKind kind) {
  std::span<std::byte> out;
  Status st = WithEntry(*impl_, caller, key, kind,
                        [&](Entry* e) { out = impl_->arena->Bytes(e->extent, e->payload_bytes); });
  (void)st;
  return out;
}

void CacheStore::SetAfterSsdScanHookForTesting(std::function<void()> hook) {
  impl_->after_ssd_scan = std::move(hook);
}

void CacheStore::SetBeforeWriteBackHookForTesting(std::function<void()> hook) {
  impl_->before_write_back = std::move(hook);
}

void CacheStore::SetAfterWriteBackWriteHookForTesting(std::function<void()> hook) {
  impl_->after_write_back_write = std::move(hook);
}

void CacheStore::SetBeforePromotionPublishHookForTesting(std::function<void()> hook) {
  impl_->before_promotion_publish = std::move(hook);
}

Status CacheStore::CheckInvariantsForTesting() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.structure_mu);
  if (s.scan_starts.empty() && !s.demoted.empty()) {
    return Internal("entries that left DRAM are still logged with no SSD scan running");
  }
  uint64_t extents = 0, extent_bytes = 0, payload = 0, reserved = 0;
  uint64_t reserved_bytes = 0;
  uint64_t committed[2] = {0, 0};
  std::unordered_map<uint32_t, int64_t> lease_pinned;  // by namespace
  const Nanos now = s.clock->Now();
  for (uint32_t i = 0; i <= s.shard_mask; ++i) {
    std::shared_lock slock(s.shards[i].mu);
    for (const auto& [k, e] : s.shards[i].map) {
      if (!(e->key == k)) return Internal("index key differs from entry key");
      if (e->leases.load() != 0) lease_pinned[k.ns] += static_cast<int64_t>(e->extent.length);
      ++extents;
      extent_bytes += e->extent.length;
      payload += e->payload_bytes;
      switch (e->state.load()) {
        case EntryState::kReserved:
          ++reserved;
          reserved_bytes += e->extent.length;
          if (e->in_policy || e->in_ttl) return Internal("reserved entry is evictable");
          break;
        case EntryState::kDeleting:
          return Internal("deleting entry still indexed");
        case EntryState::kCommitted:
          ++committed[static_cast<int>(k.kind) - 1];
          if (!e->in_policy || !e->in_ttl) return Internal("committed entry not tracked");
          if (e->parent != nullptr && e->parent->state.load() != EntryState::kCommitted) {
            return Internal("committed entry under a parent that is not committed");
          }
          if (e->leases.load() == 0 && e->readers.load() == 0 && e->first_child == nullptr &&
              e->pinned_until.load() <= now && !s.EvictableLocked(*e, now)) {
            return Internal("unpinned leaf is not evictable");
          }
          break;
      }
    }
  }
  uint64_t deleting_keyed = 0;
  for (const auto& [k, n] : s.deleting_keys) deleting_keyed += n;
  if (deleting_keyed != s.deleting.size()) return Internal("deleting keys drifted");
  for (const Entry* e : s.deleting) {
    if (e->state.load() != EntryState::kDeleting) {
      return Internal("deleting set holds a live entry");
    }
    if (!s.deleting_keys.contains(e->key)) return Internal("deleting entry's key not counted");
    if (e->in_policy || e->in_ttl || e->parent || e->first_child) {
      return Internal("deleting entry still linked");
    }
    if (e->leases.load() == 0 && e->readers.load() == 0) {
      return Internal("deleting entry with no pins was not reclaimed");
    }
    if (e->leases.load() != 0) lease_pinned[e->key.ns] += static_cast<int64_t>(e->extent.length);
    ++extents;
    extent_bytes += e->extent.length;
    payload += e->payload_bytes;
  }
  if (extents != s.pool.live()) return Internal("pool and index disagree on entry count");
  if (extent_bytes != s.arena->used_bytes()) {
    return Internal("arena occupancy " + std::to_string(s.arena->used_bytes()) +
                    " != sum of live extents " + std::to_string(extent_bytes));
  }
  if (extents != s.arena->allocated_extents()) return Internal("arena extent count differs");
  if (!s.arena->CheckConsistency()) return Internal("arena allocator inconsistent");
  if (payload != s.payload_bytes.load()) return Internal("payload byte count drifted");
  if (reserved != s.reserved_entries || reserved_bytes != s.reserved_bytes) {
    return Internal("reserved/deleting counts drifted");
  }
  if (static_cast<int64_t>(committed[0]) != s.m.entries_global->Value() ||
      static_cast<int64_t>(committed[1]) != s.m.entries_swa->Value()) {
    return Internal("entry gauges drifted");
  }
  std::shared_lock ns_lock(s.ns_mu);
  for (uint32_t ns = 0; ns < s.ns_lease_pinned.size(); ++ns) {
    if (s.ns_lease_pinned[ns].load() != lease_pinned[ns]) {
      return Internal("namespace '" + s.ns_names[ns] + "': its read leases pin " +
                      std::to_string(lease_pinned[ns]) + " bytes, counted " +
                      std::to_string(s.ns_lease_pinned[ns].load()));
    }
  }
  return Status::Ok();
}

// ---- admin: listing and eviction by filter ------------------------------------

namespace {
bool Matches(const EntryFilter& f, const Entry& e, Nanos now) {
  if (f.model_id.has_value() && e.model_id != *f.model_id) return false;
  if (f.kind.has_value() && e.key.kind != *f.kind) return false;
  if (f.older_than > 0 && e.commit_time > now - f.older_than) return false;
  if (f.pinned.has_value() && (e.pinned_until.load() > now) != *f.pinned) return false;
  if (f.tier.has_value() && *f.tier != Tier::kDram) return false;
  return true;
}
// Whether the filter can accept any SSD copy (never pinned: pins live in
// DRAM): if not, the SSD tier is not read at all (a listing of pinned
// entries would otherwise page through it).
bool SsdCopiesCanMatch(const EntryFilter& f) {
  return !(f.pinned.has_value() && *f.pinned) && (!f.tier.has_value() || *f.tier == Tier::kSsd);
}
// The same test for an SSD-only entry.
bool MatchesSsdCopy(const EntryFilter& f, const EntryInfo& c, Nanos now) {
  if (f.model_id.has_value() && c.model_id != *f.model_id) return false;
  if (f.kind.has_value() && c.kind != *f.kind) return false;
  if (f.older_than > 0 && c.commit_time > now - f.older_than) return false;
  return SsdCopiesCanMatch(f);
}
}  // namespace

Result<EntryPage> CacheStore::ListEntries(const Principal& caller, const EntryFilter& filter,
                                          const std::optional<EntryCursor>& after, uint32_t limit) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kAdmin));
  if (limit == 0 || limit > kMaxBlocksPerCall) {
    return InvalidArgument("page size must be in 1.." + std::to_string(kMaxBlocksPerCall));
  }
  Impl& s = *impl_;
  EntryPage page;
  std::optional<uint32_t> ns = s.NamespaceForAdmin(caller.ns);
  if (!ns.has_value()) return page;
  const Nanos now = s.clock->Now();
  // SSD-only entries join the page in the same (key, kind) order;
  // DRAM-resident copies are listed once, as their DRAM entry.
  std::unique_lock lock(s.structure_mu, std::defer_lock);
  // One page of the SSD tier, up to `bound` when more may follow: the DRAM
  // entries past it wait for a later page too.
  std::optional<EntryCursor> bound;
  std::vector<EntryInfo> ssd_only = ScanSsdThenLock(
      s, caller.ns, &*ns, SsdCopiesCanMatch(filter), now, after, limit + 1, &bound,
      ExpiredDram::kGone,
      [&](const EntryInfo& c) {
        if (after.has_value() && !CursorLess(after->key, after->kind, c.key, c.kind)) {
          return false;
        }
        return MatchesSsdCopy(filter, c, now);
      },
      lock);
  // The index is hashed, so a page is the `limit` smallest keys past the
  // cursor: a bounded heap over one pass, O(entries x log limit).
  auto less = [](const Entry* a, const Entry* b) {
    return CursorLess(a->key.chain, a->key.kind, b->key.chain, b->key.kind);
  };
  std::vector<Entry*> heap;  // max-heap of the smallest limit + 1 seen
  for (uint32_t i = 0; i <= s.shard_mask; ++i) {
    std::shared_lock slock(s.shards[i].mu);
    for (const auto& [k, e] : s.shards[i].map) {
      if (k.ns != *ns || e->state.load() != EntryState::kCommitted || e->expiry <= now) continue;
      if (after.has_value() && !CursorLess(after->key, after->kind, k.chain, k.kind)) continue;
      if (bound.has_value() && CursorLess(bound->key, bound->kind, k.chain, k.kind)) continue;
      if (!Matches(filter, *e, now)) continue;
      if (heap.size() <= limit) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), less);
      } else if (less(e, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), less);
        heap.back() = e;
        std::push_heap(heap.begin(), heap.end(), less);
      }
    }
  }
  std::sort_heap(heap.begin(), heap.end(), less);
  std::vector<EntryInfo> merged;
  merged.reserve(heap.size() + ssd_only.size());
  for (const Entry* e : heap) merged.push_back(DescribeLocked(*e, caller.ns));
  for (EntryInfo& c : ssd_only) merged.push_back(std::move(c));
  auto info_less = [](const EntryInfo& a, const EntryInfo& b) {
    return CursorLess(a.key, a.kind, b.key, b.kind);
  };
  std::sort(merged.begin(), merged.end(), info_less);
  // Cut after `limit`, but not between two models' copies of one (key,
  // kind): the cursor names no model.
  size_t cut = std::min<size_t>(limit, merged.size());
  while (cut > 0 && cut < merged.size() && !info_less(merged[cut - 1], merged[cut])) ++cut;
  const bool more = cut < merged.size();
  merged.resize(cut);
  page.entries = std::move(merged);
  if (more) {
    page.next = EntryCursor{page.entries.back().key, page.entries.back().kind};
  } else if (bound.has_value()) {
    page.next = bound;  // everything up to it is on this page
  }
  return page;
}

Result<EvictReport> CacheStore::Evict(const Principal& caller, const EvictRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kAdmin));
  Impl& s = *impl_;
  EvictReport report;
  std::optional<uint32_t> ns = s.NamespaceForAdmin(caller.ns);
  if (!ns.has_value()) {
    if (req.root.has_value()) return NotFound("no entry " + req.root->key.ToHex());
    return report;
  }
  const Nanos now = s.clock->Now();
  // SSD-only entries the request covers: listed and erased like DRAM ones
  // (no descendants: the SSD tier keeps no tree; unreachable ones age out).
  std::vector<EntryInfo> ssd_only;
  auto finish_ssd = [&]() -> Result<EvictReport> {
    for (const EntryInfo& c : ssd_only) {
      ++report.evicted;
      report.bytes += c.payload_bytes;
      if (report.entries.size() < req.max_listed) report.entries.push_back(c);
    }
    if (!req.dry_run) STRATA_RETURN_IF_ERROR(EraseSsdCopies(s.ssd.get(), ssd_only));
    return report;
  };
  std::unique_lock lock(s.structure_mu, std::defer_lock);
  if (req.root.has_value()) {
    lock.lock();
    s.ResolveUnseenLocked(caller.ns, &*ns);
  } else {
    std::optional<EntryCursor> bound;  // stays empty: every copy is read
    ssd_only = ScanSsdThenLock(
        s, caller.ns, &*ns, SsdCopiesCanMatch(req.filter), now, std::nullopt, 0, &bound,
        ExpiredDram::kThere, [&](const EntryInfo& c) { return MatchesSsdCopy(req.filter, c, now); },
        lock);
  }

  // 1. The roots: one named entry, or every unpinned entry the filter picks.
  std::vector<Entry*> roots;
  if (req.root.has_value()) {
    const EntryKey k{*ns, req.root->kind, req.root->key};
    Impl::Shard& shard = s.ShardFor(k);
    std::shared_lock slock(shard.mu);
    Entry* e = s.FindVisibleLocked(shard, k, now);
    if (e == nullptr) {
      slock.unlock();
      lock.unlock();
      ssd_only = SsdCopies(s.ssd.get(), *s.clock, caller.ns, *req.root);
      if (ssd_only.empty()) {
        return NotFound("no " + std::string(StateKindName(k.kind)) + " entry " + k.chain.ToHex());
      }
      return finish_ssd();
    }
    roots.push_back(e);
  } else {
    // A pinned entry keeps its ancestors too: without them it could never
    // be matched again.
    std::unordered_set<const Entry*> keep;
    for (uint32_t i = 0; i <= s.shard_mask; ++i) {
      std::shared_lock slock(s.shards[i].mu);
      for (const auto& [k, e] : s.shards[i].map) {
        if (k.ns != *ns || e->pinned_until.load() <= now) continue;
        for (const Entry* a = e; a != nullptr && keep.insert(a).second;) a = a->parent;
      }
    }
    for (uint32_t i = 0; i <= s.shard_mask; ++i) {
      std::shared_lock slock(s.shards[i].mu);
      for (const auto& [k, e] : s.shards[i].map) {
        if (k.ns != *ns || e->state.load() != EntryState::kCommitted) continue;
        if (!Matches(req.filter, *e, now)) continue;
        if (keep.contains(e)) {
          ++report.skipped_pinned;
          continue;
        }
        roots.push_back(e);
      }
    }
  }

  // 2. Close over descendants (they could never be matched again), each
  // entry once, in an order where a root precedes its subtree.
  std::vector<Entry*> affected;
  std::unordered_set<const Entry*> seen;
  for (Entry* root : roots) {
    if (seen.contains(root)) continue;
    std::vector<Entry*> stack{root};
    while (!stack.empty()) {
      Entry* e = stack.back();
      stack.pop_back();
      if (!seen.insert(e).second) continue;
      affected.push_back(e);
      for (Entry* c = e->first_child; c != nullptr; c = c->next_sibling) stack.push_back(c);
    }
  }
  std::vector<EntryInfo> ssd_copies;  // of the DRAM entries that go
  for (const Entry* e : affected) {
    const bool held = e->leases.load() != 0 || e->readers.load() != 0;
    ++(held ? report.deferred : report.evicted);
    report.bytes += e->payload_bytes;
    if (report.entries.size() < req.max_listed) {
      report.entries.push_back(DescribeLocked(*e, caller.ns));
    }
    if (s.ssd != nullptr) ssd_copies.push_back(DescribeLocked(*e, caller.ns));
  }
  if (req.dry_run) {
    lock.unlock();
    return finish_ssd();
  }

  // 3. Delete. A root already taken by an earlier root's subtree is skipped:
  // its slot went back to the pool (state no longer committed).
  std::vector<EntryRef> refs;
  refs.reserve(roots.size());
  for (Entry* e : roots) refs.push_back({e, e->generation});
  for (const EntryRef& ref : refs) {
    if (ref.entry->generation == ref.generation &&
        ref.entry->state.load() == EntryState::kCommitted) {
      s.DeleteSubtreeLocked(ref.entry, EvictReason::kExplicit);
    }
  }
  lock.unlock();
  // The SSD copies too, or the next match would find them there.
  if (s.ssd == nullptr) return finish_ssd();
  (void)EraseSsdCopies(s.ssd.get(), ssd_copies);
  // A promotion that published from an SSD copy between the DRAM delete and
  // the erase put the entry back: delete those again (later ones find the
  // copy gone and give up, Impl::Publish).
  {
    std::lock_guard again(s.structure_mu);
    for (const EntryInfo& c : ssd_copies) {
      const EntryKey k{*ns, c.kind, c.key};
      Impl::Shard& shard = s.ShardFor(k);
      Entry* e = nullptr;
      {
        std::shared_lock slock(shard.mu);
        e = s.FindVisibleLocked(shard, k, now);
      }
      if (e != nullptr) s.DeleteSubtreeLocked(e, EvictReason::kExplicit);
    }
  }
  return finish_ssd();
}

std::vector<std::string> CacheStore::Namespaces() const {
  std::shared_lock lock(impl_->ns_mu);
  return impl_->ns_names;
}

std::span<std::byte> CacheStore::ArenaRegion() const {
  return {impl_->arena->base(), impl_->arena->capacity_bytes()};
}

Result<RangePin> CacheStore::PinLeasedRange(const Principal& caller, LeaseId lease, uint64_t offset,
                                            uint64_t length, bool write) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, write ? Role::kWrite : Role::kRead));
  Impl& s = *impl_;
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value() || lease == 0) return NotFound("no lease " + std::to_string(lease));
  RangePin pin;
  bool kind_ok = true;
  STRATA_RETURN_IF_ERROR(s.leases.WithLive(*ns, lease, s.clock->Now(), [&](const LeaseRecord& rec) {
    kind_ok = rec.write == write;
    if (!kind_ok) return;
    for (const EntryRef& ref : rec.entries) {
      Entry* e = ref.entry;
      if (e->generation != ref.generation) continue;
      const uint64_t start = e->extent.offset;
      if (offset >= start && length <= e->payload_bytes &&
          offset - start <= e->payload_bytes - length) {
        // The live lease holds the entry (the table's lock keeps it live),
        // so a reader pin may be added without the shard lock.
        e->readers.fetch_add(1);
        pin = {e, ref.generation};
        return;
      }
    }
  }));
  if (!kind_ok) {
    return PermissionDenied("lease " + std::to_string(lease) + " is a " +
                            (write ? "read" : "write") + " lease");
  }
  if (pin.entry == nullptr) {
    return PermissionDenied("lease " + std::to_string(lease) + " holds no entry covering bytes [" +
                            std::to_string(offset) + ", " + std::to_string(offset + length) + ")");
  }
  return pin;
}

void CacheStore::ReleaseRangePin(const RangePin& pin) {
  if (pin.entry == nullptr) return;
  impl_->Unpin({static_cast<Entry*>(pin.entry), pin.generation}, /*lease=*/false);
}

}  // namespace strata

// Admin calls: delete, pin, inspect, list and evict by filter, over DRAM and
// the SSD tier.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

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

// Returns with `lock` (over s.structure_mu) held. It lets go and takes the
// lock again as it reads: more than the thread-safety analysis follows, so
// it is left out, and callers assert the lock once it returns.
template <typename ImplT, typename Pred>
std::vector<EntryInfo> ScanSsdThenLock(ImplT& s, const std::string& ns, uint32_t* ns_id,
                                       bool read_ssd, Nanos now,
                                       const std::optional<EntryCursor>& after, size_t limit,
                                       std::optional<EntryCursor>* bound, ExpiredDram expired_dram,
                                       Pred wanted,
                                       MutexLock& lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bound->reset();
  if (s.ssd == nullptr || !read_ssd) {
    lock.Lock();
    s.ResolveUnseen(ns, ns_id);
    return {};
  }
  constexpr int kUnlockedRounds = 4;
  uint64_t from = 0;
  {
    MutexLock start_lock(s.structure_mu);
    from = s.DemotedEnd();
    s.MoveSsdScan(ImplT::kNoScan, from);
  }
  // Ends the scan on every way out, with `lock` held or not.
  struct ScanEnd {
    ImplT& s;
    const uint64_t& from;
    MutexLock& lock;
    ~ScanEnd() {
      const bool held = lock.owns_lock();
      if (!held) lock.Lock();
      s.MoveSsdScan(from, ImplT::kNoScan);
      if (!held) lock.Unlock();
    }
  } end{s, from, lock};

  std::vector<EntryInfo> copies = SsdCopiesPast(s.ssd.get(), *s.clock, ns, after, limit, bound);
  if (s.after_ssd_scan) s.after_ssd_scan();
  std::unordered_set<EntryKey, EntryKeyHash> looked_up;
  lock.Lock();
  for (int round = 0;; ++round) {
    // A namespace unseen at the start may have been interned since (and
    // DRAM entries made in it); none can be while the lock is held.
    s.ResolveUnseen(ns, ns_id);
    std::vector<EntryKey> fresh;
    const uint64_t to = s.DemotedEnd();
    for (uint64_t i = from; i < to; ++i) {
      const EntryKey& k = s.demoted[i - s.demoted_base];
      if (k.ns == *ns_id && looked_up.insert(k).second) fresh.push_back(k);
    }
    s.MoveSsdScan(from, to);
    from = to;
    if (fresh.empty()) break;
    const bool unlocked = round < kUnlockedRounds;
    if (unlocked) lock.Unlock();
    for (const EntryKey& k : fresh) {
      if (bound->has_value() && CursorLess((*bound)->key, (*bound)->kind, k.chain, k.kind)) {
        continue;  // past the page read
      }
      for (EntryInfo& c : SsdCopies(s.ssd.get(), *s.clock, ns, EntryCursor{k.chain, k.kind})) {
        copies.push_back(std::move(c));
      }
    }
    if (!unlocked) break;  // nothing left DRAM meanwhile: the lock was held
    lock.Lock();
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
    ReaderLock slock(shard.mu);
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
    return WithEntry(*impl_, caller, key, kind, [&](Entry* e) {
      impl_->structure_mu.AssertHeld();  // WithEntry holds it
      impl_->DeleteSubtree(e, EvictReason::kExplicit);
    });
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
  MutexLock lock(s.structure_mu, std::defer_lock);
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
  s.structure_mu.AssertHeld();
  // The index is hashed, so a page is the `limit` smallest keys past the
  // cursor: a bounded heap over one pass, O(entries x log limit).
  auto less = [](const Entry* a, const Entry* b) {
    return CursorLess(a->key.chain, a->key.kind, b->key.chain, b->key.kind);
  };
  std::vector<Entry*> heap;  // max-heap of the smallest limit + 1 seen
  for (uint32_t i = 0; i <= s.shard_mask; ++i) {
    ReaderLock slock(s.shards[i].mu);
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

namespace {
// Adds the SSD-only entries an eviction covers to its report, and erases
// them unless it is a dry run (no descendants: the SSD tier keeps no tree;
// unreachable ones age out).
Result<EvictReport> FinishSsdOnly(SsdTier* ssd, const EvictRequest& req,
                                  const std::vector<EntryInfo>& ssd_only, EvictReport& report) {
  for (const EntryInfo& c : ssd_only) {
    ++report.evicted;
    report.bytes += c.payload_bytes;
    if (report.entries.size() < req.max_listed) report.entries.push_back(c);
  }
  if (!req.dry_run) STRATA_RETURN_IF_ERROR(EraseSsdCopies(ssd, ssd_only));
  return report;
}
}  // namespace

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
  // (FinishSsdOnly).
  std::vector<EntryInfo> ssd_only;
  MutexLock lock(s.structure_mu, std::defer_lock);
  if (req.root.has_value()) {
    lock.Lock();
    s.ResolveUnseen(caller.ns, &*ns);
  } else {
    std::optional<EntryCursor> bound;  // stays empty: every copy is read
    ssd_only = ScanSsdThenLock(
        s, caller.ns, &*ns, SsdCopiesCanMatch(req.filter), now, std::nullopt, 0, &bound,
        ExpiredDram::kThere, [&](const EntryInfo& c) { return MatchesSsdCopy(req.filter, c, now); },
        lock);
  }
  s.structure_mu.AssertHeld();

  // 1. The roots: one named entry, or every unpinned entry the filter picks.
  std::vector<Entry*> roots;
  if (req.root.has_value()) {
    const EntryKey k{*ns, req.root->kind, req.root->key};
    if (!s.FindEvictRoot(k, now, roots)) {
      lock.Unlock();
      ssd_only = SsdCopies(s.ssd.get(), *s.clock, caller.ns, *req.root);
      if (ssd_only.empty()) {
        return NotFound("no " + std::string(StateKindName(k.kind)) + " entry " + k.chain.ToHex());
      }
      return FinishSsdOnly(s.ssd.get(), req, ssd_only, report);
    }
  } else {
    roots = s.EvictRootsByFilter(*ns, req.filter, now, report);
  }
  // 2. Close over descendants (they could never be matched again), each
  // entry once, in an order where a root precedes its subtree.
  const std::vector<Entry*> affected = s.CloseOverDescendants(roots);
  const std::vector<EntryInfo> ssd_copies = s.ReportEvicted(affected, caller.ns, req, report);
  if (req.dry_run) {
    lock.Unlock();
    return FinishSsdOnly(s.ssd.get(), req, ssd_only, report);
  }
  // 3. Delete. A root already taken by an earlier root's subtree is skipped:
  // its slot went back to the pool (state no longer committed).
  s.DeleteRoots(roots);
  lock.Unlock();
  // The SSD copies too, or the next match would find them there.
  if (s.ssd == nullptr) return FinishSsdOnly(s.ssd.get(), req, ssd_only, report);
  (void)EraseSsdCopies(s.ssd.get(), ssd_copies);
  s.DeleteRepublished(*ns, ssd_copies, now);
  return FinishSsdOnly(s.ssd.get(), req, ssd_only, report);
}

bool CacheStore::Impl::FindEvictRoot(const EntryKey& k, Nanos now, std::vector<Entry*>& roots) {
  Shard& shard = ShardFor(k);
  ReaderLock slock(shard.mu);
  Entry* e = FindVisible(shard, k, now);
  if (e == nullptr) return false;
  roots.push_back(e);
  return true;
}

std::vector<Entry*> CacheStore::Impl::EvictRootsByFilter(uint32_t ns, const EntryFilter& filter,
                                                         Nanos now, EvictReport& report) {
  std::vector<Entry*> roots;
  // A pinned entry keeps its ancestors too: without them it could never
  // be matched again.
  std::unordered_set<const Entry*> keep;
  for (uint32_t i = 0; i <= shard_mask; ++i) {
    ReaderLock slock(shards[i].mu);
    for (const auto& [k, e] : shards[i].map) {
      if (k.ns != ns || e->pinned_until.load() <= now) continue;
      for (const Entry* a = e; a != nullptr && keep.insert(a).second;) a = a->parent;
    }
  }
  for (uint32_t i = 0; i <= shard_mask; ++i) {
    ReaderLock slock(shards[i].mu);
    for (const auto& [k, e] : shards[i].map) {
      if (k.ns != ns || e->state.load() != EntryState::kCommitted) continue;
      if (!Matches(filter, *e, now)) continue;
      if (keep.contains(e)) {
        ++report.skipped_pinned;
        continue;
      }
      roots.push_back(e);
    }
  }
  return roots;
}

std::vector<Entry*> CacheStore::Impl::CloseOverDescendants(const std::vector<Entry*>& roots) const {
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
  return affected;
}

std::vector<EntryInfo> CacheStore::Impl::ReportEvicted(const std::vector<Entry*>& affected,
                                                       const std::string& ns,
                                                       const EvictRequest& req,
                                                       EvictReport& report) const {
  std::vector<EntryInfo> ssd_copies;  // of the DRAM entries that go
  for (const Entry* e : affected) {
    const bool held = e->leases.load() != 0 || e->readers.load() != 0;
    ++(held ? report.deferred : report.evicted);
    report.bytes += e->payload_bytes;
    if (report.entries.size() < req.max_listed) {
      report.entries.push_back(DescribeLocked(*e, ns));
    }
    if (ssd != nullptr) ssd_copies.push_back(DescribeLocked(*e, ns));
  }
  return ssd_copies;
}

void CacheStore::Impl::DeleteRoots(const std::vector<Entry*>& roots) {
  std::vector<EntryRef> refs;
  refs.reserve(roots.size());
  for (Entry* e : roots) refs.push_back({e, e->generation});
  for (const EntryRef& ref : refs) {
    if (ref.entry->generation == ref.generation &&
        ref.entry->state.load() == EntryState::kCommitted) {
      DeleteSubtree(ref.entry, EvictReason::kExplicit);
    }
  }
}

// A promotion that published from an SSD copy between the DRAM delete and
// the erase put the entry back: delete those again (later ones find the
// copy gone and give up, Impl::Publish).
void CacheStore::Impl::DeleteRepublished(uint32_t ns, const std::vector<EntryInfo>& ssd_copies,
                                         Nanos now) {
  MutexLock again(structure_mu);
  for (const EntryInfo& c : ssd_copies) {
    const EntryKey k{ns, c.kind, c.key};
    Shard& shard = ShardFor(k);
    Entry* e = nullptr;
    {
      ReaderLock slock(shard.mu);
      e = FindVisible(shard, k, now);
    }
    if (e != nullptr) DeleteSubtree(e, EvictReason::kExplicit);
  }
}

}  // namespace strata

// Promotion: reading SSD-only entries back into DRAM, once per entry however
// many callers want it.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

bool CacheStore::Impl::InDram(const EntryKey& k, Nanos now) const {
  const Shard& shard = ShardFor(k);
  ReaderLock lock(shard.mu);
  return FindVisible(shard, k, now) != nullptr;
}

EntryRef CacheStore::Impl::PinReader(const EntryKey& k, Nanos now) {
  Shard& shard = ShardFor(k);
  ReaderLock lock(shard.mu);
  Entry* e = FindVisible(shard, k, now);
  if (e == nullptr) return {};
  e->readers.fetch_add(1);
  return {e, e->generation};
}

Result<EntryRef> CacheStore::Impl::PinOrPromote(const EntryKey& k, const ModelId& model,
                                                const std::optional<ChainKey>& parent, Nanos now) {
  return std::move(PinOrPromoteMany({&k, 1}, {&parent, 1}, model, now).front());
}

std::vector<Result<EntryRef>> CacheStore::Impl::PinOrPromoteMany(
    std::span<const EntryKey> keys, std::span<const std::optional<ChainKey>> parents,
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
    MutexLock lock(promo_mu);
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
      PromoteBatch(keys, parents, model, now, std::span(run).subspan(first, last - first), results);
    }
    for (size_t i : run) {
      Promotion& p = *promos[i];
      {
        MutexLock lock(p.mu);
        p.done = true;
        p.status = results[i].ok() ? Status::Ok() : results[i].status();
      }
      p.cv.notify_all();
      MutexLock lock(promo_mu);
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
      MutexLock lock(p.mu);
      p.cv.wait_for(lock.native(), kParentPromotionWait,
                    [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) { return p.done; });
    }
  }
  promote_run();
  // Entries another caller was promoting: wait for that read.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (promos[i] == nullptr) continue;
    Promotion& p = *promos[i];
    MutexLock lock(p.mu);
    p.cv.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) { return p.done; });
    if (!p.status.ok()) {
      results[i] = p.status;
      continue;
    }
    lock.Unlock();
    EntryRef ref = PinReader(keys[i], now);
    results[i] = ref.entry != nullptr
                     ? Result<EntryRef>(ref)
                     : NotFound("promoted entry was evicted before it could be read");
  }
  return results;
}

std::vector<Result<EntryRef>> CacheStore::Impl::PromoteBlocks(uint32_t ns, const MatchResult& match,
                                                              std::span<const size_t> which,
                                                              Nanos now) {
  std::vector<EntryKey> keys;
  std::vector<std::optional<ChainKey>> parents;
  for (size_t b : which) {
    keys.push_back({ns, StateKind::kGlobalKv, match.blocks[b].key});
    parents.push_back(b > 0 ? std::optional<ChainKey>(match.blocks[b - 1].key) : std::nullopt);
  }
  return PinOrPromoteMany(keys, parents, match.model_id, now);
}

void CacheStore::Impl::PromoteBatch(std::span<const EntryKey> keys,
                                    std::span<const std::optional<ChainKey>> parents,
                                    const ModelId& model, Nanos now, std::span<const size_t> which,
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

Result<Entry*> CacheStore::Impl::Stage(const EntryKey& k, const ModelId& model, Nanos now) {
  const std::optional<SsdEntryMeta> meta = ssd->Lookup(SsdKeyOf(k, model));
  if (!meta.has_value()) return NotFound("not stored");
  const Layout* layout = FindLayout(meta->layout_id);
  if (layout == nullptr || layout->kind != k.kind ||
      layout->PayloadBytes() != meta->payload_bytes) {
    return NotFound("SSD entry has an unknown layout " + std::to_string(meta->layout_id));
  }
  MutexLock lock(structure_mu);
  if (deleting_keys.contains(k)) {
    return Unavailable("an entry under this key is being deleted");
  }
  Shard& shard = ShardFor(k);
  {
    ReaderLock slock(shard.mu);
    if (shard.map.count(k) != 0) return nullptr;
  }
  std::optional<Extent> extent = AllocateExtent(meta->payload_bytes, now, {k.ns, 0});
  if (!extent.has_value()) {
    return ResourceExhausted("cannot promote an SSD entry: " +
                             NoRoom(meta->payload_bytes, {k.ns, 0}));
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
    WriterLock slock(shard.mu);
    shard.map.emplace(k, e);
  }
  ++reserved_entries;
  reserved_bytes += e->extent.length;
  payload_bytes.fetch_add(e->payload_bytes);
  m.used_bytes->Set(static_cast<int64_t>(arena->used_bytes()));
  return e;
}

Result<EntryRef> CacheStore::Impl::Publish(Entry* e, const Status& read,
                                           const std::optional<ChainKey>& parent, Nanos now) {
  const EntryKey& k = e->key;
  MutexLock lock(structure_mu);
  if (!read.ok()) {
    EraseEntry(e);
    return read;
  }
  // An admin delete or evict erases the SSD copy and then the DRAM entry:
  // a promotion that read the copy before must not bring it back.
  if (!ssd->Contains(SsdKeyOf(k, e->model_id))) {
    EraseEntry(e);
    return NotFound("entry was deleted while being promoted");
  }
  Entry* parent_entry = nullptr;
  if (parent.has_value() && k.kind == StateKind::kGlobalKv) {
    const EntryKey pk{k.ns, StateKind::kGlobalKv, *parent};
    Shard& pshard = ShardFor(pk);
    ReaderLock slock(pshard.mu);
    parent_entry = FindVisible(pshard, pk, now);
  }
  // A block whose parent did not make it into DRAM (its read failed, or
  // another caller's promotion of it is late) would be published unlinked,
  // outside the prefix tree: evictable before its parent and missed by a
  // delete of it. The prefix is cut here instead.
  if (parent.has_value() && k.kind == StateKind::kGlobalKv && parent_entry == nullptr) {
    EraseEntry(e);
    return NotFound("its parent block is not in DRAM");
  }
  {
    Shard& shard = ShardFor(k);
    WriterLock slock(shard.mu);
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

}  // namespace strata

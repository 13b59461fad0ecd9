// The eviction order: queued touches, the LRU or deadline queues, the
// ghost of evicted entries, the in-memory index and retiring records.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

void SsdTier::Impl::QueueTouch(QueuedTouch t) {
  {
    MutexLock lock(touch_mu);
    if (touches.size() < kMaxQueuedTouches) {
      touches.push_back(std::move(t));
      return;
    }
  }
  // Full: apply the queue and this touch if `mu` is free now; if not, this
  // touch is lost (order is a hint; eviction stays correct either way).
  if (!mu.try_lock()) return;
  MutexLock lock(mu, std::adopt_lock);
  ApplyTouches();
  ApplyTouch(t);
}

void SsdTier::Impl::ApplyTouches() {
  std::vector<QueuedTouch> batch;
  {
    MutexLock lock(touch_mu);
    batch.swap(touches);
  }
  for (const QueuedTouch& t : batch) ApplyTouch(t);
}

void SsdTier::Impl::ApplyTouch(const QueuedTouch& t) {
  auto it = records.find(t.key);
  if (it == records.end()) return;
  Record& r = *it->second;
  Reorder(r, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { ChangeForTouch(r, t); });
}

void SsdTier::Impl::ChangeForTouch(Record& r, const QueuedTouch& t) {
  r.meta.last_access = std::max(r.meta.last_access, t.at);
  r.order = std::max(r.order, t.order);
  if (!model.has_value()) return;
  if (t.what == SsdTouch::kUse) {
    // A use while already a shadow is the same use seen twice (a match,
    // then the fetch that promotes).
    if (r.above) {
      r.tick = model->now();
      return;
    }
    // Served from here: the interval that started when the block last
    // left DRAM paid off. The block goes to DRAM, so this copy is a
    // shadow again.
    const uint64_t now = model->Advance();
    if (r.open) model->Reused(HoldTimeModel::ClassOf(r.uses), now - r.tick, r.meta.extent_bytes);
    r.uses = static_cast<uint8_t>(std::min<uint32_t>(r.uses + 1u, 255));
    r.tick = now;
    r.above = true;
    r.open = false;
    return;
  }
  // Left DRAM: from now on only this copy can serve the block.
  if (r.open)
    model->Ended(HoldTimeModel::ClassOf(r.uses), model->now() - r.tick, r.meta.extent_bytes);
  r.uses =
      static_cast<uint8_t>(std::min<uint32_t>(std::max<uint32_t>(r.uses, t.earlier_uses), 255));
  r.tick = model->now();
  r.above = false;
  r.open = true;
  model->Start(HoldTimeModel::ClassOf(r.uses), r.meta.extent_bytes);
}

void SsdTier::Impl::PlaceNew(const std::string& key, Record& r) {
  if (!model.has_value()) return;
  r.tick = model->Advance();
  r.above = true;
  if (const std::optional<GhostTable::Remembered> g = ghosts.Take(std::hash<std::string>{}(key))) {
    const GhostState old = Unpack(g->value);
    if (old.open)
      model->Reused(HoldTimeModel::ClassOf(old.uses), r.tick - old.tick, r.meta.extent_bytes);
    r.uses = static_cast<uint8_t>(std::min<uint32_t>(old.uses + 1u, 255));
  }
}

std::pair<size_t, uint64_t> SsdTier::Impl::QueueOf(const Record& r) const {
  if (!model.has_value()) return {0, static_cast<uint64_t>(r.meta.last_access)};
  if (r.above) return {kShadowQueue, r.tick};
  return {static_cast<size_t>(HoldTimeModel::ClassOf(r.uses)), r.tick};
}

std::vector<uint64_t> SsdTier::Impl::RankOffsets() const {
  std::vector<uint64_t> offsets(kShadowQueue + 1, 0);
  if (!model.has_value()) return offsets;
  for (int c = 0; c < HoldTimeModel::kClasses; ++c) offsets[c] = model->hold(c);
  // Holding times never fall as the class rises: the top one is longest.
  offsets[kShadowQueue] = 2 * model->hold(HoldTimeModel::kClasses - 1);
  return offsets;
}

void SsdTier::Impl::Enqueue(Record& r) {
  const auto [queue, time] = QueueOf(r);
  r.queue = static_cast<uint8_t>(queue);
  r.queued = {time, r.order, r.queued.key, &r};
  queues.Insert(queue, r.queued);
  if (queue == kShadowQueue) shadow_bytes += r.meta.extent_bytes;
}

void SsdTier::Impl::Dequeue(Record& r) {
  queues.Erase(r.queue, r.queued);
  if (r.queue == kShadowQueue) shadow_bytes -= r.meta.extent_bytes;
}

void SsdTier::Impl::IndexRecord(const std::string& key, Record& r) {
  r.queued.key = &key;
  by_expiry.insert(&r);
  Enqueue(r);
}

void SsdTier::Impl::UnindexRecord(Record& r) {
  if (r.queued.key == nullptr) return;
  Dequeue(r);
  by_expiry.erase(&r);
  r.queued.key = nullptr;
}

double SsdTier::Impl::ModelCapacity(uint64_t shadow_bytes) const {
  const double average =
      static_cast<double>(Capacity()) * (opts.low_watermark + opts.high_watermark) / 2;
  return std::max(average - static_cast<double>(shadow_bytes), average / 8);
}

void SsdTier::Impl::RememberEvicted(const std::string& key, const Record& r) {
  if (!model.has_value()) return;
  ghosts.Add(std::hash<std::string>{}(key), 0, Pack({r.tick, r.uses, r.open}),
             std::max(kGhostFactor * records.size(), kMinGhosts));
}

uint64_t SsdTier::Impl::Pack(const GhostState& g) {
  return (uint64_t{g.open} << 63) | (uint64_t{g.uses} << kTickBits) |
         (g.tick & ((uint64_t{1} << kTickBits) - 1));
}

SsdTier::Impl::GhostState SsdTier::Impl::Unpack(uint64_t v) {
  return {v & ((uint64_t{1} << kTickBits) - 1), static_cast<uint8_t>(v >> kTickBits),
          (v >> 63) != 0};
}

uint64_t SsdTier::Impl::Used() const {
  uint64_t used = 0;
  for (const SsdSpace& s : space) used += s.used_bytes();
  return used;
}

void SsdTier::Impl::PublishGauges() {
  m.used_bytes->Set(static_cast<int64_t>(Used()));
  m.entries->Set(static_cast<int64_t>(records.size()));
}

std::optional<std::pair<uint32_t, uint64_t>> SsdTier::Impl::AllocateRun(uint64_t bytes) {
  for (uint32_t i = 0; i < space.size(); ++i) {
    const uint32_t f = (next_file + i) % static_cast<uint32_t>(space.size());
    if (auto off = space[f].Allocate(bytes)) {
      next_file = f + 1;
      return std::make_pair(f, *off);
    }
  }
  return std::nullopt;
}

void SsdTier::Impl::MaybeFree(Record& r) {
  if (r.retired && r.index_gone && r.readers == 0 && !r.freed) {
    space[r.meta.file].Free(r.meta.offset, r.meta.extent_bytes);
    r.freed = true;
  }
}

bool SsdTier::Impl::Undeleted(const std::string& key) const {
  return std::any_of(undeleted.begin(), undeleted.end(),
                     [&](const auto& u) { return u.first == key; });
}

RecordPtr SsdTier::Impl::Retire(const std::string& key) {
  auto it = records.find(key);
  if (it == records.end()) return nullptr;
  RecordPtr r = it->second;
  UnindexRecord(*r);
  records.erase(it);
  r->retired = true;
  return r;
}

void SsdTier::Impl::MarkIndexFailed() {
  index_failed.store(true);
  index_retry_at = clock->Now() + opts.write_retry_interval;
}

Status SsdTier::Impl::FinishRetire(const std::vector<std::string>& keys,
                                   const std::vector<RecordPtr>& recs, bool restore_on_failure) {
  if (recs.empty()) return Status::Ok();
  const Status injected =
      opts.before_index_delete_hook ? opts.before_index_delete_hook() : Status::Ok();
  MutexLock index_lock(index_mu);
  // A key written again since its retire has its own index entry now,
  // which already replaced this one's: it must not be deleted.
  // (No key can be rewritten while index_mu is held.)
  std::vector<std::string> deletes;
  std::vector<bool> rewritten(keys.size(), false);
  {
    MutexLock lock(mu);
    for (size_t i = 0; i < keys.size(); ++i) {
      rewritten[i] = records.contains(keys[i]);
      if (!rewritten[i]) deletes.push_back(keys[i]);
    }
  }
  const bool failed_before = index_failed.load();
  Status st = !injected.ok()    ? injected
              : failed_before   ? Unavailable("the SSD index failed earlier")
              : deletes.empty() ? Status::Ok()
                                : index->Apply({}, deletes, /*sync=*/true);
  if (!st.ok() && !failed_before) MarkIndexFailed();  // RocksDB errors are sticky
  MutexLock lock(mu);
  if (!st.ok()) {
    spdlog::error("ssd: deleting {} index entries failed: {}", keys.size(), st.ToString());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st.ok() || rewritten[i]) {
      // Deleted, or its index entry overwritten by the rewrite's.
      recs[i]->index_gone = true;
      MaybeFree(*recs[i]);
    } else if (restore_on_failure && !Undeleted(keys[i]) &&
               !erased_while_evicting.contains(keys[i])) {
      // Still indexed: serve them rather than leak their space (and
      // evict nothing more: MakeRoom stops once the index failed). Not
      // when a failed put of the key waits to be deleted: back in memory
      // the record would pass for a rewrite and spare the key that delete.
      recs[i]->retired = false;
      auto [it, added] = records.emplace(keys[i], recs[i]);
      if (added) IndexRecord(it->first, *it->second);
    } else {
      undeleted.emplace_back(keys[i], recs[i]);
    }
  }
  if (restore_on_failure) {
    for (const std::string& k : keys) {
      auto it = evicting.find(k);
      if (it != evicting.end() && --it->second == 0) {
        evicting.erase(it);
        erased_while_evicting.erase(k);
      }
    }
  }
  PublishGauges();
  return st;
}

}  // namespace strata

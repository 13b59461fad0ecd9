// Space: choosing victims, making room under the watermarks, TTLs, stopping
// writes after a disk-full or I/O error.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

void SsdTier::Impl::CollectVictims(Nanos now, uint64_t incoming, bool ttl,
                                   std::vector<std::string>* keys, std::vector<RecordPtr>* recs) {
  const uint64_t cap = Capacity();
  const uint64_t high = static_cast<uint64_t>(opts.high_watermark * static_cast<double>(cap));
  const uint64_t low = static_cast<uint64_t>(opts.low_watermark * static_cast<double>(cap));
  if (!ttl && Used() + incoming <= high) return;
  ApplyTouches();
  if (model.has_value()) model->set_capacity(ModelCapacity(shadow_bytes));
  if (ttl) {
    for (const Record* r : by_expiry) {
      if (r->meta.expiry > now) break;
      if (r->readers == 0) keys->push_back(*r->queued.key);
    }
  }
  for (const std::string& k : *keys) recs->push_back(Retire(k));
  ttl_expired += keys->size();
  m.evict_ttl->Increment(keys->size());
  uint64_t used = Used();
  for (const RecordPtr& r : *recs) used -= r->meta.extent_bytes;
  if (used + incoming <= high) return;
  // Ties (a batch written at once) go in the order they were last
  // touched (ancestors last), then in key order, so a replay evicts the
  // same entries every time.
  const size_t expired = keys->size();
  queues.ForEachInRankOrder(RankOffsets(), [&](size_t, const EvictionQueues<Record>::Position& p) {
    if (used + incoming <= low) return false;
    if (p.item->readers == 0) {
      keys->push_back(*p.key);
      used -= p.item->meta.extent_bytes;
    }
    return true;
  });
  EvictKeys(std::span(*keys).subspan(expired), recs);
}

void SsdTier::Impl::EvictKeys(std::span<const std::string> keys, std::vector<RecordPtr>* recs) {
  for (const std::string& k : keys) {
    RecordPtr r = Retire(k);
    RememberEvicted(k, *r);
    recs->push_back(std::move(r));
  }
  evictions += keys.size();
  m.evict_watermark->Increment(keys.size());
}

uint64_t SsdTier::Impl::Capacity() const {
  uint64_t cap = 0;
  for (const SsdSpace& s : space) cap += s.capacity_bytes();
  return cap;
}

bool SsdTier::Impl::MakeRun(uint64_t bytes) {
  if (!RecoverIndex()) return false;
  std::vector<std::string> keys;
  std::vector<RecordPtr> recs;
  {
    MutexLock lock(mu);
    if (std::any_of(space.begin(), space.end(),
                    [&](const SsdSpace& f) { return f.largest_free_bytes() >= bytes; })) {
      return true;  // another batch made one meanwhile
    }
    ApplyTouches();
    std::vector<SsdSpace> after = space;
    bool formed = false;
    queues.ForEachInRankOrder(RankOffsets(),
                              [&](size_t, const EvictionQueues<Record>::Position& p) {
                                if (p.item->readers != 0) return true;
                                const SsdEntryMeta& m = p.item->meta;
                                after[m.file].Free(m.offset, m.extent_bytes);
                                keys.push_back(*p.key);
                                formed = after[m.file].largest_free_bytes() >= bytes;
                                return !formed;
                              });
    if (!formed) return false;
    EvictKeys(keys, &recs);
    MarkEvicting(keys);
  }
  // Freed once the index forgets them (and no reader came meanwhile).
  return FinishRetire(keys, recs, /*restore_on_failure=*/true).ok();
}

uint64_t SsdTier::Impl::MakeRoom(uint64_t incoming, bool ttl) {
  if (!RecoverIndex()) return 0;  // no delete could be made durable
  std::vector<std::string> keys;
  std::vector<RecordPtr> recs;
  {
    MutexLock lock(mu);
    CollectVictims(clock->Now(), incoming, ttl, &keys, &recs);
    MarkEvicting(keys);
  }
  return FinishRetire(keys, recs, /*restore_on_failure=*/true).ok() ? recs.size() : 0;
}

void SsdTier::Impl::DisableWrites(const std::string& why) {
  MutexLock lock(mu);
  ++write_failures;
  m.write_failures->Increment();
  if (writes_enabled) {
    spdlog::error("ssd: writes stopped for {} ms: {}", opts.write_retry_interval / kNanosPerMilli,
                  why);
  }
  writes_enabled = false;
  writes_retry_at = clock->Now() + opts.write_retry_interval;
  m.writes_enabled->Set(0);
}

bool SsdTier::Impl::WritesAllowed(Nanos now) {
  if (!writes_enabled && now >= writes_retry_at && !index_failed.load()) {
    writes_enabled = true;
    m.writes_enabled->Set(1);
    spdlog::info("ssd: retrying writes");
  }
  return writes_enabled;
}

void SsdTier::Impl::Drop(const std::string& key, const RecordPtr& expected, Counter* reason) {
  std::vector<std::string> keys;
  std::vector<RecordPtr> recs;
  {
    MutexLock lock(mu);
    auto it = records.find(key);
    if (it == records.end() || it->second != expected) return;
    recs.push_back(Retire(key));
    keys.push_back(key);
    reason->Increment();
  }
  (void)FinishRetire(keys, recs);  // out of memory, whatever the index says
}

}  // namespace strata

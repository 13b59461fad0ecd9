// SsdTier (see ssd_tier.h for the durability order): lookups, touches,
// erase, listing, statistics, test hooks.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

std::optional<SsdEntryMeta> SsdTier::Lookup(const SsdKey& key) const {
  const std::string k = EncodeSsdKey(key);
  MutexLock lock(impl_->mu);
  auto it = impl_->records.find(k);
  if (it == impl_->records.end() || it->second->meta.expiry <= impl_->clock->Now()) {
    return std::nullopt;
  }
  return it->second->meta;
}

void SsdTier::Touch(const SsdKey& key, SsdTouch what, uint32_t earlier_uses) {
  impl_->QueueTouch(
      {EncodeSsdKey(key), impl_->clock->Now(), what, earlier_uses, impl_->NextOrder()});
}

Status SsdTier::Erase(const SsdKey& key) {
  Impl& s = *impl_;
  const std::string k = EncodeSsdKey(key);
  RecordPtr r;
  {
    MutexLock lock(s.mu);
    // An eviction of the key may be deleting it from the index now: if that
    // delete fails, its victim must stay out of memory.
    if (s.evicting.contains(k)) s.erased_while_evicting.insert(k);
    r = s.Retire(k);
    if (r == nullptr && !s.Undeleted(k)) return NotFound("not on the SSD tier");
    if (r != nullptr) s.m.evict_explicit->Increment();
  }
  if (r != nullptr) return s.FinishRetire({k}, {r});
  // Erased already, but the index has not recorded it: not done until it
  // has (a restart would bring the entry back).
  (void)s.RecoverIndex();
  MutexLock lock(s.mu);
  return s.Undeleted(k) ? Unavailable("the SSD index has not recorded an earlier erase yet")
                        : Status::Ok();
}

SsdListPage SsdTier::List(std::string_view ns, const std::optional<SsdListCursor>& after,
                          size_t limit) const {
  SsdListPage page;
  if (limit == 0) return page;
  Impl& s = *impl_;
  const Nanos now = s.clock->Now();
  using Iter = decltype(s.records)::const_iterator;
  // A cursor into each model's range of the namespace (its keys share the
  // prefix ns | model and run in (chain key, kind) order), merged.
  struct Range {
    Iter it;
    std::string prefix;
  };
  MutexLock lock(s.mu);
  s.ApplyTouches();  // so last_access is current
  auto models = s.models.find(ns);
  if (models == s.models.end()) return page;
  std::vector<Range> ranges;
  for (const ModelId& model : models->second) {
    SsdKey from{std::string(ns), model, after.has_value() ? after->chain : ChainKey{},
                after.has_value() ? after->kind : StateKind{}};
    std::string start = EncodeSsdKey(from);
    Range r{after.has_value() ? s.records.upper_bound(start) : s.records.lower_bound(start),
            start.substr(0, start.size() - ChainKey{}.bytes.size() - 1)};
    ranges.push_back(std::move(r));
  }
  // The next unexpired entry of a range, or its end.
  auto settle = [&](Range& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    while (r.it != s.records.end() && r.it->first.starts_with(r.prefix) &&
           r.it->second->meta.expiry <= now) {
      ++r.it;
    }
    if (r.it != s.records.end() && !r.it->first.starts_with(r.prefix)) r.it = s.records.end();
  };
  // (chain key, kind) and then model: the bytes after the shared ns prefix,
  // reordered.
  const size_t ns_bytes = EncodeSsdKeyPrefix(ns).size();
  constexpr size_t kModelBytes = sizeof(ModelId::bytes);
  auto order = [&](const std::string& k) {
    const std::string_view v(k);
    return std::make_pair(v.substr(ns_bytes + kModelBytes), v.substr(ns_bytes, kModelBytes));
  };
  for (Range& r : ranges) settle(r);
  std::optional<std::string> last_group;  // chain key | kind of the last entry taken
  for (;;) {
    Range* best = nullptr;
    for (Range& r : ranges) {
      if (r.it == s.records.end()) continue;
      if (best == nullptr || order(r.it->first) < order(best->it->first)) best = &r;
    }
    if (best == nullptr) return page;
    const std::string_view group = std::string_view(best->it->first).substr(ns_bytes + kModelBytes);
    // Past `limit`, only the rest of the last (chain key, kind): a cursor
    // names no model, so one key's models are never split.
    if (page.entries.size() >= limit && (!last_group.has_value() || group != *last_group)) {
      page.more = true;
      return page;
    }
    std::optional<SsdKey> key = DecodeSsdKey(best->it->first);
    if (key.has_value()) {
      page.entries.emplace_back(std::move(*key), best->it->second->meta);
      last_group = std::string(group);
    }
    ++best->it;
    settle(*best);
  }
}

std::vector<std::pair<SsdKey, SsdEntryMeta>> SsdTier::Find(std::string_view ns,
                                                           const ChainKey& chain,
                                                           StateKind kind) const {
  std::vector<std::pair<SsdKey, SsdEntryMeta>> out;
  const Nanos now = impl_->clock->Now();
  MutexLock lock(impl_->mu);
  auto models = impl_->models.find(ns);
  if (models == impl_->models.end()) return out;
  impl_->ApplyTouches();
  for (const ModelId& model : models->second) {
    SsdKey key{std::string(ns), model, chain, kind};
    auto it = impl_->records.find(EncodeSsdKey(key));
    if (it == impl_->records.end() || it->second->meta.expiry <= now) continue;
    out.emplace_back(std::move(key), it->second->meta);
  }
  return out;
}

Nanos SsdTier::Now() const { return impl_->clock->Now(); }

uint64_t SsdTier::RunMaintenance() { return impl_->MakeRoom(0, /*ttl=*/true); }

SsdTierStats SsdTier::Stats() const {
  const Impl& s = *impl_;
  MutexLock lock(s.mu);
  SsdTierStats st;
  st.capacity_bytes = s.Capacity();
  st.used_bytes = s.Used();
  st.entries = s.records.size();
  st.bytes_written = s.bytes_written;
  st.bytes_read = s.bytes_read;
  st.write_failures = s.write_failures;
  st.checksum_failures = s.checksum_failures;
  st.evictions = s.evictions;
  st.ttl_expired = s.ttl_expired;
  st.writes_enabled = s.writes_enabled && !s.index_failed.load();
  return st;
}

const SsdTierOptions& SsdTier::options() const { return impl_->opts; }

std::string SsdTier::DataFilePathForTesting(uint32_t file) const {
  return file < impl_->paths.size() ? impl_->paths[file] : std::string();
}

bool SsdTier::EvictionOrderConsistentForTesting() const {
  const Impl& s = *impl_;
  MutexLock lock(s.mu);
  uint64_t shadow_bytes = 0;
  for (const auto& [k, r] : s.records) {
    const auto [queue, time] = s.QueueOf(*r);
    const EvictionQueues<Record>::Position& p = r->queued;
    if (r->queue != queue || p.time != time || p.order != r->order || p.key != &k ||
        p.item != r.get() || !s.queues.Contains(queue, p) || !s.by_expiry.contains(r.get())) {
      return false;
    }
    if (queue == Impl::kShadowQueue) shadow_bytes += r->meta.extent_bytes;
  }
  return s.queues.size() == s.records.size() && s.by_expiry.size() == s.records.size() &&
         s.shadow_bytes == shadow_bytes;
}

void SsdTier::FailNextSubmitsForTesting(int rc) {
  MutexLock lock(impl_->rings_mu);
  for (const std::unique_ptr<UringRing>& r : impl_->rings) r->FailSubmitsForTesting(rc, 1);
}

}  // namespace strata

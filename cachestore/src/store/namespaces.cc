// Layouts, namespaces and their quotas (lease limits, held bytes), TTLs and
// index lookups.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

const Layout* CacheStore::Impl::FindLayout(uint32_t id) const {
  ReaderLock lock(layouts_mu);
  auto it = layouts.find(id);
  return it == layouts.end() ? nullptr : &it->second;
}

std::optional<uint32_t> CacheStore::Impl::FindNamespace(const std::string& ns) const {
  ReaderLock lock(ns_mu);
  auto it = ns_ids.find(ns);
  if (it == ns_ids.end()) return std::nullopt;
  return it->second;
}

CacheStore::Impl::NamespaceCounters& CacheStore::Impl::CountersOf(uint32_t ns) {
  ReaderLock lock(ns_mu);
  return ns_counters[ns];
}

const CacheStore::Impl::NamespaceCounters& CacheStore::Impl::CountersOf(uint32_t ns) const {
  ReaderLock lock(ns_mu);
  return ns_counters[ns];
}

std::atomic<int64_t>* CacheStore::Impl::LeasePinnedBytes(uint32_t ns) {
  ReaderLock lock(ns_mu);
  return &ns_lease_pinned[ns];
}

uint64_t CacheStore::Impl::ReadPinnedBytes(uint32_t ns) const {
  ReaderLock lock(ns_mu);
  return ns < ns_lease_pinned.size()
             ? static_cast<uint64_t>(std::max<int64_t>(ns_lease_pinned[ns].load(), 0))
             : 0;
}

uint64_t CacheStore::Impl::HeldBytesLimit() const {
  return static_cast<uint64_t>(opts.max_held_share_per_namespace *
                               static_cast<double>(arena->capacity_bytes()));
}

std::string CacheStore::Impl::PastLeaseLimits(uint32_t ns, uint64_t entries, uint64_t bytes) const {
  const LeaseHolding h = HoldingOf(ns);
  if (h.leased_entries + entries > h.leased_entries_limit) {
    return "its leases hold " + std::to_string(h.leased_entries) + " entries; " +
           std::to_string(entries) + " more would pass the " +
           std::to_string(h.leased_entries_limit) + " allowed";
  }
  if (h.held_bytes + bytes <= h.limit_bytes) return {};
  return "its leases and pins hold " + std::to_string(h.held_bytes) + " bytes of the DRAM tier; " +
         std::to_string(bytes) + " more would pass the " + std::to_string(h.limit_bytes) +
         " allowed (max_held_share_per_namespace)";
}

LeaseHolding CacheStore::Impl::HoldingOf(uint32_t ns) const {
  const HeldByLeases by_leases = leases.held(ns, clock->Now());
  return {
      .held_bytes = ReadPinnedBytes(ns) + by_leases.reserved_bytes + by_leases.admin_pinned_bytes,
      .limit_bytes = HeldBytesLimit(),
      .leased_entries = by_leases.entries,
      .leased_entries_limit = opts.max_leased_entries_per_namespace};
}

CacheStore::Impl::ReserveNeed CacheStore::Impl::ComputeReserveNeed(
    uint32_t ns, std::span<const CommitBlock> blocks, Nanos now) const {
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

uint64_t CacheStore::Impl::UnevictableBytes() const {
  uint64_t bytes = reserved_bytes;
  ReaderLock lock(ns_mu);
  for (const std::atomic<int64_t>& pinned : ns_lease_pinned) {
    bytes += static_cast<uint64_t>(std::max<int64_t>(pinned.load(), 0));
  }
  return bytes;
}

Result<uint64_t> CacheStore::Impl::LeaseRoom(const std::string& ns) const {
  const std::optional<uint32_t> id = FindNamespace(ns);
  if (!id.has_value()) return opts.max_leased_entries_per_namespace;
  if (std::string why = PastLeaseLimits(*id, 1, 0); !why.empty()) return LeaseRefused(ns, why);
  const LeaseHolding h = HoldingOf(*id);
  return h.leased_entries_limit - h.leased_entries;
}

Status CacheStore::Impl::LeaseRefused(const std::string& ns, const std::string& why) {
  return ResourceExhausted("namespace '" + ns + "': " + why +
                           ": end leases (Abort) and unpin entries you are done with");
}

uint32_t CacheStore::Impl::InternNamespace(const std::string& ns) {
  if (auto id = FindNamespace(ns)) return *id;
  WriterLock lock(ns_mu);
  auto [it, inserted] = ns_ids.emplace(ns, static_cast<uint32_t>(ns_names.size()));
  if (inserted) {
    ns_names.push_back(ns);
    ns_lease_pinned.emplace_back(0);
    ns_counters.emplace_back();
  }
  return it->second;
}

std::optional<uint32_t> CacheStore::Impl::NamespaceForAdmin(const std::string& ns) const {
  const std::optional<uint32_t> id = FindNamespace(ns);
  if (id.has_value() || ssd == nullptr) return id;
  return kUnseenNamespace;
}

void CacheStore::Impl::ResolveUnseen(const std::string& ns, uint32_t* id) const {
  if (*id != kUnseenNamespace) return;
  if (const std::optional<uint32_t> found = FindNamespace(ns)) *id = *found;
}

Entry* CacheStore::Impl::FindVisible(const Shard& shard, const EntryKey& k, Nanos now) const {
  auto it = shard.map.find(k);
  return it == shard.map.end() ? nullptr : VisibleOrNull(it->second, now);
}

Entry* CacheStore::Impl::VisibleOrNull(Entry* e, Nanos now) {
  if (e == nullptr || e->state.load() != EntryState::kCommitted || e->expiry <= now) {
    return nullptr;
  }
  return e;
}

Entry* CacheStore::Impl::IndexedUnderStructureMu(const EntryKey& k) const {
  const Shard& shard = ShardFor(k);
  auto it = shard.map.find(k);
  return it == shard.map.end() ? nullptr : it->second;
}

}  // namespace strata

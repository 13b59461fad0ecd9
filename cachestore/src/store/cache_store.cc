// Opening and closing the store, layouts, statistics, test hooks and the
// range pins the data plane takes.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

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

// ---------------------------------------------------------------------------

CacheStore::CacheStore(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), clock_(impl_->clock), metrics_(impl_->registry) {}

namespace {

Status CheckOptions(const CacheStoreOptions& options) {
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
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CacheStore>> CacheStore::Open(CacheStoreOptions options) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options));
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
  MutexLock lock(impl->structure_mu);  // nobody else sees the store yet; for the analysis
  impl->InstallPolicy(std::move(policy).value());
  impl->shards = std::make_unique<Impl::Shard[]>(options.index_shards);
  impl->shard_mask = options.index_shards - 1;
  impl->RegisterMetrics();

  std::vector<Layout> layouts = {MakeGlobalKvLayout(kV41GlobalKvLayoutId),
                                 MakeSwaLayout(kV41SwaLayoutId)};
  layouts.insert(layouts.end(), options.extra_layouts.begin(), options.extra_layouts.end());
  if (options.ssd.has_value()) STRATA_RETURN_IF_ERROR(impl->OpenSsdTier());
  std::unique_ptr<CacheStore> store(new CacheStore(std::move(impl)));
  for (const Layout& l : layouts) STRATA_RETURN_IF_ERROR(store->RegisterLayout(l));
  store->impl_->StartThreads();
  return store;
}

// With committed shares on, the policy is wrapped to keep each namespace's.
void CacheStore::Impl::InstallPolicy(std::unique_ptr<EvictionPolicy> base) {
  policy = std::move(base);
  if (opts.committed_share_per_namespace < 1) {
    auto tenant_shares = std::make_unique<TenantSharePolicy>(
        std::move(policy),
        static_cast<uint64_t>(opts.committed_share_per_namespace * arena->capacity_bytes()));
    shares = tenant_shares.get();
    policy = std::move(tenant_shares);
  }
}

void CacheStore::Impl::RegisterMetrics() {
  MetricsRegistry& r = *registry;
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
  m.capacity_bytes->Set(static_cast<int64_t>(arena->capacity_bytes()));
}

Status CacheStore::Impl::OpenSsdTier() {
  if (opts.ssd_writeback_batch == 0 || opts.ssd_writeback_queue == 0) {
    return InvalidArgument("SSD write-back batch and queue must be positive");
  }
  SsdTierOptions ssd_opts = *opts.ssd;
  if (ssd_opts.metrics == nullptr) ssd_opts.metrics = registry;
  auto opened = SsdTier::Open(std::move(ssd_opts));
  if (!opened.ok()) return opened.status();
  ssd = std::move(opened).value();
  MetricsRegistry& r = *registry;
  ssd_promotions =
      r.GetCounter("strata_ssd_promotions_total", "SSD entries read into the DRAM tier.");
  ssd_wb_dropped = r.GetCounter("strata_ssd_writeback_dropped_total",
                                "Entries not written back: the queue was full.");
  ssd_wb_pending = r.GetGauge("strata_ssd_writeback_pending", "Entries queued for SSD write-back.");
  return Status::Ok();
}

// The write-back thread (with an SSD tier) and the maintenance thread
// (with a maintenance interval).
void CacheStore::Impl::StartThreads() {
  if (ssd != nullptr) wb_thread = std::thread([this] { WriteBackLoop(); });
  if (opts.maintenance_interval > 0) maintenance = std::thread([this] { MaintenanceLoop(); });
}

CacheStore::~CacheStore() {
  {
    MutexLock lock(impl_->maintenance_mu);
    impl_->stopping = true;
  }
  impl_->maintenance_cv.notify_all();
  if (impl_->maintenance.joinable()) impl_->maintenance.join();
  // Write back what is queued, so a clean restart keeps it.
  {
    MutexLock lock(impl_->wb_mu);
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
  WriterLock lock(impl_->layouts_mu);
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

MaintenanceReport CacheStore::RunMaintenance() {
  MaintenanceReport report = impl_->RunMaintenance();
  impl_->MaybeRunSsdMaintenance(/*background=*/false);
  return report;
}

void CacheStore::FlushWriteBack() {
  Impl& s = *impl_;
  if (s.ssd == nullptr) return;
  MutexLock lock(s.wb_mu);
  s.wb_idle_cv.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.wb_mu) {
    return s.wb_queue.empty() && s.wb_busy == 0;
  });
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
    MutexLock lock(s.structure_mu);
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
    MutexLock lock(s.wb_mu);
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

std::vector<std::string> CacheStore::Namespaces() const {
  ReaderLock lock(impl_->ns_mu);
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

// Opening the tier: the data files, the RocksDB index read back (and
// reopened after an index failure).
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

bool SsdTier::Impl::RecoverIndex(bool force) {
  if (!index_failed.load() && !force) return true;
  {
    MutexLock index_lock(index_mu);
    if (index_failed.load()) {
      const Nanos now = clock->Now();
      if (!force && now < index_retry_at) return false;
      index.reset();  // RocksDB allows one open instance per directory
      auto reopened = SsdIndex::Open(index_path);
      if (!reopened.ok()) {
        index_retry_at = now + opts.write_retry_interval;
        spdlog::error("ssd: reopening the failed index: {}", reopened.status().ToString());
        return false;
      }
      index = std::move(reopened).value();
      index_failed.store(false);
      spdlog::info("ssd: index reopened after a failure");
    }
  }
  std::vector<std::string> keys;
  std::vector<RecordPtr> recs;
  {
    MutexLock lock(mu);
    for (auto& [k, r] : undeleted) {
      keys.push_back(std::move(k));
      recs.push_back(std::move(r));
    }
    undeleted.clear();
  }
  return FinishRetire(keys, recs).ok();
}

SsdTier::SsdTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SsdTier::~SsdTier() {
  // Last chance for deletes the index missed: a restart would bring their
  // entries back.
  bool undeleted = false;
  {
    MutexLock lock(impl_->mu);
    undeleted = !impl_->undeleted.empty();
  }
  if (undeleted && !impl_->RecoverIndex(/*force=*/true)) {
    spdlog::error("ssd: closing with index deletes not made durable; their entries come back");
  }
}

namespace {

// Refuses options out of range; otherwise the bytes each data file gets.
Result<uint64_t> CheckOptions(const SsdTierOptions& options) {
  if (options.dir.empty()) return InvalidArgument("the SSD tier needs a directory");
  if (options.data_files == 0 || options.data_files > 64) {
    return InvalidArgument("data_files must be in 1..64");
  }
  const uint64_t per_file =
      options.capacity_bytes / options.data_files / kSsdBlockBytes * kSsdBlockBytes;
  if (per_file == 0)
    return InvalidArgument("SSD capacity is smaller than one 4 KiB block per file");
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return InvalidArgument("queue_depth must be in 1..4096");
  }
  if (options.rings == 0 || options.rings > 64) return InvalidArgument("rings must be in 1..64");
  if (options.io_buffer_bytes == 0 || options.io_buffer_bytes % kSsdBlockBytes != 0 ||
      options.io_buffer_bytes > (64u << 20)) {
    return InvalidArgument("io_buffer_bytes must be a multiple of 4096, at most 64 MiB");
  }
  if (!(options.low_watermark > 0 && options.low_watermark <= options.high_watermark &&
        options.high_watermark <= 1.0)) {
    return InvalidArgument("SSD watermarks need 0 < low <= high <= 1");
  }
  if (options.ttl <= 0) return InvalidArgument("SSD TTL must be positive");
  if (options.eviction_policy != "lru" && options.eviction_policy != "deadline") {
    return InvalidArgument("unknown SSD eviction policy '" + options.eviction_policy +
                           "' (lru or deadline)");
  }
  return per_file;
}

}  // namespace

// The tier is nobody else's until Open returns it: no locks, and no
// thread-safety analysis (nor in the steps below, which only Open calls).
Result<std::unique_ptr<SsdTier>> SsdTier::Open(SsdTierOptions options)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const Result<uint64_t> per_file = CheckOptions(options);
  if (!per_file.ok()) return per_file.status();

  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->clock = options.clock != nullptr ? options.clock : &kWallClock;
  impl->RegisterMetrics();
  STRATA_RETURN_IF_ERROR(impl->LockDirectory());
  STRATA_RETURN_IF_ERROR(impl->OpenDataFiles(*per_file));
  impl->index_path = options.index_dir.empty() ? options.dir + "/index" : options.index_dir;
  auto index = SsdIndex::Open(impl->index_path);
  if (!index.ok()) return index.status();
  impl->index = std::move(index).value();
  STRATA_RETURN_IF_ERROR(impl->RebuildFromIndex());
  if (options.eviction_policy == "deadline") impl->StartDeadlineModel();
  for (auto& [k, r] : impl->records) impl->IndexRecord(k, *r);
  impl->m.capacity_bytes->Set(static_cast<int64_t>(impl->Capacity()));
  impl->PublishGauges();
  return std::unique_ptr<SsdTier>(new SsdTier(std::move(impl)));
}

void SsdTier::Impl::RegisterMetrics() {
  MetricsRegistry* reg = opts.metrics;
  if (reg == nullptr) {
    owned_metrics = std::make_unique<MetricsRegistry>();
    reg = owned_metrics.get();
  }
  const MetricLabels ssd{{"tier", "ssd"}};
  auto evict = [&](const char* reason) {
    return reg->GetCounter("strata_evictions_total", "Entries removed, by reason.",
                           {{"tier", "ssd"}, {"reason", reason}});
  };
  m.bytes_written =
      reg->GetCounter("strata_ssd_written_bytes_total", "Payload bytes written to SSD.");
  m.bytes_read =
      reg->GetCounter("strata_ssd_read_bytes_total", "Verified payload bytes read from SSD.");
  m.write_failures = reg->GetCounter("strata_ssd_write_failures_total",
                                     "SSD write batches failed by I/O errors or a full disk.");
  m.checksum_failures = reg->GetCounter("strata_ssd_checksum_failures_total",
                                        "SSD reads that failed verification (entry dropped).");
  m.evict_watermark = evict("watermark");
  m.evict_ttl = evict("ttl");
  m.evict_checksum = evict("checksum");
  m.evict_explicit = evict("explicit");
  m.evict_io_error = evict("io_error");
  m.used_bytes = reg->GetGauge("strata_tier_used_bytes", "Bytes allocated in the tier.", ssd);
  m.capacity_bytes = reg->GetGauge("strata_tier_capacity_bytes", "Tier capacity.", ssd);
  m.entries = reg->GetGauge("strata_ssd_entries", "Entries indexed on the SSD tier.");
  m.writes_enabled = reg->GetGauge("strata_ssd_writes_enabled", "1 unless SSD writes are stopped.");
  m.writes_enabled->Set(1);
}

// Before anything is opened or resized: a second tier on this directory
// (a restart racing the old process, another node) would shrink or
// overwrite the live one's files, whatever its index directory.
Status SsdTier::Impl::LockDirectory() {
  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec) return Unavailable("cannot create " + opts.dir + ": " + ec.message());
  const std::string lock_path = opts.dir + "/LOCK";
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Unavailable("open " + lock_path + ": " + Errno(errno));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Unavailable("SSD directory " + opts.dir + " is in use by another SSD tier (" +
                       lock_path + " is locked: " + Errno(errno) + ")");
  }
  return Status::Ok();
}

Status SsdTier::Impl::OpenDataFiles(uint64_t per_file) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (uint32_t f = 0; f < opts.data_files; ++f) {
    const std::string path = opts.dir + "/data-" + std::to_string(f) + ".bin";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) return Unavailable("open " + path + " with O_DIRECT: " + Errno(errno));
    fds.push_back(fd);
    paths.push_back(path);
    // Sparse: space is used as extents are written, so a small file system
    // shows up as ENOSPC on write, not as a failed open.
    if (::ftruncate(fd, static_cast<off_t>(per_file)) != 0) {
      return Unavailable("ftruncate " + path + ": " + Errno(errno));
    }
    space.emplace_back(per_file);
  }
  for (uint32_t i = 0; i < opts.rings; ++i) {
    auto ring = UringRing::Create(fds, opts.queue_depth, opts.io_buffer_bytes);
    if (!ring.ok()) return ring.status();
    idle_rings.push_back(ring->get());
    rings.push_back(std::move(ring).value());
  }
  return Status::Ok();
}

// Rebuilds the in-memory index and the occupancy from RocksDB; drops what
// is undecodable, expired, out of range or overlapping.
Status SsdTier::Impl::RebuildFromIndex() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const Nanos now = clock->Now();
  std::vector<std::string> bad;
  Status scan =
      index->ForEach([&](std::string_view k, std::string_view v) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        std::optional<SsdKey> key = DecodeSsdKey(k);
        std::optional<SsdEntryMeta> meta = DecodeSsdMeta(v);
        const bool ok = key.has_value() && meta.has_value() && meta->file < opts.data_files &&
                        meta->offset % kSsdBlockBytes == 0 &&
                        meta->extent_bytes == SsdIoBytes(meta->payload_bytes) &&
                        meta->payload_bytes > 0 && meta->payload_bytes <= kMaxSsdPayloadBytes &&
                        meta->expiry > now &&
                        space[meta->file].Claim(meta->offset, meta->extent_bytes);
        if (!ok) {
          bad.emplace_back(k);
          return;
        }
        auto rec = std::make_shared<Record>();
        rec->meta = *meta;
        rec->persisted_access = meta->last_access;
        models[key->ns].insert(key->model_id);
        records.emplace(std::string(k), std::move(rec));
      });
  STRATA_RETURN_IF_ERROR(scan);
  if (!bad.empty()) {
    spdlog::warn("ssd: dropped {} index entries on open (expired or invalid)", bad.size());
    STRATA_RETURN_IF_ERROR(index->Apply({}, bad, /*sync=*/true));
  }
  return Status::Ok();
}

// Restored entries keep their last-access order and come before anything
// written from now on.
void SsdTier::Impl::StartDeadlineModel() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  model.emplace(ModelCapacity(0));
  std::vector<std::pair<Nanos, Record*>> restored;
  for (const auto& [k, r] : records) restored.emplace_back(r->meta.last_access, r.get());
  std::sort(restored.begin(), restored.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < restored.size(); ++i) restored[i].second->tick = i;
  model->StartAt(restored.size());
}

}  // namespace strata

// Reserve, Publish and Commit (the two-phase write), lease renewal and abort.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

namespace {
// A write lease's record, before its entries are reserved.
LeaseRecord NewWriteLease(uint32_t ns, Nanos now, Nanos ttl, size_t blocks) {
  LeaseRecord rec;
  rec.ns = ns;
  rec.write = true;
  rec.granted = now;
  rec.expiry = now + ttl;
  rec.batch_size = static_cast<uint32_t>(blocks);
  rec.entries.reserve(blocks);
  rec.positions.reserve(blocks);
  rec.parents.reserve(blocks);
  return rec;
}
}  // namespace

Result<Reservation> CacheStore::Reserve(const Principal& caller, const ModelId& model,
                                        std::span<const CommitBlock> blocks, Nanos ttl) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kWrite));
  if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
    return InvalidArgument("commit needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("write lease ttl out of range");
  if (ttl == 0) ttl = s.opts.default_write_lease_ttl;
  STRATA_RETURN_IF_ERROR(s.CheckReserveBlocks(blocks));
  const uint32_t ns = s.InternNamespace(caller.ns);
  const Nanos now = s.clock->Now();

  Reservation out;
  out.blocks.resize(blocks.size());
  LeaseRecord rec = NewWriteLease(ns, now, ttl, blocks.size());
  {
    MutexLock lock(s.structure_mu);
    // Refused before anything changes (an expired entry deleted, others
    // evicted to make room); the grant below makes the exact check.
    const Impl::ReserveNeed need = s.ComputeReserveNeed(ns, blocks, now);
    STRATA_RETURN_IF_ERROR(s.CheckReserveNeed(caller.ns, ns, need));
    STRATA_RETURN_IF_ERROR(s.ReserveEntries(ns, model, blocks, now, need, rec, out));
    if (!rec.entries.empty()) STRATA_RETURN_IF_ERROR(s.GrantWriteLease(caller.ns, ns, rec, out));
    s.m.used_bytes->Set(static_cast<int64_t>(s.arena->used_bytes()));
    s.EvictToWatermark(now, need.keep);
  }
  return out;
}

Status CacheStore::Impl::ValidateCommitBlock(const CommitBlock& b) const {
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
  return Status::Ok();
}

Status CacheStore::Impl::CheckReserveBlocks(std::span<const CommitBlock> blocks) const {
  for (size_t i = 0; i < blocks.size(); ++i) {
    Status st = ValidateCommitBlock(blocks[i]);
    if (!st.ok()) return Status(st.code(), "block " + std::to_string(i) + ": " + st.message());
    // Would never fit, whatever is evicted: say so, not "no room".
    if (blocks[i].payload_bytes > arena->capacity_bytes()) {
      return ResourceExhausted(
          "block " + std::to_string(i) + ": an entry of " +
          std::to_string(blocks[i].payload_bytes) + " bytes is larger than the whole DRAM tier (" +
          std::to_string(arena->capacity_bytes()) + " bytes): raise dram_bytes");
    }
  }
  return Status::Ok();
}

Status CacheStore::Impl::CheckReserveNeed(const std::string& caller_ns, uint32_t ns,
                                          const ReserveNeed& need) const {
  if (std::string why = PastLeaseLimits(ns, need.entries, need.bytes); !why.empty()) {
    return LeaseRefused(caller_ns, why);
  }
  // Nor does a batch that could not fit even if every evictable entry
  // went evict any of them first.
  const uint64_t capacity = arena->capacity_bytes();
  if (const uint64_t held = UnevictableBytes(); need.bytes > capacity - std::min(capacity, held)) {
    return ResourceExhausted("no room for " + std::to_string(need.bytes) +
                             " bytes in the DRAM tier: " + std::to_string(held) + " of its " +
                             std::to_string(capacity) +
                             " bytes are reserved or held by read leases");
  }
  return Status::Ok();
}

Status CacheStore::Impl::ReserveEntries(uint32_t ns, const ModelId& model,
                                        std::span<const CommitBlock> blocks, Nanos now,
                                        const ReserveNeed& need, LeaseRecord& rec,
                                        Reservation& out) {
  std::atomic<int64_t>* const ns_pinned = LeasePinnedBytes(ns);
  uint64_t batch_bytes = 0;  // extents reserved so far
  for (size_t i = 0; i < blocks.size(); ++i) {
    const CommitBlock& b = blocks[i];
    const EntryKey k{ns, b.kind, b.key};
    if (Entry* existing = IndexedUnderStructureMu(k)) {
      const EntryState st = existing->state.load();
      if (st == EntryState::kCommitted && existing->expiry > now) {
        out.blocks[i].state = ReserveState::kAlreadyPresent;
        continue;
      }
      if (st == EntryState::kCommitted) {
        DeleteSubtree(existing, EvictReason::kTtl);  // expired: make room
      }
      if (IndexedUnderStructureMu(k) != nullptr) {
        out.blocks[i].state = ReserveState::kInFlight;
        continue;
      }
    }
    const TenantSharePolicy::Room room{ns, batch_bytes};
    std::optional<Extent> extent = AllocateExtent(b.payload_bytes, now, room, need.keep);
    if (!extent.has_value()) {
      const std::string why = NoRoom(b.payload_bytes, room);
      UndoReservation(rec);
      return ResourceExhausted(why);
    }
    batch_bytes += extent->length;
    Entry* e = pool.Acquire();
    e->key = k;
    e->ns_lease_pinned_bytes = ns_pinned;
    e->model_id = model;
    e->layout_id = b.layout_id;
    e->payload_bytes = b.payload_bytes;
    e->extent = *extent;
    e->state.store(EntryState::kReserved);
    {
      Shard& shard = ShardFor(k);
      WriterLock slock(shard.mu);
      shard.map.emplace(k, e);
    }
    ++reserved_entries;
    reserved_bytes += e->extent.length;
    payload_bytes.fetch_add(b.payload_bytes);
    rec.entries.push_back({e, e->generation});
    rec.positions.push_back(static_cast<uint32_t>(i));
    rec.parents.push_back(b.parent);
    out.blocks[i].state = ReserveState::kReserved;
    out.blocks[i].buffer = arena->Bytes(e->extent, e->payload_bytes);
  }
  return Status::Ok();
}

void CacheStore::Impl::UndoReservation(const LeaseRecord& rec) {
  for (const EntryRef& ref : rec.entries) EraseEntry(ref.entry);
}

// Granted under structure_mu, so a concurrent reservation's check above
// counts this one's extents. Refused only if read leases pinned more
// meanwhile (or deleting an expired block took later blocks of the batch
// with it, which the check counted as present).
Status CacheStore::Impl::GrantWriteLease(const std::string& caller_ns, uint32_t ns,
                                         LeaseRecord& rec, Reservation& out) {
  const Nanos expiry = rec.expiry;
  m.leases_live_write->Add(1);  // before: it may end as soon as granted
  Result<LeaseId> lease = leases.Grant(rec, LeaseLimitsFor(ns));
  if (!lease.ok()) {
    m.leases_live_write->Add(-1);
    UndoReservation(rec);  // no lease: nothing can have pinned them
    return LeaseRefused(caller_ns, lease.status().message());
  }
  out.expiry = expiry;
  out.write_lease = *lease;
  return Status::Ok();
}

Result<PublishResult> CacheStore::Publish(const Principal& caller, LeaseId lease,
                                          std::span<const uint64_t> checksums) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kWrite));
  const std::optional<uint32_t> ns = s.FindNamespace(caller.ns);
  if (!ns.has_value()) return LeaseExpired("write lease " + std::to_string(lease) + " is not live");
  const Nanos now = s.clock->Now();
  uint32_t batch = 0;
  Result<LeaseRecord> rec = s.TakeLeaseToPublish(*ns, lease, now, checksums.size(), &batch);
  if (!rec.ok()) return rec.status();
  // Verify outside the structure lock: reserved entries belong to this lease
  // alone, nothing else reads or frees them.
  std::vector<Status> verdict = s.VerifyReserved(*rec, checksums);

  PublishResult out;
  out.blocks.assign(batch, Status::Ok());
  MutexLock lock(s.structure_mu);
  const std::vector<Entry*> published = s.PublishReserved(*ns, *rec, now, verdict, out);
  s.OrderPublished(published);
  out.published = static_cast<uint32_t>(published.size());
  s.m.commit_entries->Increment(published.size());
  return out;
}

Result<LeaseRecord> CacheStore::Impl::TakeLeaseToPublish(uint32_t ns, LeaseId lease, Nanos now,
                                                         size_t checksums, uint32_t* batch) {
  bool write = false;
  Status live = leases.WithLive(ns, lease, now, [&](const LeaseRecord& rec) {
    *batch = rec.batch_size;
    write = rec.write;
  });
  if (live.code() == StatusCode::kLeaseExpired) {
    // Too late: give the space back now rather than at the next sweep.
    std::optional<LeaseRecord> rec = leases.Take(ns, lease);
    if (rec.has_value()) EndLease(*rec, /*expired=*/true);
  }
  STRATA_RETURN_IF_ERROR(live);
  if (!write) return InvalidArgument("lease " + std::to_string(lease) + " is a read lease");
  if (checksums != *batch) {
    return InvalidArgument("publish needs one checksum per reserved block: got " +
                           std::to_string(checksums) + ", reservation has " +
                           std::to_string(*batch));
  }
  std::optional<LeaseRecord> rec = leases.Take(ns, lease);
  if (!rec.has_value()) return LeaseExpired("write lease " + std::to_string(lease) + " ended");
  if (rec->expiry <= now) {
    EndLease(*rec, /*expired=*/true);
    return LeaseExpired("write lease " + std::to_string(lease) + " expired before publish");
  }
  m.leases_live_write->Add(-1);
  return std::move(*rec);
}

std::vector<Status> CacheStore::Impl::VerifyReserved(const LeaseRecord& rec,
                                                     std::span<const uint64_t> checksums) {
  const size_t n = rec.entries.size();
  std::vector<Status> verdict(n);
  const Layout* layout = nullptr;  // a batch is almost always of one layout
  for (size_t j = 0; j < n; ++j) {
    Entry* e = rec.entries[j].entry;
    const uint64_t sum = checksums[rec.positions[j]];
    if (layout == nullptr || layout->id != e->layout_id) layout = FindLayout(e->layout_id);
    verdict[j] = VerifyPayload(*layout, arena->Bytes(e->extent, e->payload_bytes), sum);
    if (verdict[j].code() == StatusCode::kChecksumMismatch) m.checksum_failures->Increment();
    e->checksum = sum;
  }
  return verdict;
}

std::vector<Entry*> CacheStore::Impl::PublishReserved(uint32_t ns, const LeaseRecord& rec,
                                                      Nanos now, std::vector<Status>& verdict,
                                                      PublishResult& out) {
  const size_t n = rec.entries.size();
  std::vector<Entry*> published;
  published.reserve(n);
  for (size_t j = 0; j < n; ++j) {
    Entry* e = rec.entries[j].entry;
    const uint32_t pos = rec.positions[j];
    Entry* parent = nullptr;
    if (verdict[j].ok() && rec.parents[j].has_value()) {
      parent = VisibleUnderStructureMu({ns, StateKind::kGlobalKv, *rec.parents[j]}, now);
      if (parent == nullptr) {
        verdict[j] = NotFound("block " + std::to_string(pos) +
                              ": its parent block is not stored (parents must be committed "
                              "first or earlier in the same batch)");
      }
    }
    if (!verdict[j].ok()) {
      out.blocks[pos] = verdict[j];
      EraseReserved(e);
      continue;
    }
    {
      Shard& shard = ShardFor(e->key);
      WriterLock slock(shard.mu);
      e->commit_time = now;
      e->expiry = now + TtlFor(e->key.kind);
      e->state.store(EntryState::kCommitted);
    }
    --reserved_entries;
    reserved_bytes -= e->extent.length;
    CountEntry(e, +1);
    if (parent != nullptr) TreeLink(e, parent);
    TtlAppend(e);
    published.push_back(e);
    m.commit_bytes->Increment(e->payload_bytes);
    if (SsdAdmits(e->key.kind) &&
        opts.ssd_admission == CacheStoreOptions::SsdAdmission::kAllGlobalKv) {
      EnqueueWriteBack(e);
    }
  }
  return published;
}

// Newest blocks in, deepest first; then their existing ancestors touched
// root-last, so along every chain an ancestor is younger than its
// descendants and LRU's victim is always a leaf.
void CacheStore::Impl::OrderPublished(const std::vector<Entry*>& published) {
  for (size_t i = published.size(); i-- > 0;) policy->OnInsert(published[i]);
  for (Entry* e : published) {
    const bool attaches = e->parent != nullptr && std::find(published.begin(), published.end(),
                                                            e->parent) == published.end();
    // Bounded: ordering is an optimisation (leaf-only eviction is what keeps
    // the tree prefix-safe), and a chain grown block by block gets deep.
    size_t depth = 0;
    for (Entry* a = attaches ? e->parent : nullptr; a != nullptr && depth < kMaxBlocksPerCall;
         a = a->parent, ++depth) {
      policy->OnAccess(a);
    }
  }
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

}  // namespace strata

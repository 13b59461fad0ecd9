// Fetch: verified copies of a match's blocks and SWA state into the caller's
// buffers, cut at the first block that is no longer stored or fails its check.
#include "format/fetch_prefix.h"
#include "store/cache_store_impl.h"

namespace strata {

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

  FetchPrefix prefix(n, want_swa ? std::optional(match.swa->boundary_blocks) : std::nullopt);
  Impl::FetchRun f{.req = req,
                   .match = match,
                   .ns = *ns,
                   .n = n,
                   .want_swa = want_swa,
                   .start = start,
                   .prefix = prefix,
                   .out = out};
  // 1. Pin what we will read: through the lease, or by looking keys up.
  if (Status st = s.PinFetched(f); !st.ok()) return fail(st);
  // A lease that covers fewer blocks than asked for (a match result
  // altered by the caller) serves what it covers.
  prefix.CutMissing(f.pinned.size());
  // 2. Headers: each must hash to its entry checksum and match its layout.
  s.VerifyFetchedHeaders(f);
  // 3. The SWA state first: a worker needs it, with layer group 0, before
  // it runs layer 0, so it must not wait behind every block's body. It is
  // only good with the prefix under it: a body that fails later, short of
  // its boundary, voids it (FetchPrefix::Finish).
  const bool swa_verified = s.CopyFetchedSwa(f);
  // 4. Bodies, layer group by layer group across blocks, so layer group 0
  // of the whole prefix is usable before group 1 starts.
  s.CopyFetchedBodies(f);
  prefix.Finish(swa_verified, out);
  if (out.swa_ready) out.bytes += f.swa_ref.entry->payload_bytes;
  // 5. Let go, and drop whatever failed verification: never serve it again.
  s.ReleaseFetched(f);

  s.m.fetch_bytes->Increment(out.bytes);
  s.m.fetch_seconds->Observe(SecondsSince(*s.clock, start));
  return FetchFuture::Ready(std::move(out));
}

Status CacheStore::Impl::PinFetched(FetchRun& f) {
  f.pinned.reserve(f.n + 1);
  if (f.match.lease != 0) return PinFetchedThroughLease(f);
  PinFetchedByKey(f);
  return Status::Ok();
}

Status CacheStore::Impl::PinFetchedThroughLease(FetchRun& f) {
  bool write_lease = false;
  Status pin_status = leases.WithLive(f.ns, f.match.lease, f.start, [&](const LeaseRecord& rec) {
    write_lease = rec.write;
    if (write_lease) return;  // reserved bytes are nobody's to read
    for (const EntryRef& ref : rec.entries) {
      const Entry* e = ref.entry;
      const bool is_swa = e->key.kind == StateKind::kSwaState;
      if (is_swa ? !f.want_swa : f.pinned.size() >= f.n) continue;
      ref.entry->readers.fetch_add(1);
      (is_swa ? f.swa_ref : f.pinned.emplace_back()) = ref;
    }
  });
  if (!pin_status.ok()) return pin_status;
  if (write_lease) {
    return InvalidArgument("lease " + std::to_string(f.match.lease) + " is a write lease");
  }
  if (ssd != nullptr) PromoteAroundLease(f);
  return Status::Ok();
}

void CacheStore::Impl::PromoteAroundLease(FetchRun& f) {
  const size_t n = f.n;
  const MatchResult& match = f.match;
  std::vector<EntryRef> leased = std::move(f.pinned);
  f.pinned.clear();
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
  for (; j < leased.size(); ++j) Unpin(leased[j], /*lease=*/false);
  std::vector<Result<EntryRef>> promoted = PromoteBlocks(f.ns, match, missing, f.start);
  for (size_t b = 0, m = 0; b < n; ++b) {
    if (!slots[b].has_value()) {
      Result<EntryRef>& ref = promoted[m++];
      if (!ref.ok()) {
        f.prefix.CutMissing(b, ref.status().message());
        continue;
      }
      slots[b] = *ref;
    }
    // Past the first gap nothing is served: drop the pins.
    if (b < f.prefix.usable()) {
      f.pinned.push_back(*slots[b]);
    } else {
      Unpin(*slots[b], /*lease=*/false);
    }
  }
  if (f.want_swa && f.swa_ref.entry == nullptr) {
    Result<EntryRef> ref = PinOrPromote({f.ns, StateKind::kSwaState, match.swa->entry.key},
                                        match.model_id, std::nullopt, f.start);
    if (ref.ok()) f.swa_ref = *ref;
  }
}

void CacheStore::Impl::PinFetchedByKey(FetchRun& f) {
  const size_t n = f.n;
  const MatchResult& match = f.match;
  auto pin = [&](StateKind kind, const ChainKey& key) -> EntryRef {
    const EntryKey k{f.ns, kind, key};
    if (ssd != nullptr) {
      Result<EntryRef> ref = PinOrPromote(k, match.model_id, std::nullopt, f.start);
      return ref.ok() ? *ref : EntryRef{};
    }
    return PinReader(k, f.start);
  };
  if (ssd == nullptr) {
    for (size_t b = 0; b < n; ++b) {
      EntryRef ref = PinReader({f.ns, StateKind::kGlobalKv, match.blocks[b].key}, f.start);
      if (ref.entry == nullptr) {
        f.prefix.CutMissing(b);
        break;
      }
      f.pinned.push_back(ref);
    }
  } else {
    // The SSD-only blocks are read together.
    std::vector<size_t> all(n);
    for (size_t b = 0; b < n; ++b) all[b] = b;
    std::vector<Result<EntryRef>> refs = PromoteBlocks(f.ns, match, all, f.start);
    for (size_t b = 0; b < n; ++b) {
      if (!refs[b].ok()) {
        f.prefix.CutMissing(b);
      } else if (b < f.prefix.usable()) {
        f.pinned.push_back(*refs[b]);
      } else {
        Unpin(*refs[b], /*lease=*/false);  // past the first gap
      }
    }
  }
  if (f.want_swa) f.swa_ref = pin(StateKind::kSwaState, match.swa->entry.key);
}

void CacheStore::Impl::VerifyFetchedHeaders(FetchRun& f) {
  const FetchRequest& req = f.req;
  FetchPrefix& prefix = f.prefix;
  f.headers.resize(f.pinned.size());
  for (uint32_t b = 0; b < prefix.usable(); ++b) {
    Entry* e = f.pinned[b].entry;
    if (e->key.chain != f.match.blocks[b].key || e->payload_bytes > req.block_buffers[b].size()) {
      // A match result altered by the caller, or a lease from another match.
      prefix.Cut(b,
                 InvalidArgument("block " + std::to_string(b) + " does not match its lease entry"));
      break;
    }
    const Layout* layout = FindLayout(e->layout_id);
    const std::span<const std::byte> src = arena->Bytes(e->extent, e->payload_bytes);
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
      f.corrupt.push_back(e);
      prefix.Cut(b, st);
      break;
    }
    f.headers[b] = std::move(header).value();
    f.out.bytes += hb;
  }
}

bool CacheStore::Impl::CopyFetchedSwa(FetchRun& f) {
  const FetchRequest& req = f.req;
  const EntryRef& swa_ref = f.swa_ref;
  bool swa_verified = false;
  if (swa_ref.entry != nullptr && (swa_ref.entry->key.chain != f.match.swa->entry.key ||
                                   swa_ref.entry->payload_bytes > req.swa_buffer.size())) {
    f.prefix.Report(InvalidArgument("SWA entry does not match the lease"));
  } else if (swa_ref.entry != nullptr && f.prefix.SwaCovered()) {
    Entry* e = swa_ref.entry;
    const Layout* layout = FindLayout(e->layout_id);
    std::memcpy(req.swa_buffer.data(), arena->Bytes(e->extent, e->payload_bytes).data(),
                e->payload_bytes);
    Status st = VerifyPayload(*layout, req.swa_buffer.first(e->payload_bytes), e->checksum);
    if (st.ok()) {
      swa_verified = true;
      if (req.on_event) req.on_event({FetchEvent::Type::kSwaReady, 0, 0});
    } else {
      f.corrupt.push_back(e);
      f.prefix.Report(st);
    }
  } else if (f.want_swa && swa_ref.entry == nullptr) {
    f.prefix.SwaMissing();
  }
  return swa_verified;
}

void CacheStore::Impl::CopyFetchedBodies(FetchRun& f) {
  std::vector<VerifiedCopy> copies(f.prefix.usable());
  for (uint32_t b = 0; b < copies.size(); ++b) {
    const Entry* e = f.pinned[b].entry;
    copies[b] = {arena->Bytes(e->extent, e->payload_bytes).data(), f.req.block_buffers[b].data(),
                 &f.headers[b]};
  }
  std::optional<CopyFailure> failure;
  const auto arrived = static_cast<uint32_t>(CopyVerifiedBodies(
      copies, f.req.on_event, &f.out.bytes, &failure,
      [&](size_t g) {
        if (g == 0) m.first_group_seconds->Observe(SecondsSince(*clock, f.start));
      },
      copy_pool.get()));
  if (failure.has_value()) {
    f.corrupt.push_back(f.pinned[failure->block].entry);
    f.prefix.Cut(arrived,
                 ChecksumMismatch("block " + std::to_string(failure->block) + ", layer group " +
                                  std::to_string(failure->group) + " fails its checksum"));
  }
}

void CacheStore::Impl::ReleaseFetched(FetchRun& f) {
  std::vector<EntryRef> refs_to_drop;
  for (Entry* e : f.corrupt) {
    for (const EntryRef& ref : f.pinned) {
      if (ref.entry == e) refs_to_drop.push_back(ref);
    }
    if (f.swa_ref.entry == e) refs_to_drop.push_back(f.swa_ref);
  }
  DropCorrupt(refs_to_drop);
  for (const EntryRef& ref : f.pinned) Unpin(ref, /*lease=*/false);
  if (f.swa_ref.entry != nullptr) Unpin(f.swa_ref, /*lease=*/false);
}

}  // namespace strata

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
  // 1. Pin what we will read: through the lease, or by looking keys up.
  std::vector<EntryRef> pinned;  // blocks first, then the SWA entry
  pinned.reserve(n + 1);
  EntryRef swa_ref;
  if (match.lease != 0) {
    bool write_lease = false;
    Status pin_status = s.leases.WithLive(*ns, match.lease, start, [&](const LeaseRecord& rec) {
      write_lease = rec.write;
      if (write_lease) return;  // reserved bytes are nobody's to read
      for (const EntryRef& ref : rec.entries) {
        const Entry* e = ref.entry;
        const bool is_swa = e->key.kind == StateKind::kSwaState;
        if (is_swa ? !want_swa : pinned.size() >= n) continue;
        ref.entry->readers.fetch_add(1);
        (is_swa ? swa_ref : pinned.emplace_back()) = ref;
      }
    });
    if (!pin_status.ok()) return fail(pin_status);
    if (write_lease) {
      return fail(InvalidArgument("lease " + std::to_string(match.lease) + " is a write lease"));
    }
    if (s.ssd != nullptr) {
      // The lease holds the DRAM blocks only; line them up with the match
      // and promote the SSD-only ones in between.
      std::vector<EntryRef> leased = std::move(pinned);
      pinned.clear();
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
      for (; j < leased.size(); ++j) s.Unpin(leased[j], /*lease=*/false);
      std::vector<Result<EntryRef>> promoted = s.PromoteBlocks(*ns, match, missing, start);
      for (size_t b = 0, m = 0; b < n; ++b) {
        if (!slots[b].has_value()) {
          Result<EntryRef>& ref = promoted[m++];
          if (!ref.ok()) {
            prefix.CutMissing(b, ref.status().message());
            continue;
          }
          slots[b] = *ref;
        }
        // Past the first gap nothing is served: drop the pins.
        if (b < prefix.usable()) {
          pinned.push_back(*slots[b]);
        } else {
          s.Unpin(*slots[b], /*lease=*/false);
        }
      }
      if (want_swa && swa_ref.entry == nullptr) {
        Result<EntryRef> ref = s.PinOrPromote({*ns, StateKind::kSwaState, match.swa->entry.key},
                                              match.model_id, std::nullopt, start);
        if (ref.ok()) swa_ref = *ref;
      }
    }
  } else {
    auto pin = [&](StateKind kind, const ChainKey& key) -> EntryRef {
      const EntryKey k{*ns, kind, key};
      if (s.ssd != nullptr) {
        Result<EntryRef> ref = s.PinOrPromote(k, match.model_id, std::nullopt, start);
        return ref.ok() ? *ref : EntryRef{};
      }
      return s.PinReader(k, start);
    };
    if (s.ssd == nullptr) {
      for (size_t b = 0; b < n; ++b) {
        EntryRef ref = s.PinReader({*ns, StateKind::kGlobalKv, match.blocks[b].key}, start);
        if (ref.entry == nullptr) {
          prefix.CutMissing(b);
          break;
        }
        pinned.push_back(ref);
      }
    } else {
      // The SSD-only blocks are read together.
      std::vector<size_t> all(n);
      for (size_t b = 0; b < n; ++b) all[b] = b;
      std::vector<Result<EntryRef>> refs = s.PromoteBlocks(*ns, match, all, start);
      for (size_t b = 0; b < n; ++b) {
        if (!refs[b].ok()) {
          prefix.CutMissing(b);
        } else if (b < prefix.usable()) {
          pinned.push_back(*refs[b]);
        } else {
          s.Unpin(*refs[b], /*lease=*/false);  // past the first gap
        }
      }
    }
    if (want_swa) swa_ref = pin(StateKind::kSwaState, match.swa->entry.key);
  }

  // A lease that covers fewer blocks than asked for (a match result
  // altered by the caller) serves what it covers.
  prefix.CutMissing(pinned.size());

  // 2. Headers: each must hash to its entry checksum and match its layout.
  std::vector<Entry*> corrupt;
  std::vector<PayloadHeader> headers(pinned.size());
  for (uint32_t b = 0; b < prefix.usable(); ++b) {
    Entry* e = pinned[b].entry;
    if (e->key.chain != match.blocks[b].key || e->payload_bytes > req.block_buffers[b].size()) {
      // A match result altered by the caller, or a lease from another match.
      prefix.Cut(b,
                 InvalidArgument("block " + std::to_string(b) + " does not match its lease entry"));
      break;
    }
    const Layout* layout = s.FindLayout(e->layout_id);
    const std::span<const std::byte> src = s.arena->Bytes(e->extent, e->payload_bytes);
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
      corrupt.push_back(e);
      prefix.Cut(b, st);
      break;
    }
    headers[b] = std::move(header).value();
    out.bytes += hb;
  }

  // 3. The SWA state first: a worker needs it, with layer group 0, before
  // it runs layer 0, so it must not wait behind every block's body. It is
  // only good with the prefix under it: a body that fails later, short of
  // its boundary, voids it (FetchPrefix::Finish).
  bool swa_verified = false;
  if (swa_ref.entry != nullptr && (swa_ref.entry->key.chain != match.swa->entry.key ||
                                   swa_ref.entry->payload_bytes > req.swa_buffer.size())) {
    prefix.Report(InvalidArgument("SWA entry does not match the lease"));
  } else if (swa_ref.entry != nullptr && prefix.SwaCovered()) {
    Entry* e = swa_ref.entry;
    const Layout* layout = s.FindLayout(e->layout_id);
    std::memcpy(req.swa_buffer.data(), s.arena->Bytes(e->extent, e->payload_bytes).data(),
                e->payload_bytes);
    Status st = VerifyPayload(*layout, req.swa_buffer.first(e->payload_bytes), e->checksum);
    if (st.ok()) {
      swa_verified = true;
      if (req.on_event) req.on_event({FetchEvent::Type::kSwaReady, 0, 0});
    } else {
      corrupt.push_back(e);
      prefix.Report(st);
    }
  } else if (want_swa && swa_ref.entry == nullptr) {
    prefix.SwaMissing();
  }

  // 4. Bodies, layer group by layer group across blocks, so layer group 0
  // of the whole prefix is usable before group 1 starts.
  std::vector<VerifiedCopy> copies(prefix.usable());
  for (uint32_t b = 0; b < copies.size(); ++b) {
    const Entry* e = pinned[b].entry;
    copies[b] = {s.arena->Bytes(e->extent, e->payload_bytes).data(), req.block_buffers[b].data(),
                 &headers[b]};
  }
  std::optional<CopyFailure> failure;
  const auto arrived = static_cast<uint32_t>(CopyVerifiedBodies(
      copies, req.on_event, &out.bytes, &failure,
      [&](size_t g) {
        if (g == 0) s.m.first_group_seconds->Observe(SecondsSince(*s.clock, start));
      },
      s.copy_pool.get()));
  if (failure.has_value()) {
    corrupt.push_back(pinned[failure->block].entry);
    prefix.Cut(arrived,
               ChecksumMismatch("block " + std::to_string(failure->block) + ", layer group " +
                                std::to_string(failure->group) + " fails its checksum"));
  }
  prefix.Finish(swa_verified, out);
  if (out.swa_ready) out.bytes += swa_ref.entry->payload_bytes;

  // 5. Let go, and drop whatever failed verification: never serve it again.
  std::vector<EntryRef> refs_to_drop;
  for (Entry* e : corrupt) {
    for (const EntryRef& ref : pinned) {
      if (ref.entry == e) refs_to_drop.push_back(ref);
    }
    if (swa_ref.entry == e) refs_to_drop.push_back(swa_ref);
  }
  s.DropCorrupt(refs_to_drop);
  for (const EntryRef& ref : pinned) s.Unpin(ref, /*lease=*/false);
  if (swa_ref.entry != nullptr) s.Unpin(swa_ref, /*lease=*/false);

  s.m.fetch_bytes->Increment(out.bytes);
  s.m.fetch_seconds->Observe(SecondsSince(*s.clock, start));
  return FetchFuture::Ready(std::move(out));
}

// ---- commit -----------------------------------------------------------------

}  // namespace strata

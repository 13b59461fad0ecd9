// Match and MatchKeys: walking the prefix (PrefixLookup), pinning what hit,
// finding the SWA state.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

// One match in progress: looks blocks up in order, pins them if asked, then
// touches, leases and accounts for them. Shared by Match and MatchKeys.
class CacheStore::PrefixLookup {
 public:
  PrefixLookup(Impl& s, const Principal& caller, const ModelId& model, uint32_t block_tokens,
               uint32_t prompt_blocks, bool lease, Nanos lease_ttl, bool promote_ssd = false)
      : s_(s),
        // Interned even before it stores anything: its lookups are counted
        // (NamespaceUsage), and with an SSD tier it may have entries this
        // process never saw committed (written before a restart). Callers'
        // namespaces come from their credentials, so they are few.
        ns_(s.InternNamespace(caller.ns)),
        ns_name_(caller.ns),
        lease_(lease),
        promote_(lease && promote_ssd && s.ssd != nullptr),
        lease_ttl_(lease_ttl > 0 ? lease_ttl : s.opts.default_read_lease_ttl),
        start_(s.clock->Now()) {
    result_.model_id = model;
    result_.block_tokens = block_tokens;
    result_.prompt_blocks = prompt_blocks;
    hits_.reserve(prompt_blocks);
    result_.blocks.reserve(prompt_blocks);
  }

  // Promote SSD-only blocks of a run together (see Visit) rather than one
  // synchronous read each. Not with independent keys, where a block that
  // fails to promote leaves a hole instead of ending the prefix.
  void BatchPromotions() { batch_ = promote_; }

  // Leases at most `room` entries (Impl::LeaseRoom): the hit run ends there.
  void LimitLeasedEntries(uint64_t room) { lease_room_ = room; }

  // Looks up the next block; false (stop) on a miss.
  bool Visit(const ChainKey& key) {
    if (stopped_) return false;
    if (lease_ && hits_.size() + deferred_.size() >= lease_room_) return false;
    const EntryKey k{ns_, StateKind::kGlobalKv, key};
    // A DRAM block after a run of SSD-only ones: promote the run first, so
    // pins and the prefix stay in order.
    if (!deferred_.empty() && s_.InDram(k, start_) && !Flush()) return false;
    std::optional<BlockMatch> e = Pin(k);
    // The parent is the key just before this one, if that one hit (with
    // independent keys an earlier miss breaks the chain).
    const std::optional<ChainKey> parent = previous_hit_;
    previous_hit_.reset();
    if (!e.has_value() && batch_) {
      if (!s_.SsdAdmits(k.kind) || !s_.ssd->Contains(s_.SsdKeyOf(k, result_.model_id))) {
        return false;
      }
      deferred_.push_back({k, parent, result_.blocks.size()});
      result_.blocks.push_back({key, Tier::kSsd, 0, 0, 0, 0});  // filled by Flush
      previous_hit_ = key;
      return true;
    }
    if (!e.has_value() && promote_) {
      e = PromoteAndPin(k, parent);
      if (!e.has_value()) return false;
    }
    if (!e.has_value()) {
      std::optional<SsdEntryMeta> meta = LookupSsd(k);
      if (!meta.has_value()) return false;
      result_.blocks.push_back(
          {key, Tier::kSsd, meta->layout_id, meta->payload_bytes, meta->entry_checksum, 0});
      previous_hit_ = key;
      return true;
    }
    result_.blocks.push_back(*e);
    previous_hit_ = key;
    return true;
  }

  // Promotes the deferred SSD-only blocks in one go and pins them. The
  // first that fails ends the prefix there; false if one did.
  bool Flush() {
    if (deferred_.empty()) return !stopped_;
    std::vector<EntryKey> keys;
    std::vector<std::optional<ChainKey>> parents;
    for (const Deferred& d : deferred_) {
      keys.push_back(d.key);
      parents.push_back(d.parent);
    }
    std::vector<Result<EntryRef>> promoted =
        s_.PinOrPromoteMany(keys, parents, result_.model_id, start_);
    for (size_t i = 0; i < deferred_.size(); ++i) {
      std::optional<BlockMatch> e;
      if (promoted[i].ok()) {
        if (!stopped_) e = Pin(deferred_[i].key);
        s_.Unpin(*promoted[i], /*lease=*/false);  // the lease's pin holds it now
      }
      if (stopped_) continue;
      if (!e.has_value()) {
        result_.blocks.resize(deferred_[i].index);
        stopped_ = true;
        continue;
      }
      result_.blocks[deferred_[i].index] = *e;
    }
    deferred_.clear();
    return !stopped_;
  }

  // The deepest SWA state at or below the hit run.
  void FindSwa() {
    Flush();
    if (lease_ && hits_.size() >= lease_room_) return;
    const uint32_t hit = static_cast<uint32_t>(result_.blocks.size());
    const uint32_t lowest = hit > kSwaSearchBoundaries ? hit - kSwaSearchBoundaries : 1;
    for (uint32_t b = hit; b >= lowest && b > 0; --b) {
      const EntryKey k{ns_, StateKind::kSwaState, result_.blocks[b - 1].key};
      std::optional<BlockMatch> e = Pin(k);
      if (!e.has_value() && promote_) {
        // A leased remote answer carries DRAM locations only: an SWA state
        // that cannot be promoted is skipped for a lower boundary.
        e = PromoteAndPin(k, std::nullopt);
        if (!e.has_value()) continue;
      }
      if (e.has_value()) {
        result_.swa = SwaMatch{b, *e};
        return;
      }
      if (std::optional<SsdEntryMeta> meta = LookupSsd(k)) {
        result_.swa = SwaMatch{
            b,
            {k.chain, Tier::kSsd, meta->layout_id, meta->payload_bytes, meta->entry_checksum, 0}};
        return;
      }
    }
  }

  // Drops the pins of a match that failed half way.
  void Abandon() {
    if (!lease_) return;
    for (const EntryRef& ref : hits_) s_.Unpin(ref, /*lease=*/true);
  }

  // RESOURCE_EXHAUSTED, with every pin dropped, if the lease would take the
  // caller's namespace past its lease limits.
  Result<MatchResult> Finish(const ChainKey& root, uint64_t prompt_tokens) {
    Flush();
    if (lease_ && !hits_.empty()) {
      LeaseRecord rec;
      rec.ns = ns_;
      rec.granted = start_;
      rec.expiry = start_ + lease_ttl_;
      rec.entries = hits_;
      // This match's pins are counted already, so leases granted at once
      // see each other's and cannot pass the share together. Counted live
      // before the grant: once granted it may end (and be counted out) at
      // once.
      s_.m.leases_live_read->Add(1);
      Result<LeaseId> lease = s_.leases.Grant(rec, s_.LeaseLimitsFor(ns_));
      if (!lease.ok()) {
        s_.m.leases_live_read->Add(-1);
        Abandon();
        return Impl::LeaseRefused(ns_name_, lease.status().message());
      }
      result_.lease = *lease;
      result_.lease_expiry = start_ + lease_ttl_;
    }
    // SSD-only hits, root last too (the SSD tier breaks ties by touch order).
    for (size_t i = ssd_hits_.size(); i-- > 0;) s_.ssd->Touch(ssd_hits_[i]);
    result_.prefix_key = result_.blocks.empty() ? root : result_.blocks.back().key;
    if (!hits_.empty()) {
      // Touch root-last so ancestors stay younger than descendants (the SWA
      // entry, if any, is last in `hits_` and touched first).
      MutexLock lock(s_.structure_mu);
      for (size_t i = hits_.size(); i-- > 0;) {
        const EntryRef& ref = hits_[i];
        if (ref.entry->generation == ref.generation && ref.entry->in_policy) {
          s_.policy->OnHit(ref.entry);
        }
      }
    }
    uint64_t hit_bytes = 0;
    for (const BlockMatch& b : result_.blocks) hit_bytes += b.payload_bytes;
    s_.m.match_requests->Increment();
    s_.m.match_tokens->Increment(prompt_tokens);
    s_.m.hit_tokens->Increment(result_.hit_tokens());
    s_.m.hit_bytes->Increment(hit_bytes);
    Impl::NamespaceCounters& c = s_.CountersOf(ns_);
    c.match_requests.fetch_add(1, std::memory_order_relaxed);
    c.match_tokens.fetch_add(prompt_tokens, std::memory_order_relaxed);
    c.hit_tokens.fetch_add(result_.hit_tokens(), std::memory_order_relaxed);
    c.hit_bytes.fetch_add(hit_bytes, std::memory_order_relaxed);
    s_.m.lookup_seconds->Observe(SecondsSince(*s_.clock, start_));
    return std::move(result_);
  }

 private:
  // Counts a hit on the DRAM entry under `k` (leasing it when asked) and
  // describes it. The description is taken under the shard lock: without a
  // lease nothing stops eviction from reusing the entry right after.
  std::optional<BlockMatch> Pin(const EntryKey& k) {
    Impl::Shard& shard = s_.ShardFor(k);
    ReaderLock lock(shard.mu);
    Entry* e = s_.FindVisible(shard, k, start_);
    if (e == nullptr) return std::nullopt;
    if (lease_ && e->leases.fetch_add(1) == 0) {
      e->ns_lease_pinned_bytes->fetch_add(static_cast<int64_t>(e->extent.length));
    }
    const uint64_t earlier_hits = e->hits.fetch_add(1, std::memory_order_relaxed);
    hits_.push_back({e, e->generation});
    if (earlier_hits == 0 && s_.SsdAdmits(k.kind) &&
        s_.opts.ssd_admission == CacheStoreOptions::SsdAdmission::kHitOnce) {
      s_.EnqueueWriteBack(e);
    }
    return BlockMatch{k.chain,          Tier::kDram, e->layout_id,
                      e->payload_bytes, e->checksum, e->extent.offset};
  }

  // Reads an SSD-only entry into DRAM and pins it like a DRAM hit. The
  // promotion's reader pin keeps the entry alive until the lease holds it.
  std::optional<BlockMatch> PromoteAndPin(const EntryKey& k,
                                          const std::optional<ChainKey>& parent) {
    if (!s_.SsdAdmits(k.kind)) return std::nullopt;
    Result<EntryRef> promoted = s_.PinOrPromote(k, result_.model_id, parent, start_);
    if (!promoted.ok()) return std::nullopt;
    std::optional<BlockMatch> e = Pin(k);
    s_.Unpin(*promoted, /*lease=*/false);
    return e;
  }

  // An SSD-only entry: a hit, reported as Tier::kSsd and promoted by fetch.
  // Not leased (the SSD tier evicts by days-long TTL and watermarks; a block
  // gone by fetch time cuts the prefix there).
  std::optional<SsdEntryMeta> LookupSsd(const EntryKey& k) {
    if (!s_.SsdAdmits(k.kind)) return std::nullopt;
    const SsdKey key{ns_name_, result_.model_id, k.chain, k.kind};
    std::optional<SsdEntryMeta> meta = s_.ssd->Lookup(key);
    if (meta.has_value()) ssd_hits_.push_back(key);  // touched by Finish
    return meta;
  }

  Impl& s_;
  const uint32_t ns_;
  const std::string ns_name_;
  const bool lease_;
  const bool promote_;
  bool batch_ = false;    // see BatchPromotions
  bool stopped_ = false;  // a deferred promotion failed: the prefix ends there
  // SSD-only blocks waiting for Flush, and their places in result_.blocks.
  struct Deferred {
    EntryKey key;
    std::optional<ChainKey> parent;
    size_t index;
  };
  std::vector<Deferred> deferred_;
  std::optional<ChainKey> previous_hit_;  // the last visited key, if it hit
  uint64_t lease_room_ = UINT64_MAX;      // see LimitLeasedEntries
  const Nanos lease_ttl_;
  const Nanos start_;
  std::vector<EntryRef> hits_;
  std::vector<SsdKey> ssd_hits_;  // SSD-only hits, in chain order
  MatchResult result_;
};

Result<MatchResult> CacheStore::Match(const Principal& caller, const MatchRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  if (req.tokens.size() > kMaxPromptTokens) {
    return InvalidArgument("prompt of " + std::to_string(req.tokens.size()) +
                           " tokens exceeds the limit of " + std::to_string(kMaxPromptTokens));
  }
  const size_t blocks = req.block_tokens == 0 ? 0 : req.tokens.size() / req.block_tokens;
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, blocks));
  const ChainRoot root{caller.ns, req.model_id, req.extra};
  STRATA_RETURN_IF_ERROR(ValidateChainInputs(root, req.mm));
  PrefixLookup lookup(*impl_, caller, req.model_id, req.block_tokens, static_cast<uint32_t>(blocks),
                      req.take_lease, req.lease_ttl);
  if (req.take_lease) {
    Result<uint64_t> room = impl_->LeaseRoom(caller.ns);
    if (!room.ok()) return room.status();
    lookup.LimitLeasedEntries(*room);
  }
  // Hash block by block and stop at the first miss: the rest of the prompt
  // cannot hit and need not be hashed.
  auto keys = ChainKeys::ForPrompt(root, req.tokens, req.block_tokens, req.mm,
                                   [&](size_t, const ChainKey& key) { return lookup.Visit(key); });
  if (!keys.ok()) {
    lookup.Abandon();
    return keys.status();
  }
  if (req.want_swa) lookup.FindSwa();
  return lookup.Finish(ChainKeys::Root(root), req.tokens.size());
}

Result<MatchResult> CacheStore::MatchKeys(const Principal& caller, const MatchKeysRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckCaller(caller, Role::kRead));
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, req.keys.size()));
  PrefixLookup lookup(*impl_, caller, req.model_id, req.block_tokens,
                      static_cast<uint32_t>(req.keys.size()), req.take_lease, req.lease_ttl,
                      req.promote_ssd);
  if (req.take_lease) {
    Result<uint64_t> room = impl_->LeaseRoom(caller.ns);
    if (!room.ok()) return room.status();
    lookup.LimitLeasedEntries(*room);
  }
  if (!req.independent_keys) lookup.BatchPromotions();
  for (const ChainKey& key : req.keys) {
    if (!lookup.Visit(key) && !req.independent_keys) break;
  }
  if (req.want_swa) lookup.FindSwa();
  return lookup.Finish(req.root, uint64_t{req.block_tokens} * req.keys.size());
}

}  // namespace strata

// Admission (Engine::Admit and the steps it takes): where a request's
// prefix comes from and how it gets into the sequence. The HBM tier first
// (this worker's PrefixCache), then the store for the rest of the prefix;
// the SWA state at the deepest boundary either has, or encoder bounded
// replay; blocks loaded per layer group as the model reaches them.
#include <algorithm>
#include <cstring>
#include <utility>

#include "engine_internal.h"
#include "engine_metrics.h"
#include "kv_transfer.h"
#include "store_health.h"

namespace strata::worker {

// Pages a new fetch may take now: the free ones and those only the HBM
// tier holds, less the commit staging reserve.
uint32_t Engine::FetchRoom() const {
  const uint32_t free_pages =
      pool_.capacity() - pool_.used_pages() + (hbm_ != nullptr ? hbm_->EvictablePages() : 0);
  const uint32_t staging = StagingPages(pool_);
  return free_pages > staging ? free_pages - staging : 0;
}

Result<uint32_t> Engine::AllocatePage() {
  for (;;) {
    Result<uint32_t> page = pool_.Allocate();
    if (page.ok() || hbm_ == nullptr || !hbm_->EvictOne()) return page;
  }
}

// Plans a request: decoder start, chain keys, the prefix the HBM tier
// holds, a match of the rest in the store, fetch, replay. With `may_defer`,
// a fetch that does not fit in the pool now (but would in an empty one)
// leaves the request queued, its lease released: running requests free
// their fetch pages after their first chunk. False when deferred.
bool Engine::Admit(Sequence& seq, bool may_defer) {
  StartPrefill(seq);
  DeriveChainKeys(seq);
  const uint32_t wanted = WantedBlocks(seq);
  const uint32_t local = MatchLocal(seq, wanted);
  const std::optional<uint32_t> matched = MatchPrefix(seq, local, wanted);
  if (local == 0 && !matched.has_value()) return true;
  uint32_t remote = matched.value_or(0);
  const uint32_t room = FetchRoom();
  const uint32_t ever = pool_.capacity() - StagingPages(pool_);  // in an empty pool
  if (may_defer && remote > room && remote <= ever) {
    seq.deferred_pages = remote;
    seq.stats.matched_tokens = 0;  // the match is let go; the next admission matches again
    ReleaseLocal(seq);
    ReleaseFetch(seq);
    seq.phase = Phase::kQueued;
    return false;
  }
  seq.deferred_pages = 0;
  // Pages for the fetched blocks; a full pool fetches a shorter prefix.
  remote = std::min(remote, room);
  std::vector<std::span<std::byte>> buffers;
  remote = TakeFetchPages(seq, remote, buffers);
  if (remote == 0) ReleaseFetch(seq);  // the match's lease, if any
  if (local + remote == 0) return true;
  if (!PlanFetch(seq, local, remote)) return true;  // computed exactly instead
  StartFetch(seq, local + remote, std::move(buffers));
  return true;
}

// A fresh prefill from token 0, and where its decoder starts.
void Engine::StartPrefill(Sequence& seq) {
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  const int64_t t = static_cast<int64_t>(seq.req.prompt.size());
  seq.phase = Phase::kPrefill;
  seq.state.Init(c);
  seq.cursor = 0;
  seq.replay_begin = -1;
  seq.swa_stale = false;
  seq.lineage = 0;
  seq.lineage_blocks = 0;
  seq.stored_upto = 0;
  // Decoder bounded replay starts at a block boundary at least keep_tokens
  // before the end, so a hit boundary never lies past it.
  const int64_t keep_from = std::max<int64_t>(0, t - options_.keep_tokens);
  seq.state.decoder_start = keep_from / bt * bt;
}

// key[0] under the store's namespace (none known: the request does without
// the store), then a key per full block of the prompt.
void Engine::DeriveChainKeys(Sequence& seq) {
  const uint32_t bt = model_.config.block_tokens;
  const std::string* ns = ChainNamespace();
  if (ns == nullptr) seq.use_store = false;  // computed, nothing matched or committed
  const ChainRoot root{ns != nullptr ? std::string_view(*ns) : kNoStoreNamespace, model_id_,
                       options_.chain_extra};
  seq.keys.assign(1, ChainKeys::Root(root));
  Result<std::vector<ChainKey>> keys = ChainKeys::ForPrompt(root, seq.req.prompt, bt);
  if (keys.ok()) seq.keys.insert(seq.keys.end(), keys->begin(), keys->end());
}

// Only blocks before the decoder start are useful (the decoder needs the
// encoder's output from there on), so only they are matched: the store
// then reports the SWA state at the deepest boundary we can resume from.
uint32_t Engine::WantedBlocks(const Sequence& seq) const {
  const uint32_t bt = model_.config.block_tokens;
  if (!options_.use_store_reads || seq.no_reads) return 0;
  return static_cast<uint32_t>(
      std::min<size_t>(seq.keys.size() - 1, static_cast<size_t>(seq.state.decoder_start / bt)));
}

// The leading blocks of the prompt the HBM tier holds (at most `wanted`),
// their pages referenced in seq.local until LoadLocalPrefix.
uint32_t Engine::MatchLocal(Sequence& seq, uint32_t wanted) {
  if (hbm_ == nullptr) return 0;
  for (uint32_t b = 0; b < wanted; ++b) {
    std::optional<PrefixCache::Hit> hit = hbm_->Acquire(StateKind::kGlobalKv, seq.keys[b + 1]);
    if (!hit.has_value()) break;
    seq.local.push_back(*hit);
  }
  return static_cast<uint32_t>(seq.local.size());
}

// Matches blocks [from, wanted) of the prompt in the store, taking a lease:
// how many of them this engine can read (maybe none), or nullopt when no
// match was made (no store reads, nothing to match, the store out of reach
// or failing). Block `from`'s key stands in for the root: chain keys name
// their whole prefix, so the store matches from the middle of a chain.
std::optional<uint32_t> Engine::MatchPrefix(Sequence& seq, uint32_t from, uint32_t wanted) {
  const uint32_t bt = model_.config.block_tokens;
  seq.stats.matched_tokens = uint64_t{from} * bt;
  if (!seq.use_store || wanted <= from) return std::nullopt;
  if (!store_health_->Usable()) {
    ++seq.stats.store_skipped;
    return std::nullopt;
  }
  MatchKeysRequest mr;
  mr.model_id = model_id_;
  mr.root = seq.keys[from];
  mr.keys = std::span<const ChainKey>(seq.keys).subspan(from + 1, wanted - from);
  mr.block_tokens = bt;
  mr.want_swa = true;
  mr.take_lease = true;
  mr.lease_ttl = options_.lease_ttl;
  const Nanos match_start = clock_.Now();
  Result<MatchResult> match = options_.store->MatchKeys(mr);
  if (metrics_) metrics_->OnMatch(SecondsBetween(match_start, clock_.Now()));
  store_health_->Record(match.status(), StoreHealth::Path::kControl);
  if (!match.ok()) {
    ++seq.stats.store_errors;
    return std::nullopt;
  }
  seq.match = std::move(match).value();
  seq.stats.matched_tokens += seq.match.hit_tokens();
  uint32_t usable =
      std::min<uint32_t>(static_cast<uint32_t>(seq.match.blocks.size()), wanted - from);
  for (uint32_t b = 0; b < usable; ++b) {
    if (seq.match.blocks[b].layout_id != kV41GlobalKvLayoutId ||
        seq.match.blocks[b].payload_bytes != global_layout_.PayloadBytes()) {
      usable = b;  // another layout: not ours to read
      break;
    }
  }
  return usable;
}

// A pool page for each of the first `usable` blocks of the store's match,
// its buffer into `buffers`; returns how many blocks got one.
uint32_t Engine::TakeFetchPages(Sequence& seq, uint32_t usable,
                                std::vector<std::span<std::byte>>& buffers) {
  for (uint32_t b = 0; b < usable; ++b) {
    Result<uint32_t> page = AllocatePage();
    if (!page.ok()) {
      usable = b;
      break;
    }
    seq.fetch_pages.push_back(*page);
    buffers.push_back(pool_.Page(*page).first(global_layout_.PayloadBytes()));
  }
  return usable;
}

// The prefix's lineage (`local` blocks from the HBM tier, then `remote`
// from the store), and whether the SWA state at its boundary comes with it
// (the exact path) or the encoder replays. False when the prefix is computed
// from token 0 instead (ComputeExactly): nothing to load or fetch.
bool Engine::PlanFetch(Sequence& seq, uint32_t local, uint32_t remote) {
  const uint32_t usable = local + remote;
  seq.local_blocks = local;
  seq.fetch_blocks = usable;
  seq.stored_upto = usable;
  for (uint32_t b = 0; b < local; ++b) {
    seq.lineage = ExtendLineage(seq.lineage, seq.local[b].checksum);
  }
  for (uint32_t b = 0; b < remote; ++b) {
    seq.lineage = ExtendLineage(seq.lineage, seq.match.blocks[b].checksum);
  }
  seq.lineage_blocks = usable;
  seq.fetch_swa = PlanSwa(seq, local, remote);
  if (seq.fetch_swa && stale_swa_.contains(StaleSwaKey(seq))) {
    seq.fetch_swa = false;  // rejected before over these very blocks: not worth the transfer
    seq.stats.swa_rejected = true;
  }
  if (!seq.fetch_swa && seq.local_swa.has_value()) {
    pool_.Unref(seq.local_swa->page);
    seq.local_swa.reset();
  }
  if (!seq.fetch_swa && ReplayedOftenEnough(seq, usable)) {
    ComputeExactly(seq, usable);
    return false;
  }
  return true;
}

// Whether the SWA state at the prefix's boundary is there to take: from
// the store's match when the store gives blocks, else from the HBM tier
// (referenced in seq.local_swa). The HBM tier's is checked against the
// prefix's lineage here; the store's when it arrives (BeforeLayer).
bool Engine::PlanSwa(Sequence& seq, uint32_t local, uint32_t remote) {
  if (remote > 0) {
    const bool ok = seq.match.swa.has_value() && seq.match.swa->boundary_blocks == remote &&
                    seq.match.swa->entry.layout_id == kV41SwaLayoutId &&
                    seq.match.swa->entry.payload_bytes == swa_layout_.PayloadBytes();
    if (ok) seq.swa_checksum = seq.match.swa->entry.checksum;
    return ok;
  }
  if (hbm_ == nullptr || local == 0) return false;
  seq.local_swa = hbm_->Acquire(StateKind::kSwaState, seq.keys[local]);
  if (!seq.local_swa.has_value()) return false;
  seq.swa_checksum = seq.local_swa->checksum;
  uint64_t lineage = 0;
  std::memcpy(&lineage, pool_.Page(seq.local_swa->page).data() + swa_lineage_offset_,
              sizeof(lineage));
  if (lineage != seq.lineage) {
    seq.stats.swa_rejected = true;  // over other global KV than the blocks under it now
    return false;
  }
  return true;
}

// The HBM tier's part of the prefix, into the sequence: every layer group
// of its blocks and, on the exact path, the encoder rings. Its pages are
// then let go (the tier keeps its own reference), and the prefix counts as
// used, deepest first so ancestors stay younger.
void Engine::LoadLocalPrefix(Sequence& seq) {
  const ModelConfig& c = model_.config;
  for (uint32_t b = 0; b < seq.local_blocks; ++b) {
    for (uint32_t src = 0; src < c.sources.size(); ++src) {
      CopyGroupIn(seq, src, b, pool_.Page(seq.local[b].page).data());
    }
  }
  if (seq.local_swa.has_value()) {
    CopySwaIn(seq, pool_.Page(seq.local_swa->page).data());
    seq.swa_loaded = true;
    seq.stats.swa_hit = true;
    hbm_->Touch(StateKind::kSwaState, seq.keys[seq.local_blocks]);
  }
  for (uint32_t b = seq.local_blocks; b > 0; --b) {
    hbm_->Touch(StateKind::kGlobalKv, seq.keys[b]);
  }
  ReleaseLocal(seq);
}

void Engine::ReleaseLocal(Sequence& seq) {
  for (const PrefixCache::Hit& hit : seq.local) pool_.Unref(hit.page);
  seq.local.clear();
  if (seq.local_swa.has_value()) pool_.Unref(seq.local_swa->page);
  seq.local_swa.reset();
}

// Group `source` of the payload of prefix block `block` -> the contiguous
// entries the model reads.
void Engine::CopyGroupIn(Sequence& seq, uint32_t source, uint32_t block, const std::byte* payload) {
  const ModelConfig& c = model_.config;
  const uint32_t per_block = c.block_tokens / c.sources[source].stride;
  const std::byte* g = payload + group_offset_[source];
  std::memcpy(&seq.state.main[source][uint64_t{block} * per_block * kMainBytes], g,
              uint64_t{per_block} * kMainBytes);
  std::memcpy(&seq.state.index[source][uint64_t{block} * per_block * kIndexBytes],
              g + uint64_t{per_block} * kMainBytes, uint64_t{per_block} * kIndexBytes);
}

// An SWA payload's encoder rings -> the sequence's. Decoder rings are
// rebuilt by decoder bounded replay; only the encoder's carry over.
void Engine::CopySwaIn(Sequence& seq, const std::byte* payload) {
  const ModelConfig& c = model_.config;
  const uint64_t ring_bytes = uint64_t{c.ring_slots} * kSlotBytes;
  for (uint32_t l = 0; l < c.Layers(); ++l) {
    if (c.IsDecoder(l)) continue;
    std::memcpy(seq.state.rings[l].data(), payload + swa_layout_.HeaderBytes() + l * ring_bytes,
                ring_bytes);
  }
}

// Loads the HBM tier's blocks and starts the transfer of the store's (and
// the SWA state, when planned) into `buffers`; the prefill resumes at the
// boundary of all `usable` blocks.
void Engine::StartFetch(Sequence& seq, uint32_t usable, std::vector<std::span<std::byte>> buffers) {
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  const uint32_t remote = usable - seq.local_blocks;
  const int64_t boundary = int64_t{usable} * bt;
  for (uint32_t s = 0; s < c.sources.size(); ++s) {
    seq.state.Reserve(s, static_cast<uint64_t>(boundary) / c.sources[s].stride);
  }
  seq.cursor = boundary;
  seq.stats.hit_tokens = static_cast<uint64_t>(boundary);
  seq.stats.hbm_hit_tokens = uint64_t{seq.local_blocks} * bt;
  seq.stats.ssd_hit_tokens = 0;
  for (uint32_t b = 0; b < remote; ++b) {
    if (seq.match.blocks[b].tier == Tier::kSsd) seq.stats.ssd_hit_tokens += bt;
  }
  seq.swa_loaded = false;
  LoadLocalPrefix(seq);
  if (remote > 0) {
    FetchRequest fr;
    fr.block_buffers = std::move(buffers);
    if (seq.fetch_swa) {
      seq.swa_buffer.assign(swa_layout_.PayloadBytes(), std::byte{0});
      fr.swa_buffer = seq.swa_buffer;
    }
    // The transfer holds its own reference on each page it writes.
    for (uint32_t p : seq.fetch_pages) pool_.Ref(p);
    seq.group_loaded.assign(c.sources.size(), false);
    seq.fetch_health_epoch = store_health_->epoch();
    seq.fetch = std::make_unique<FetchJob>(*options_.store, seq.match, std::move(fr),
                                           static_cast<uint32_t>(c.sources.size()));
  }
  if (!seq.fetch_swa) PlanEncoderReplay(seq);
}

// The store's blocks (and SWA state) a fetch brought, verified: into the
// HBM tier, so the next request over this prefix finds them here.
void Engine::CacheFetched(Sequence& seq) {
  if (hbm_ == nullptr || !seq.fetch) return;
  const uint32_t local = seq.local_blocks;
  for (uint32_t b = 0; b < seq.fetch_pages.size(); ++b) {
    const uint32_t block = local + b;
    const std::optional<ChainKey> parent =
        block > 0 ? std::optional<ChainKey>(seq.keys[block]) : std::nullopt;
    hbm_->Insert(StateKind::kGlobalKv, seq.keys[block + 1], parent, seq.fetch_pages[b],
                 seq.match.blocks[b].checksum);
  }
  if (!seq.fetch_swa || !seq.swa_loaded || seq.swa_buffer.empty()) return;
  Result<uint32_t> page = AllocatePage();
  if (!page.ok()) return;
  std::memcpy(pool_.Page(*page).data(), seq.swa_buffer.data(), seq.swa_buffer.size());
  hbm_->Insert(StateKind::kSwaState, seq.keys[seq.fetch_blocks], std::nullopt, *page,
               seq.swa_checksum);
  pool_.Unref(*page);
}

// The SWA state planned (the store's or the HBM tier's), paired with the
// lineage of the blocks under it.
uint64_t Engine::StaleSwaKey(const Sequence& seq) {
  return ExtendLineage(seq.lineage, seq.swa_checksum);
}

bool Engine::ReplayedOftenEnough(const Sequence& seq, uint32_t boundary_blocks) {
  if (options_.exact_after_replays == 0) return false;
  const uint64_t prefix = seq.keys[boundary_blocks].Prefix64();
  auto [it, inserted] = replays_.try_emplace(prefix, 0);
  uint32_t& count = it->second;  // stays valid: only the oldest other key can go
  if (inserted) RememberNewest(replays_, replays_order_, prefix, kReplayedPrefixes);
  if (count < options_.exact_after_replays) {
    ++count;
    return false;
  }
  count = 0;
  return true;
}

// The way back to the exact path (EngineOptions::exact_after_replays): this
// run computes the prefix from token 0, so its rings are exact and the SWA
// state it commits lets the requests after it skip the replay. The blocks
// matched are in the store: not committed again, but sealed, for the
// lineage the SWA state carries.
void Engine::ComputeExactly(Sequence& seq, uint32_t stored_blocks) {
  ReleaseLocal(seq);
  ReleaseFetch(seq);
  seq.fetch_blocks = 0;
  seq.local_blocks = 0;
  seq.stored_upto = 0;
  seq.committed_upto = std::max<uint64_t>(seq.committed_upto, stored_blocks);
  seq.lineage = 0;
  seq.lineage_blocks = 0;
  seq.stats.hit_tokens = 0;
  seq.stats.hbm_hit_tokens = 0;
  seq.stats.ssd_hit_tokens = 0;
  seq.stats.exact_recompute = true;
}

// Encoder bounded replay: the last W tokens before the hit boundary rebuild
// the rings; local keys before them are invisible from now on.
void Engine::PlanEncoderReplay(Sequence& seq) {
  const int64_t boundary = int64_t{seq.fetch_blocks} * model_.config.block_tokens;
  seq.replay_begin = std::max<int64_t>(0, boundary - model_.config.window);
  seq.state.encoder_replay_start = seq.replay_begin;
  seq.stats.replayed_tokens = static_cast<uint64_t>(boundary - seq.replay_begin);
}

// Waits for what layer `layer` reads; false when the fetch failed under it.
bool Engine::BeforeLayer(Sequence& seq, uint32_t layer) {
  if (!seq.fetch) return true;
  const uint32_t src = model_.config.layers[layer].source;
  const uint32_t remote = seq.fetch_blocks - seq.local_blocks;
  if (!seq.group_loaded[src]) {
    if (seq.fetch->WaitGroup(src) < remote) {
      seq.fetch_failed = true;
      return false;
    }
    for (uint32_t b = 0; b < remote; ++b) {
      CopyGroupIn(seq, src, seq.local_blocks + b, pool_.Page(seq.fetch_pages[b]).data());
    }
    seq.group_loaded[src] = true;
  }
  if (seq.fetch_swa && !seq.swa_loaded) {
    if (!seq.fetch->WaitSwa()) {
      seq.fetch_failed = true;
      return false;
    }
    // Verified bytes, but maybe over other global KV than the store now
    // holds under these keys (another run's, say after a replay): then the
    // rings are rebuilt by replay instead. Nothing of the item has run yet.
    uint64_t lineage = 0;
    std::memcpy(&lineage, seq.swa_buffer.data() + swa_lineage_offset_, sizeof(lineage));
    if (lineage != seq.lineage) {
      seq.swa_stale = true;
      return false;
    }
    CopySwaIn(seq, seq.swa_buffer.data());
    seq.swa_loaded = true;
    seq.stats.swa_hit = true;
  }
  return true;
}

}  // namespace strata::worker

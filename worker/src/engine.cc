#include "strata/worker/engine.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "engine_internal.h"
#include "engine_metrics.h"
#include "kv_transfer.h"
#include "store_health.h"
#include "strata/kernels/formats.h"
#include "strata/worker/tokenizer.h"

namespace strata::worker {
namespace {

// key[0]'s namespace with no store: the keys are never sent anywhere.
constexpr std::string_view kNoStoreNamespace = "local";

constexpr uint32_t kMainBytes = kernels::kMainKv.Bytes();
constexpr uint32_t kIndexBytes = kernels::kIndexerKey.Bytes();
constexpr uint32_t kSlotBytes = kernels::kSwaFp8.Bytes();
constexpr uint32_t kEntryBytes = kMainBytes + kIndexBytes;

// Pool pages a fetch leaves free for commit staging (a commit takes one page
// and gives it back at once): fetches of waiting requests never starve the
// commits of running ones.
constexpr uint32_t kStagingPages = 2;
uint32_t StagingPages(const BlockPool& pool) {
  return std::min(kStagingPages, pool.capacity() / 4);
}

// The lineage of a prefix (SwaShape::lineage): each global KV block's entry
// checksum chained onto the digest of the blocks before it. An SWA state
// carries the lineage of the blocks it was computed over, so it is paired
// only with those exact bytes.
uint64_t ExtendLineage(uint64_t lineage, uint64_t block_checksum) {
  const uint64_t words[2] = {lineage, block_checksum};
  return Checksum64(std::as_bytes(std::span(words)));
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const ModelWeights& model, EngineOptions options) {
  STRATA_RETURN_IF_ERROR(model.config.Validate());
  // The revision is what tells models apart in the store: without it two
  // different models would share (and be served) each other's state.
  if (options.store != nullptr && options.weights_revision.empty()) {
    return InvalidArgument(
        "engine: weights_revision is empty; name the weights (WeightsRevisionOfFile for a file)");
  }
  const ModelConfig& c = model.config;
  // The model's sources must be the store's V4.1 global-KV layout, group
  // for group, and its rings the V4.1 SWA layout.
  const Layout global = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  if (global.groups.size() != c.sources.size() || global.block_tokens != c.block_tokens) {
    return InvalidArgument("engine: model sources do not match the store's global-KV layout 1");
  }
  for (size_t s = 0; s < c.sources.size(); ++s) {
    if (global.groups[s].name != c.sources[s].name ||
        global.groups[s].bytes != uint64_t{c.block_tokens} / c.sources[s].stride * kEntryBytes) {
      return InvalidArgument("engine: source '" + c.sources[s].name +
                             "' does not match layout group '" + global.groups[s].name + "'");
    }
  }
  if (c.Layers() != SwaShape{}.layers || c.window != SwaShape{}.window ||
      c.ring_slots != SwaShape{}.Slots()) {
    return InvalidArgument("engine: model rings do not match the store's SWA layout 2");
  }
  if (options.keep_tokens == 0) return InvalidArgument("engine: keep_tokens must be positive");
  if (options.max_batch_tokens == 0) {
    return InvalidArgument("engine: max_batch_tokens must be positive");
  }
  if (options.pool_pages == 0) return InvalidArgument("engine: pool_pages must be positive");
  if (options.max_running == 0) return InvalidArgument("engine: max_running must be positive");
  // Options every match would be refused for (and every request recomputed).
  if (Status s = CheckMatchOptions(c.block_tokens, options.lease_ttl, 0); !s.ok()) {
    return InvalidArgument("engine: " + s.message());
  }
  // Keys no prompt could be matched under, while commits went on writing
  // entries nothing reads.
  if (Status s =
          ValidateChainInputs({std::string(kNoStoreNamespace), ModelId{}, options.chain_extra});
      !s.ok()) {
    return InvalidArgument("engine: " + s.message());
  }
  if (options.store_backoff <= 0 || options.store_backoff > options.store_max_backoff ||
      options.store_max_backoff > kMaxStoreBackoff) {
    return InvalidArgument(
        "engine: store back-off must be 0 < store_backoff <= "
        "store_max_backoff <= 1 h");
  }
  return std::unique_ptr<Engine>(new Engine(model, std::move(options)));
}

Engine::Engine(const ModelWeights& model, EngineOptions options)
    : model_(model),
      options_(std::move(options)),
      global_layout_(MakeGlobalKvLayout(kV41GlobalKvLayoutId)),
      swa_layout_(MakeSwaLayout(kV41SwaLayoutId)),
      pool_(std::max(global_layout_.PayloadBytes(), swa_layout_.PayloadBytes()),
            options_.pool_pages) {
  const uint32_t threads = options_.kernel_threads != 0
                               ? options_.kernel_threads
                               : std::max(1u, std::thread::hardware_concurrency());
  if (threads > 1) kernel_pool_ = std::make_unique<TaskPool>(threads - 1);
  store_health_ = std::make_unique<StoreHealth>(
      options_.store_clock != nullptr ? *options_.store_clock : clock_, options_.store_backoff,
      options_.store_max_backoff);
  ModelFingerprint fp;
  fp.weights_revision = options_.weights_revision;
  fp.tokenizer_version = ByteTokenizer::kVersion;
  fp.chat_template_version = "none";
  fp.kv_layout_version = kV41KvLayoutVersion;
  fp.precision = kV41Precision;
  model_id_ = fp.Id();
  uint64_t off = global_layout_.HeaderBytes();
  for (const LayerGroup& g : global_layout_.groups) {
    group_offset_.push_back(off);
    off += g.bytes;
  }
  swa_lineage_offset_ = swa_layout_.PayloadBytes() - kSwaLineageBytes;  // the last group
  if (options_.metrics != nullptr) metrics_ = std::make_unique<EngineMetrics>(*options_.metrics);
}

Engine::~Engine() {
  for (auto& [id, seq] : seqs_) Release(*seq);
  for (const std::unique_ptr<AbandonedFetch>& fetch : abandoned_) EndFetch(*fetch);
}

const std::string* Engine::ChainNamespace() {
  if (!chain_namespace_.empty()) return &chain_namespace_;
  if (options_.store == nullptr || !store_health_->Usable()) return nullptr;
  Result<std::string> ns = options_.store->CallerNamespace();
  store_health_->Record(ns.status(), StoreHealth::Path::kControl);
  if (!ns.ok() || ns->empty()) return nullptr;
  chain_namespace_ = std::move(ns).value();
  return &chain_namespace_;
}

Status Engine::AddRequest(Request request) {
  ReapAbandonedFetches(/*wait=*/false);
  if (request.prompt.empty())
    return InvalidArgument("request " + std::to_string(request.id) + ": empty prompt");
  if (request.prompt.size() > kMaxPromptTokens) {
    return InvalidArgument("request " + std::to_string(request.id) + ": prompt too long");
  }
  for (uint32_t t : request.prompt) {
    if (t >= model_.config.vocab) {
      return InvalidArgument("request " + std::to_string(request.id) + ": token " +
                             std::to_string(t) + " outside the vocabulary");
    }
  }
  if (request.max_new_tokens == 0) {
    return InvalidArgument("request " + std::to_string(request.id) + ": max_new_tokens is 0");
  }
  if (seqs_.count(request.id)) {
    return AlreadyExists("request " + std::to_string(request.id) + " already exists");
  }
  auto seq = std::make_unique<Sequence>();
  seq->arrival = clock_.Now();
  seq->tokens = request.prompt;
  seq->stats.prompt_tokens = request.prompt.size();
  seq->use_store = options_.store != nullptr;
  seq->req = std::move(request);
  order_.push_back(seq->req.id);
  seqs_.emplace(seq->req.id, std::move(seq));
  if (metrics_) metrics_->SetLoad(Counters());
  return Status::Ok();
}

uint32_t Engine::FetchRoom() const {
  const uint32_t free_pages = pool_.capacity() - pool_.used_pages();
  const uint32_t staging = StagingPages(pool_);
  return free_pages > staging ? free_pages - staging : 0;
}

// Plans a request: decoder start, chain keys, match, fetch, replay. With
// `may_defer`, a fetch that does not fit in the pool now (but would in an
// empty one) leaves the request queued, its lease released: running requests
// free their fetch pages after their first chunk. False when deferred.
bool Engine::Admit(Sequence& seq, bool may_defer) {
  StartPrefill(seq);
  DeriveChainKeys(seq);
  const std::optional<uint32_t> matched = MatchPrefix(seq);
  if (!matched.has_value()) return true;
  uint32_t usable = *matched;
  const uint32_t room = FetchRoom();
  const uint32_t ever = pool_.capacity() - StagingPages(pool_);  // in an empty pool
  if (may_defer && usable > room && usable <= ever) {
    seq.deferred_pages = usable;
    seq.stats.matched_tokens = 0;  // the match is let go; the next admission matches again
    ReleaseFetch(seq);
    seq.phase = Phase::kQueued;
    return false;
  }
  seq.deferred_pages = 0;
  // Pages for the fetched blocks; a full pool fetches a shorter prefix.
  usable = std::min(usable, room);
  std::vector<std::span<std::byte>> buffers;
  usable = TakeFetchPages(seq, usable, buffers);
  if (usable == 0) {
    ReleaseFetch(seq);
    return true;
  }
  if (!PlanFetch(seq, usable)) return true;  // computed exactly instead
  StartFetch(seq, usable, std::move(buffers));
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

// Matches the prompt's blocks in the store, taking a lease: the blocks of
// the match this engine can read (maybe none), or nullopt when no match was
// made (no store reads, nothing before the decoder start, the store out of
// reach or failing).
std::optional<uint32_t> Engine::MatchPrefix(Sequence& seq) {
  const uint32_t bt = model_.config.block_tokens;
  // Only blocks before the decoder start are useful (the decoder needs the
  // encoder's output from there on), so only they are matched: the store
  // then reports the SWA state at the deepest boundary we can resume from.
  const size_t wanted =
      std::min<size_t>(seq.keys.size() - 1, static_cast<size_t>(seq.state.decoder_start / bt));
  if (!seq.use_store || !options_.use_store_reads || wanted == 0) return std::nullopt;
  if (!store_health_->Usable()) {
    ++seq.stats.store_skipped;
    return std::nullopt;
  }
  MatchKeysRequest mr;
  mr.model_id = model_id_;
  mr.root = seq.keys[0];
  mr.keys = std::span<const ChainKey>(seq.keys).subspan(1, wanted);
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
  seq.stats.matched_tokens = seq.match.hit_tokens();
  uint32_t usable = std::min<uint32_t>(static_cast<uint32_t>(seq.match.blocks.size()),
                                       static_cast<uint32_t>(seq.state.decoder_start / bt));
  for (uint32_t b = 0; b < usable; ++b) {
    if (seq.match.blocks[b].layout_id != kV41GlobalKvLayoutId ||
        seq.match.blocks[b].payload_bytes != global_layout_.PayloadBytes()) {
      usable = b;  // another layout: not ours to read
      break;
    }
  }
  return usable;
}

// A pool page for each of the first `usable` blocks, its buffer into
// `buffers`; returns how many blocks got one.
uint32_t Engine::TakeFetchPages(Sequence& seq, uint32_t usable,
                                std::vector<std::span<std::byte>>& buffers) {
  for (uint32_t b = 0; b < usable; ++b) {
    Result<uint32_t> page = pool_.Allocate();
    if (!page.ok()) {
      usable = b;
      break;
    }
    seq.fetch_pages.push_back(*page);
    buffers.push_back(pool_.Page(*page).first(global_layout_.PayloadBytes()));
  }
  return usable;
}

// The fetched prefix's lineage, and whether the SWA state at its boundary
// comes with it (the exact path) or the encoder replays. False when the
// prefix is computed from token 0 instead (ComputeExactly): nothing to fetch.
bool Engine::PlanFetch(Sequence& seq, uint32_t usable) {
  seq.fetch_blocks = usable;
  seq.stored_upto = usable;
  for (uint32_t b = 0; b < usable; ++b) {
    seq.lineage = ExtendLineage(seq.lineage, seq.match.blocks[b].checksum);
  }
  seq.lineage_blocks = usable;
  seq.fetch_swa = seq.match.swa.has_value() && seq.match.swa->boundary_blocks == usable &&
                  seq.match.swa->entry.layout_id == kV41SwaLayoutId &&
                  seq.match.swa->entry.payload_bytes == swa_layout_.PayloadBytes();
  if (seq.fetch_swa && stale_swa_.contains(StaleSwaKey(seq))) {
    seq.fetch_swa = false;  // rejected before over these very blocks: not worth the transfer
    seq.stats.swa_rejected = true;
  }
  if (!seq.fetch_swa && ReplayedOftenEnough(seq, usable)) {
    ComputeExactly(seq, usable);
    return false;
  }
  return true;
}

// Starts the transfer of `usable` blocks (and the SWA state, when planned)
// into `buffers`; the prefill resumes at their boundary.
void Engine::StartFetch(Sequence& seq, uint32_t usable, std::vector<std::span<std::byte>> buffers) {
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  FetchRequest fr;
  fr.block_buffers = std::move(buffers);
  if (seq.fetch_swa) {
    seq.swa_buffer.assign(swa_layout_.PayloadBytes(), std::byte{0});
    fr.swa_buffer = seq.swa_buffer;
  }
  // The transfer holds its own reference on each page it writes.
  for (uint32_t p : seq.fetch_pages) pool_.Ref(p);
  seq.group_loaded.assign(c.sources.size(), false);
  seq.swa_loaded = false;
  seq.fetch_health_epoch = store_health_->epoch();
  seq.fetch = std::make_unique<FetchJob>(*options_.store, seq.match, std::move(fr),
                                         static_cast<uint32_t>(c.sources.size()));

  const int64_t boundary = int64_t{usable} * bt;
  for (uint32_t s = 0; s < c.sources.size(); ++s) {
    seq.state.Reserve(s, static_cast<uint64_t>(boundary) / c.sources[s].stride);
  }
  seq.cursor = boundary;
  seq.stats.hit_tokens = static_cast<uint64_t>(boundary);
  if (!seq.fetch_swa) PlanEncoderReplay(seq);
}

// The SWA state the match reported, paired with the lineage of the blocks
// under it.
uint64_t Engine::StaleSwaKey(const Sequence& seq) {
  return ExtendLineage(seq.lineage, seq.match.swa->entry.checksum);
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
  ReleaseFetch(seq);
  seq.fetch_blocks = 0;
  seq.stored_upto = 0;
  seq.committed_upto = std::max<uint64_t>(seq.committed_upto, stored_blocks);
  seq.lineage = 0;
  seq.lineage_blocks = 0;
  seq.stats.hit_tokens = 0;
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
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  const uint32_t src = c.layers[layer].source;
  if (!seq.group_loaded[src]) {
    if (seq.fetch->WaitGroup(src) < seq.fetch_blocks) {
      seq.fetch_failed = true;
      return false;
    }
    // Group `src` of every block -> the contiguous entries the model reads.
    const uint32_t per_block = bt / c.sources[src].stride;
    for (uint32_t b = 0; b < seq.fetch_blocks; ++b) {
      const std::byte* g = pool_.Page(seq.fetch_pages[b]).data() + group_offset_[src];
      std::memcpy(&seq.state.main[src][uint64_t{b} * per_block * kMainBytes], g,
                  uint64_t{per_block} * kMainBytes);
      std::memcpy(&seq.state.index[src][uint64_t{b} * per_block * kIndexBytes],
                  g + uint64_t{per_block} * kMainBytes, uint64_t{per_block} * kIndexBytes);
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
    const uint64_t ring_bytes = uint64_t{c.ring_slots} * kSlotBytes;
    for (uint32_t l = 0; l < c.Layers(); ++l) {
      // Decoder rings are rebuilt by decoder bounded replay; only the
      // encoder's carry over.
      if (c.IsDecoder(l)) continue;
      std::memcpy(seq.state.rings[l].data(),
                  seq.swa_buffer.data() + swa_layout_.HeaderBytes() + l * ring_bytes, ring_bytes);
    }
    seq.swa_loaded = true;
    seq.stats.swa_hit = true;
  }
  return true;
}

void Engine::ReleaseFetch(Sequence& seq, bool wait) {
  if (seq.fetch) {
    // A transfer still running keeps what it holds until it ends: a request
    // that lets go of it (an abort) never waits for a stalled one. A restart
    // after a failed fetch waits (at most the client's deadline), so that
    // the failure backs the store off before the recompute commits to it.
    abandoned_.reserve(abandoned_.size() + 1);
    auto fetch = std::make_unique<AbandonedFetch>();
    fetch->job = std::move(seq.fetch);
    fetch->pages = seq.fetch_pages;
    fetch->swa_buffer = std::move(seq.swa_buffer);
    fetch->lease = std::exchange(seq.match.lease, 0);
    fetch->health_epoch = seq.fetch_health_epoch;
    if (wait || fetch->job->Done()) {
      EndFetch(*fetch);
    } else {
      abandoned_.push_back(std::move(fetch));
    }
  }
  for (uint32_t p : seq.fetch_pages) pool_.Unref(p);
  seq.fetch_pages.clear();
  seq.swa_buffer.clear();
  seq.swa_buffer.shrink_to_fit();
  if (seq.match.lease != 0 && options_.store != nullptr) {
    options_.store->Release(seq.match.lease);  // no round trip; expiry covers a failure
    seq.match.lease = 0;
  }
}

void Engine::EndFetch(AbandonedFetch& fetch) {
  // Every fetch ends here, finished or given up: one that timed out or
  // lost the node backs the store off like a failed match or commit; one
  // that got an answer, even an error, shows the data path works. Unless
  // a failure was recorded since it started (see StoreHealth).
  const FetchOutcome out = fetch.job->Finish();
  store_health_->Record(out.status, StoreHealth::Path::kData, fetch.health_epoch);
  fetch.job.reset();
  for (uint32_t p : fetch.pages) pool_.Unref(p);  // the transfer's references
  fetch.pages.clear();
  if (fetch.lease != 0 && options_.store != nullptr) {
    options_.store->Release(fetch.lease);  // no round trip; expiry covers a failure
    fetch.lease = 0;
  }
}

void Engine::ReapAbandonedFetches(bool wait) {
  const size_t before = abandoned_.size();
  std::erase_if(abandoned_, [&](const std::unique_ptr<AbandonedFetch>& fetch) {
    if (!wait && !fetch->job->Done()) return false;
    EndFetch(*fetch);
    return true;
  });
  if (metrics_ && abandoned_.size() != before) metrics_->SetLoad(Counters());
}

void Engine::WaitForAbandonedFetches() { ReapAbandonedFetches(/*wait=*/true); }

void Engine::Restart(Sequence& seq, const std::string& /*why*/) {
  ++seq.stats.store_errors;
  seq.stats.recomputed_tokens += seq.stats.hit_tokens;
  seq.stats.hit_tokens = 0;
  seq.stats.replayed_tokens = 0;
  seq.stats.swa_hit = false;
  seq.stats.swa_rejected = false;
  ReleaseFetch(seq, /*wait=*/true);
  seq.fetch_blocks = 0;
  seq.fetch_swa = false;
  seq.fetch_failed = false;
  seq.use_store = false;  // reads: the exact path is full recomputation now
  seq.tokens.resize(seq.req.prompt.size());
  (void)Admit(seq, /*may_defer=*/false);      // nothing to fetch
  seq.use_store = options_.store != nullptr;  // commits still go to the store
}

void Engine::CommitBlock(Sequence& seq, uint32_t block) {
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  while (seq.keys.size() < block + 2) {
    const size_t i = seq.keys.size() - 1;  // derive key[i+1] from block i
    seq.keys.push_back(ChainKeys::Next(seq.keys.back(),
                                       std::span<const uint32_t>(seq.tokens).subspan(i * bt, bt)));
  }
  if (!seq.use_store) return;
  // Sealed even when it is not committed (the store out of reach, or the
  // block committed before a restart): the SWA states after it need its
  // checksum in their lineage.
  std::optional<uint32_t> page;
  const std::span<std::byte> payload = StageCommit(global_layout_.PayloadBytes(), &page);
  for (uint32_t s = 0; s < c.sources.size(); ++s) {
    const uint32_t per_block = bt / c.sources[s].stride;
    std::byte* g = payload.data() + group_offset_[s];
    std::memcpy(g, &seq.state.main[s][uint64_t{block} * per_block * kMainBytes],
                uint64_t{per_block} * kMainBytes);
    std::memcpy(g + uint64_t{per_block} * kMainBytes,
                &seq.state.index[s][uint64_t{block} * per_block * kIndexBytes],
                uint64_t{per_block} * kIndexBytes);
  }
  Result<uint64_t> checksum = SealPayload(global_layout_, bt, payload);
  if (checksum.ok() && block == seq.lineage_blocks) {
    seq.lineage = ExtendLineage(seq.lineage, *checksum);
    ++seq.lineage_blocks;
  }
  bool commit = checksum.ok() && block >= seq.committed_upto;
  if (commit && !store_health_->Usable()) {
    ++seq.stats.store_skipped;
    commit = false;
  }
  if (commit) {
    CommitPayload cp;
    cp.block = {seq.keys[block + 1], StateKind::kGlobalKv, kV41GlobalKvLayoutId, payload.size(),
                std::nullopt};
    if (block > 0) cp.block.parent = seq.keys[block];
    cp.bytes = payload;
    cp.checksum = *checksum;
    Result<PublishResult> r = options_.store->Commit(model_id_, std::span(&cp, 1));
    store_health_->Record(r.status(), StoreHealth::Path::kData);
    if (r.ok() && r->blocks.size() == 1 && r->blocks[0].ok()) {
      ++seq.stats.committed_blocks;
      seq.committed_upto = block + 1;
    } else {
      ++seq.stats.store_errors;  // a full store or a missing parent: not cached, nothing lost
    }
  }
  if (block == seq.stored_upto && block < seq.committed_upto) ++seq.stored_upto;
  if (page.has_value()) pool_.Unref(*page);
}

std::span<std::byte> Engine::StageCommit(uint64_t bytes, std::optional<uint32_t>* page) {
  if (Result<uint32_t> p = pool_.Allocate(); p.ok()) {
    *page = *p;
    return pool_.Page(*p).first(bytes);
  }
  page->reset();
  commit_scratch_.resize(std::max<size_t>(commit_scratch_.size(), bytes));
  return std::span<std::byte>(commit_scratch_).first(bytes);
}

void Engine::CommitSwa(Sequence& seq, uint32_t boundary_blocks) {
  const ModelConfig& c = model_.config;
  if (!seq.use_store || boundary_blocks == 0 || seq.keys.size() <= boundary_blocks) return;
  // Only state that descends from an exact prefix is worth sharing: after
  // an encoder bounded replay the rings are approximate.
  if (seq.state.encoder_replay_start != 0) return;
  if (seq.lineage_blocks != boundary_blocks) return;  // a block before it was never sealed
  if (seq.stored_upto < boundary_blocks) return;      // nor over a block the store refused
  if (!store_health_->Usable()) {
    ++seq.stats.store_skipped;
    return;
  }
  std::optional<uint32_t> page;
  const std::span<std::byte> payload = StageCommit(swa_layout_.PayloadBytes(), &page);
  const uint64_t ring_bytes = uint64_t{c.ring_slots} * kSlotBytes;
  for (uint32_t l = 0; l < c.Layers(); ++l) {
    std::memcpy(payload.data() + swa_layout_.HeaderBytes() + l * ring_bytes,
                seq.state.rings[l].data(), ring_bytes);
  }
  std::memcpy(payload.data() + swa_lineage_offset_, &seq.lineage, sizeof(seq.lineage));
  const uint32_t live = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{boundary_blocks} * c.block_tokens, c.ring_slots));
  Result<uint64_t> checksum = SealPayload(swa_layout_, live, payload);
  if (checksum.ok()) {
    CommitPayload cp;
    cp.block = {seq.keys[boundary_blocks], StateKind::kSwaState, kV41SwaLayoutId, payload.size(),
                std::nullopt};
    cp.bytes = payload;
    cp.checksum = *checksum;
    Result<PublishResult> r = options_.store->Commit(model_id_, std::span(&cp, 1));
    store_health_->Record(r.status(), StoreHealth::Path::kData);
    if (r.ok() && r->blocks.size() == 1 && r->blocks[0].ok()) {
      ++seq.stats.committed_swa;
    } else {
      ++seq.stats.store_errors;
    }
  }
  if (page.has_value()) pool_.Unref(*page);
}

// After tokens up to `end` are written: commit a completed block, and the
// SWA state at the prompt's last boundary or any boundary crossed in decode.
void Engine::AfterChunk(Sequence& seq, int64_t end) {
  const uint32_t bt = model_.config.block_tokens;
  seq.cursor = end;
  if (end % bt != 0) return;
  const uint32_t block = static_cast<uint32_t>(end / bt) - 1;
  CommitBlock(seq, block);
  const int64_t prompt = static_cast<int64_t>(seq.req.prompt.size());
  // SWA state where a later request can continue exactly: the prompt's
  // last boundary, the decoder start (a rerun of the same prompt resumes
  // there), and every boundary crossed in decode (the next turn's prefix).
  const bool last_prompt_boundary = end == prompt / bt * bt;
  if (last_prompt_boundary || end == seq.state.decoder_start || end > prompt ||
      options_.swa_every_block) {
    CommitSwa(seq, block + 1);
  }
}

void Engine::Release(Sequence& seq) { ReleaseFetch(seq); }

StepOutput Engine::Finish(Sequence& seq, bool aborted) {
  Release(seq);
  StepOutput out;
  out.id = seq.req.id;
  out.finished = true;
  out.aborted = aborted;
  out.output_tokens = seq.generated;
  seq.stats.total_s = SecondsBetween(seq.arrival, clock_.Now());
  out.stats = seq.stats;
  seq.done = true;
  if (metrics_) metrics_->OnFinish(seq.stats, aborted);
  return out;
}

Status Engine::AbortRequest(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->done) {
    return NotFound("request " + std::to_string(id) + " is not running");
  }
  (void)Finish(*it->second, /*aborted=*/true);
  seqs_.erase(it);
  std::erase(order_, id);
  if (metrics_) metrics_->SetLoad(Counters());
  return Status::Ok();
}

std::vector<StepOutput> Engine::Drain() {
  std::vector<StepOutput> all;
  while (!Idle()) {
    std::vector<StepOutput> step = Step();
    for (StepOutput& o : step) all.push_back(std::move(o));
  }
  return all;
}

bool Engine::Idle() const { return order_.empty(); }

EngineCounters Engine::Counters() const {
  EngineCounters c;
  c.pool_pages_used = pool_.used_pages();
  c.pool_refs = pool_.total_refs();
  c.last_step_prefill_tokens = last_step_prefill_tokens_;
  for (const auto& [id, seq] : seqs_) {
    c.live_fetches += seq->fetch != nullptr;
    c.held_leases += seq->match.lease != 0;
    c.running += seq->phase != Phase::kQueued;
    c.queued += seq->phase == Phase::kQueued;
  }
  for (const std::unique_ptr<AbandonedFetch>& fetch : abandoned_) {
    ++c.live_fetches;
    c.held_leases += fetch->lease != 0;
  }
  return c;
}

}  // namespace strata::worker

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
  std::unique_ptr<Engine> engine(new Engine(model, std::move(options)));
  if (!engine->options_.hbm_cache_policy.empty()) {
    Result<std::unique_ptr<PrefixCache>> hbm =
        PrefixCache::Create(engine->pool_, engine->options_.hbm_cache_policy);
    if (!hbm.ok()) return InvalidArgument("engine: HBM tier: " + hbm.status().message());
    engine->hbm_ = std::move(hbm).value();
  }
  return engine;
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
  seq.stats.hbm_hit_tokens = 0;
  seq.stats.ssd_hit_tokens = 0;
  seq.stats.replayed_tokens = 0;
  seq.stats.swa_hit = false;
  seq.stats.swa_rejected = false;
  ReleaseFetch(seq, /*wait=*/true);
  seq.fetch_blocks = 0;
  seq.local_blocks = 0;
  seq.fetch_swa = false;
  seq.fetch_failed = false;
  seq.no_reads = true;  // the exact path is full recomputation now
  seq.tokens.resize(seq.req.prompt.size());
  (void)Admit(seq, /*may_defer=*/false);  // nothing to load or fetch
  seq.no_reads = false;
}

void Engine::CommitBlock(Sequence& seq, uint32_t block) {
  const ModelConfig& c = model_.config;
  const uint32_t bt = c.block_tokens;
  while (seq.keys.size() < block + 2) {
    const size_t i = seq.keys.size() - 1;  // derive key[i+1] from block i
    seq.keys.push_back(ChainKeys::Next(seq.keys.back(),
                                       std::span<const uint32_t>(seq.tokens).subspan(i * bt, bt)));
  }
  if (!seq.use_store && hbm_ == nullptr) return;
  // Sealed even when it is not committed (the store out of reach, or the
  // block committed before a restart): the SWA states after it need its
  // checksum in their lineage, and the HBM tier keeps it.
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
  bool commit = seq.use_store && checksum.ok() && block >= seq.committed_upto;
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
  if (page.has_value()) {
    if (checksum.ok() && hbm_ != nullptr) {
      hbm_->Insert(StateKind::kGlobalKv, seq.keys[block + 1],
                   block > 0 ? std::optional<ChainKey>(seq.keys[block]) : std::nullopt, *page,
                   *checksum);
    }
    pool_.Unref(*page);
  }
}

std::span<std::byte> Engine::StageCommit(uint64_t bytes, std::optional<uint32_t>* page) {
  if (Result<uint32_t> p = AllocatePage(); p.ok()) {
    *page = *p;
    return pool_.Page(*p).first(bytes);
  }
  page->reset();
  commit_scratch_.resize(std::max<size_t>(commit_scratch_.size(), bytes));
  return std::span<std::byte>(commit_scratch_).first(bytes);
}

void Engine::CommitSwa(Sequence& seq, uint32_t boundary_blocks) {
  const ModelConfig& c = model_.config;
  if (boundary_blocks == 0 || seq.keys.size() <= boundary_blocks) return;
  // Only state that descends from an exact prefix is worth sharing: after
  // an encoder bounded replay the rings are approximate.
  if (seq.state.encoder_replay_start != 0) return;
  if (seq.lineage_blocks != boundary_blocks) return;  // a block before it was never sealed
  // Not over a block the store refused (no match could reach it).
  bool to_store = seq.use_store && seq.stored_upto >= boundary_blocks;
  if (to_store && !store_health_->Usable()) {
    ++seq.stats.store_skipped;
    to_store = false;
  }
  if (!to_store && hbm_ == nullptr) return;
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
  if (checksum.ok() && to_store) {
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
  if (page.has_value()) {
    if (checksum.ok() && hbm_ != nullptr) {
      hbm_->Insert(StateKind::kSwaState, seq.keys[boundary_blocks], std::nullopt, *page, *checksum);
    }
    pool_.Unref(*page);
  }
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

void Engine::Release(Sequence& seq) {
  ReleaseLocal(seq);
  ReleaseFetch(seq);
}

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
  c.hbm_cached_pages = hbm_ != nullptr ? hbm_->pages() : 0;
  c.hbm_evictions = hbm_ != nullptr ? hbm_->evictions() : 0;
  c.pool_pages_held = c.pool_pages_used - (hbm_ != nullptr ? hbm_->EvictablePages() : 0);
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

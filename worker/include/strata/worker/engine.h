// The engine loop (DESIGN §9): continuous batching of chunked prefill and
// decode over the mini V4.1 model, with the store in the request path:
//
//   match -> fetch (pipelined by layer group) -> encoder bounded replay if
//   the SWA state is missing -> prefill of the uncached suffix (decoder on
//   the last keep_tokens only) -> commit each completed block and the SWA
//   state -> decode, committing blocks as they fill.
//
// Any store failure (fetch error, checksum mismatch, node gone, a full
// store on commit) degrades to recomputation; where the exact path was
// planned (SWA state hit) the output is the cold run's, bit for bit.
//
// Single-threaded: AddRequest, Step, AbortRequest and Drain are called from
// one thread; fetches run on their own threads. Everything a step returns
// is a copy: no pooled page or state escapes it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "strata/chain_key.h"
#include "strata/clock.h"
#include "strata/status.h"
#include "strata/store.h"
#include "strata/task_pool.h"
#include "strata/worker/block_pool.h"
#include "strata/worker/model.h"
#include "strata/worker/prefix_cache.h"
#include "strata/worker/sampler.h"

namespace strata {
class MetricsRegistry;  // strata/metrics.h
}

namespace strata::worker {

constexpr Nanos kMaxStoreBackoff = 3600 * kNanosPerSecond;

struct EngineOptions {
  Store* store = nullptr;        // null: no cache, every token computed
  std::string weights_revision;  // feeds the model fingerprint: WeightsRevisionOfFile for a file
  // key[0]'s namespace is the store's: Store::CallerNamespace(), what its
  // credentials name (a key under any other namespace would never match).
  std::string chain_extra;          // feeds key[0] (LoRA id, cache salt)
  uint32_t keep_tokens = 140;       // decoder bounded replay
  uint32_t max_batch_tokens = 512;  // prefill and replay tokens per step, over all requests
  uint32_t max_running = 256;       // requests admitted at once; the rest queue
  uint32_t pool_pages = 256;        // block pool pages (one store block each)
  Nanos lease_ttl = Seconds(30);
  // A store found out of reach (UNAVAILABLE, DEADLINE_EXCEEDED) is left
  // alone, every token computed, for store_backoff, doubling up to
  // store_max_backoff while it stays so: one slow store must not stall
  // every request for a client timeout per call.
  Nanos store_backoff = Seconds(1);
  Nanos store_max_backoff = Seconds(30);  // at most kMaxStoreBackoff
  const Clock* store_clock = nullptr;     // for the back-off; null: the steady clock
  bool swa_every_block = false;           // commit SWA state at every boundary (more DRAM, exact
                                          // resumption from any cached prefix)
  bool use_store_reads = true;            // false: commit only (a cold run that fills the store)
  // The way back to the exact path. A request that finds a prefix's global
  // KV but no usable SWA state replays, and replays commit no SWA state, so
  // every later request over that prefix would replay too. After this many
  // replays over one prefix, the next request computes it from token 0
  // (exact) and commits its SWA state; 0: never.
  uint32_t exact_after_replays = 3;
  // The HBM tier (PrefixCache): pages of finished work stay in the block
  // pool under their chain keys, ordered by this store eviction policy
  // ("lru", "aslru", "deadline"); a request matches them before the store.
  // Empty: off, a page is free once no request holds it.
  std::string hbm_cache_policy = "lru";
  bool masked_attention = false;  // the bounded-replay reference kernel
  bool return_logits = false;     // copy each sampled token's logits into the output
  // Threads for the long-context indexer scans, this one included;
  // 0 = one per hardware thread.
  uint32_t kernel_threads = 0;
  MetricsRegistry* metrics = nullptr;  // strata_worker_* metrics go here; null: none
};

struct Request {
  uint64_t id = 0;
  std::vector<uint32_t> prompt;
  uint32_t max_new_tokens = 16;
  SamplingParams sampling;
};

struct RequestStats {
  uint64_t prompt_tokens = 0;
  uint64_t matched_tokens = 0;     // global KV the store reported
  uint64_t hit_tokens = 0;         // global KV fetched and used, from any tier:
  uint64_t hbm_hit_tokens = 0;     //   of those, from the HBM tier (this worker's pool)
  uint64_t ssd_hit_tokens = 0;     //   from the store's SSD tier (the rest: its DRAM)
  bool swa_hit = false;            // SWA state fetched and used (exact path)
  bool swa_rejected = false;       // SWA state found, but over other global KV: replayed
  uint64_t replayed_tokens = 0;    // encoder bounded replay
  uint64_t computed_tokens = 0;    // prompt tokens prefilled (incl. after a fallback)
  uint64_t recomputed_tokens = 0;  // planned hits recomputed after a store failure
  bool exact_recompute = false;    // its prefix was replayed too often: computed exactly instead
  uint64_t committed_blocks = 0;   // GLOBAL_KV blocks published (or already present)
  uint64_t committed_swa = 0;
  uint64_t store_errors = 0;
  uint64_t store_skipped = 0;  // matches and commits not tried: the store was out of reach
  double ttft_s = 0;
  double total_s = 0;
};

struct StepOutput {
  uint64_t id = 0;
  std::vector<uint32_t> new_tokens;
  std::vector<std::vector<float>> logits;  // per new token, with return_logits
  bool finished = false;
  bool aborted = false;
  std::vector<uint32_t> output_tokens;  // all generated tokens, when finished
  RequestStats stats;                   // final when finished
};

struct EngineCounters {
  uint32_t pool_pages_used = 0;
  uint32_t hbm_cached_pages = 0;  // pages in the HBM tier (some may be in use too)
  uint32_t pool_pages_held = 0;   // pages requests and transfers hold (not the HBM tier alone)
  uint64_t hbm_evictions = 0;     // pages the HBM tier gave back to the pool, ever
  uint64_t pool_refs = 0;
  uint32_t live_fetches = 0;  // abandoned ones included
  uint32_t held_leases = 0;   // those of abandoned fetches included
  uint32_t running = 0;
  uint32_t queued = 0;
  // Prefill and replay tokens the last Step ran (at most max_batch_tokens).
  uint32_t last_step_prefill_tokens = 0;
};

class StoreHealth;
class EngineMetrics;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const ModelWeights& model, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Status AddRequest(Request request);
  // One batch: every decoding request advances one token, prefilling ones
  // one chunk (chunks end at block boundaries), within max_batch_tokens.
  std::vector<StepOutput> Step();
  // Ends a request at any stage and returns its pages and leases.
  Status AbortRequest(uint64_t id);
  // Steps until every request has finished; returns all outputs in order.
  std::vector<StepOutput> Drain();
  // Waits for the transfers that aborted requests left running (AbortRequest
  // never waits for one) and returns their pages and leases. Step and
  // AddRequest return those of the ended ones on their own (an idle engine
  // keeps them until then); the destructor waits.
  void WaitForAbandonedFetches();

  bool Idle() const;
  EngineCounters Counters() const;
  const ModelId& model_id() const { return model_id_; }

  struct Sequence;

 private:
  Engine(const ModelWeights& model, EngineOptions options);

  // One step (engine_step.cc): Schedule -> ForwardBatch -> Postprocess.
  struct Admission {
    std::vector<bool> admitted_now;  // by position in order_
    bool other_work = false;         // requests were running before it
  };
  struct Batch {  // one item per request that runs, with its request
    std::vector<ForwardItem> items;
    std::vector<Sequence*> owners;
    std::vector<bool> is_replay;
  };
  Batch Schedule();
  Admission AdmitQueued();
  void BatchDecodes(Batch& batch);
  void BatchPrefills(const Admission& admission, Batch& batch);
  std::vector<std::vector<float>> ForwardBatch(Batch& batch);
  std::vector<StepOutput> Postprocess(const Batch& batch,
                                      const std::vector<std::vector<float>>& logits);
  void RejectStaleSwa(Sequence& seq);
  bool FetchFailed(Sequence& seq, bool replay);
  StepOutput SampleNext(Sequence& seq, const ForwardItem& item, int64_t end,
                        const std::vector<float>& logits);
  void ForgetFinished();

  // Admit's steps: decoder start, chain keys, match, fetch (pages, plan,
  // transfer), replay.
  bool Admit(Sequence& seq, bool may_defer);
  void StartPrefill(Sequence& seq);
  void DeriveChainKeys(Sequence& seq);
  uint32_t WantedBlocks(const Sequence& seq) const;
  uint32_t MatchLocal(Sequence& seq, uint32_t wanted);
  std::optional<uint32_t> MatchPrefix(Sequence& seq, uint32_t from, uint32_t wanted);
  uint32_t TakeFetchPages(Sequence& seq, uint32_t usable,
                          std::vector<std::span<std::byte>>& buffers);
  bool PlanFetch(Sequence& seq, uint32_t local, uint32_t remote);
  bool PlanSwa(Sequence& seq, uint32_t local, uint32_t remote);
  void LoadLocalPrefix(Sequence& seq);
  void ReleaseLocal(Sequence& seq);
  void StartFetch(Sequence& seq, uint32_t usable, std::vector<std::span<std::byte>> buffers);
  void CopyGroupIn(Sequence& seq, uint32_t source, uint32_t block, const std::byte* payload);
  void CopySwaIn(Sequence& seq, const std::byte* payload);
  void CacheFetched(Sequence& seq);
  // A pool page, evicting from the HBM tier when none is free.
  Result<uint32_t> AllocatePage();

  void PlanEncoderReplay(Sequence& seq);
  // Counts a replay over the prefix of `boundary_blocks` blocks; true when
  // it has had exact_after_replays already (the count starts over).
  bool ReplayedOftenEnough(const Sequence& seq, uint32_t boundary_blocks);
  // Lets go of what Admit planned to fetch: the prompt is computed from
  // token 0 (its blocks are in the store already).
  void ComputeExactly(Sequence& seq, uint32_t stored_blocks);
  static uint64_t StaleSwaKey(const Sequence& seq);
  uint32_t FetchRoom() const;  // pool pages a new fetch may take now
  void Restart(Sequence& seq, const std::string& why);
  bool BeforeLayer(Sequence& seq, uint32_t layer);
  void AfterChunk(Sequence& seq, int64_t end);
  void CommitBlock(Sequence& seq, uint32_t block);
  void CommitSwa(Sequence& seq, uint32_t boundary_blocks);
  // Where a commit's payload of `bytes` is sealed: a pool page when one is
  // free (*page set; Unref it after), else commit_scratch_ (commits run one
  // at a time, synchronously).
  std::span<std::byte> StageCommit(uint64_t bytes, std::optional<uint32_t>* page);
  void ReleaseFetch(Sequence& seq, bool wait = false);
  struct AbandonedFetch;
  void EndFetch(AbandonedFetch& fetch);
  void ReapAbandonedFetches(bool wait);
  void Release(Sequence& seq);
  StepOutput Finish(Sequence& seq, bool aborted);

  // The namespace key[0] is derived under: the store's caller namespace,
  // asked for until it is known (a cluster may have no node up yet); a
  // request admitted before then does without the store.
  const std::string* ChainNamespace();

  const ModelWeights& model_;
  EngineOptions options_;
  ModelId model_id_;
  std::string chain_namespace_;  // empty until ChainNamespace() learns it
  Layout global_layout_, swa_layout_;
  std::vector<uint64_t> group_offset_;     // per source: offset of its group in a payload
  uint64_t swa_lineage_offset_ = 0;        // of the SWA payload's lineage group
  std::vector<std::byte> commit_scratch_;  // commit staging when the pool has no page free
  // SWA states found to belong to other global KV than the blocks under
  // them (StaleSwaKey): a request meeting the same pair again replays
  // without fetching the state. The oldest are forgotten first.
  std::unordered_set<uint64_t> stale_swa_;
  std::deque<uint64_t> stale_swa_order_;
  // Replays per prefix (its hit boundary's key), for exact_after_replays.
  std::unordered_map<uint64_t, uint32_t> replays_;
  std::deque<uint64_t> replays_order_;
  BlockPool pool_;
  std::unique_ptr<PrefixCache> hbm_;       // after pool_: destroyed first (it holds pages)
  std::unique_ptr<TaskPool> kernel_pool_;  // null with one kernel thread
  std::map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<uint64_t> order_;  // arrival order
  // Transfers still running for requests that let go of them, with what
  // they write into and their leases (see WaitForAbandonedFetches).
  std::vector<std::unique_ptr<AbandonedFetch>> abandoned_;
  uint32_t last_step_prefill_tokens_ = 0;
  SteadyClock clock_;
  std::unique_ptr<StoreHealth> store_health_;
  std::unique_ptr<EngineMetrics> metrics_;  // null without EngineOptions::metrics
};

}  // namespace strata::worker

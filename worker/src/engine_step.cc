// One step of the engine loop: schedule (admission, then the batch) ->
// forward -> postprocess (fetches ended or failed, replays advanced, blocks
// committed, tokens sampled).
#include <algorithm>
#include <utility>

#include "engine_internal.h"
#include "engine_metrics.h"
#include "kv_transfer.h"

namespace strata::worker {

std::vector<StepOutput> Engine::Step() {
  ReapAbandonedFetches(/*wait=*/false);
  Batch batch = Schedule();
  if (batch.items.empty()) {
    if (metrics_) metrics_->SetLoad(Counters());
    return {};
  }
  const std::vector<std::vector<float>> logits = ForwardBatch(batch);
  std::vector<StepOutput> outputs = Postprocess(batch, logits);
  ForgetFinished();
  if (metrics_) metrics_->SetLoad(Counters());
  return outputs;
}

Engine::Batch Engine::Schedule() {
  const Admission admission = AdmitQueued();
  // Build the batch: decodes first (one token each), then prefill chunks.
  Batch batch;
  BatchDecodes(batch);
  BatchPrefills(admission, batch);
  return batch;
}

// Admission in arrival order, up to max_running requests at once. A
// request admitted now starts its fetch and joins the next step, its
// transfer overlapping this step's compute, unless there is nothing else to
// run. A request whose fetch must wait for pool pages holds back those
// behind it (first come, first served).
Engine::Admission Engine::AdmitQueued() {
  Admission admission;
  std::vector<bool>& admitted_now = admission.admitted_now;
  admitted_now.assign(order_.size(), false);
  uint32_t running = 0;
  for (uint64_t id : order_) running += seqs_.at(id)->phase != Phase::kQueued ? 1 : 0;
  admission.other_work = running > 0;
  bool busy = admission.other_work;
  for (size_t k = 0; k < order_.size() && running < options_.max_running; ++k) {
    Sequence& seq = *seqs_.at(order_[k]);
    if (seq.phase != Phase::kQueued) continue;
    // Still no room for the fetch it was deferred for: no new match yet.
    if (busy && seq.deferred_pages > FetchRoom()) break;
    if (!Admit(seq, /*may_defer=*/busy)) break;
    admitted_now[k] = true;
    busy = true;
    ++running;
  }
  return admission;
}

void Engine::BatchDecodes(Batch& batch) {
  for (uint64_t id : order_) {
    Sequence& seq = *seqs_.at(id);
    if (seq.phase != Phase::kDecode) continue;
    ForwardItem item;
    item.seq = &seq.state;
    item.begin = seq.cursor;
    item.tokens = std::span<const uint32_t>(seq.tokens).subspan(static_cast<size_t>(seq.cursor), 1);
    item.want_logits = true;
    batch.items.push_back(item);
    batch.owners.push_back(&seq);
    batch.is_replay.push_back(false);
  }
}

// Prefill chunks end at block boundaries; all of them together stay within
// max_batch_tokens.
void Engine::BatchPrefills(const Admission& admission, Batch& batch) {
  const std::vector<bool>& admitted_now = admission.admitted_now;
  const bool other_work = admission.other_work;
  uint32_t budget = options_.max_batch_tokens;
  uint32_t prefill_tokens = 0;
  const uint32_t bt = model_.config.block_tokens;
  for (size_t k = 0; k < order_.size(); ++k) {
    Sequence& seq = *seqs_.at(order_[k]);
    if (seq.phase != Phase::kPrefill || budget == 0) continue;
    if (admitted_now[k] && other_work && seq.fetch) continue;
    ForwardItem item;
    item.seq = &seq.state;
    const int64_t prompt = static_cast<int64_t>(seq.req.prompt.size());
    if (seq.replay_begin >= 0) {
      // The replay runs in chunks within the budget, like any prefill.
      item.begin = seq.replay_begin;
      item.tokens =
          std::span<const uint32_t>(seq.tokens)
              .subspan(
                  static_cast<size_t>(seq.replay_begin),
                  static_cast<size_t>(std::min(seq.cursor - seq.replay_begin, int64_t{budget})));
      item.write_global = false;
      item.run_decoder = false;
      batch.is_replay.push_back(true);
    } else {
      const int64_t block_end = (seq.cursor / bt + 1) * bt;
      const int64_t end = std::min({prompt, block_end, seq.cursor + int64_t{budget}});
      item.begin = seq.cursor;
      item.tokens =
          std::span<const uint32_t>(seq.tokens)
              .subspan(static_cast<size_t>(seq.cursor), static_cast<size_t>(end - seq.cursor));
      item.want_logits = end == prompt;
      batch.is_replay.push_back(false);
    }
    budget -= std::min<uint32_t>(budget, static_cast<uint32_t>(item.tokens.size()));
    prefill_tokens += static_cast<uint32_t>(item.tokens.size());
    batch.items.push_back(item);
    batch.owners.push_back(&seq);
  }
  last_step_prefill_tokens_ = prefill_tokens;
}

std::vector<std::vector<float>> Engine::ForwardBatch(Batch& batch) {
  ForwardHooks hooks;
  hooks.before_layer = [&](uint32_t layer, size_t i) {
    return BeforeLayer(*batch.owners[i], layer);
  };
  ForwardOptions fopt;
  fopt.masked_attention = options_.masked_attention;
  fopt.pool = kernel_pool_.get();
  std::vector<std::vector<float>> logits;
  Forward(model_, batch.items, hooks, fopt, logits);
  return logits;
}

std::vector<StepOutput> Engine::Postprocess(const Batch& batch,
                                            const std::vector<std::vector<float>>& logits) {
  std::vector<StepOutput> outputs;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    Sequence& seq = *batch.owners[i];
    if (seq.swa_stale) {
      RejectStaleSwa(seq);
      continue;
    }
    if (FetchFailed(seq, batch.is_replay[i])) {
      Restart(seq, "fetch failed");
      continue;
    }
    const ForwardItem& item = batch.items[i];
    if (batch.is_replay[i]) {
      seq.replay_begin += static_cast<int64_t>(item.tokens.size());
      if (seq.replay_begin == seq.cursor) seq.replay_begin = -1;  // rings rebuilt; the suffix next
      continue;
    }
    const int64_t end = item.begin + static_cast<int64_t>(item.tokens.size());
    AfterChunk(seq, end);
    if (!item.want_logits) {
      seq.stats.computed_tokens += item.tokens.size();
      continue;
    }
    outputs.push_back(SampleNext(seq, item, end, logits[i]));
  }
  return outputs;
}

// The fetched SWA state descends from other global KV: remembered, and the
// rings rebuilt by replay instead.
void Engine::RejectStaleSwa(Sequence& seq) {
  seq.swa_stale = false;
  seq.fetch_swa = false;
  seq.stats.swa_rejected = true;
  const uint64_t pair = StaleSwaKey(seq);
  if (stale_swa_.insert(pair).second) {
    RememberNewest(stale_swa_, stale_swa_order_, pair, kStaleSwaPairs);
  }
  PlanEncoderReplay(seq);  // runs next step, on the fetched global KV
}

// Whether the fetch under `seq` failed (then it is recomputed). Once the
// decoder has run, every layer group has been read: the fetch ends here.
bool Engine::FetchFailed(Sequence& seq, bool replay) {
  bool failed = seq.fetch_failed;
  if (!failed && seq.fetch && !replay) {
    // Every layer group has been read once the decoder ran: the transfer
    // is over; a failure anywhere in it means recomputing.
    const bool all_loaded =
        std::all_of(seq.group_loaded.begin(), seq.group_loaded.end(), [](bool b) { return b; });
    if (all_loaded) {
      const FetchOutcome out = seq.fetch->Finish();
      failed = out.blocks_ready < seq.fetch_blocks - seq.local_blocks ||
               (seq.fetch_swa && !out.swa_ready);
      if (!failed && metrics_)
        metrics_->OnFetch(seq.fetch->FirstGroupSeconds(), seq.fetch->Seconds());
      if (!failed) {
        CacheFetched(seq);
        ReleaseFetch(seq);
      }
    }
  }
  if (!failed && seq.fetch && replay) {
    // A replay that lost its global KV mid-way shows as missing groups.
    for (uint32_t l = 0; l < model_.config.encoder_layers && !failed; ++l) {
      failed = !seq.group_loaded[model_.config.layers[l].source];
    }
  }
  return failed;
}

// The token sampled from the item's logits: the first ends the prefill, the
// last finishes the request.
StepOutput Engine::SampleNext(Sequence& seq, const ForwardItem& item, int64_t end,
                              const std::vector<float>& logits) {
  if (seq.phase == Phase::kPrefill) seq.stats.computed_tokens += item.tokens.size();
  const uint32_t token = Sample(logits, seq.req.sampling, end);
  StepOutput out;
  out.id = seq.req.id;
  out.new_tokens.push_back(token);
  if (options_.return_logits) out.logits.push_back(logits);
  if (!seq.first_token_out) {
    seq.first_token_out = true;
    seq.stats.ttft_s = SecondsBetween(seq.arrival, clock_.Now());
    if (metrics_) metrics_->OnFirstToken(seq.stats.ttft_s);
  }
  seq.generated.push_back(token);
  seq.tokens.push_back(token);
  seq.phase = Phase::kDecode;
  if (seq.generated.size() >= seq.req.max_new_tokens) {
    StepOutput fin = Finish(seq, /*aborted=*/false);
    fin.new_tokens = std::move(out.new_tokens);
    fin.logits = std::move(out.logits);
    return fin;
  }
  return out;
}

// Forget finished requests.
void Engine::ForgetFinished() {
  std::erase_if(order_, [&](uint64_t id) {
    auto it = seqs_.find(id);
    if (it->second->done) {
      seqs_.erase(it);
      return true;
    }
    return false;
  });
}

}  // namespace strata::worker

#include "worker_bench.h"

#include <cstdio>
#include <map>

#include "bench_util.h"
#include "strata/cache_store.h"
#include "strata/client.h"
#include "strata/worker/engine.h"
#include "strata/worker/model.h"

namespace strata::bench {
namespace {

using worker::Engine;
using worker::EngineOptions;
using worker::ModelWeights;

std::vector<uint32_t> Tokens(size_t n, uint64_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 2654435761u + 7;
  for (uint32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint32_t>((x >> 33) % 256);
  }
  return t;
}

struct Run {
  double ttft_ms = 0;
  double decode_tokens_per_s = 0;
  worker::RequestStats stats;
};

struct Bench {
  const ModelWeights& model;

  // kernel_threads: EngineOptions::kernel_threads (0 = the default).
  Result<Run> RunPrompt(Store* store, const std::vector<uint32_t>& prompt, uint32_t max_new,
                        uint32_t kernel_threads = 0) {
    EngineOptions o;
    o.store = store;
    o.kernel_threads = kernel_threads;
    o.weights_revision = "bench";
    o.swa_every_block = true;  // the cold run leaves SWA state at every boundary
    o.pool_pages = 512;
    Result<std::unique_ptr<Engine>> engine = Engine::Create(model, o);
    if (!engine.ok()) return engine.status();
    worker::Request r;
    r.id = 1;
    r.prompt = prompt;
    r.max_new_tokens = max_new;
    STRATA_RETURN_IF_ERROR((*engine)->AddRequest(r));
    Run run;
    double first = 0;
    const double start = NowSeconds();
    while (!(*engine)->Idle()) {
      for (const worker::StepOutput& out : (*engine)->Step()) {
        if (!out.new_tokens.empty() && first == 0) first = NowSeconds();
        if (out.finished) run.stats = out.stats;
      }
    }
    const double end = NowSeconds();
    run.ttft_ms = (first - start) * 1e3;
    if (max_new > 1) run.decode_tokens_per_s = (max_new - 1) / (end - first);
    return run;
  }
};

Result<std::shared_ptr<CacheStore>> NewStore() {
  CacheStoreOptions o;
  o.dram.capacity_bytes = 4ull << 30;
  o.swa_ttl = Hours(1);
  Result<std::unique_ptr<CacheStore>> s = CacheStore::Open(o);
  if (!s.ok()) return s.status();
  return std::shared_ptr<CacheStore>(std::move(s).value());
}

}  // namespace

int RunWorkerBench(const WorkerBenchOptions& opt) {
  Result<ModelWeights> model = worker::ModelFromFile(worker::RandomModelFile(
      opt.tiny ? worker::TinyModelConfig() : worker::DefaultModelConfig(), 1));
  if (!model.ok()) {
    std::fprintf(stderr, "worker bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  Bench bench{*model};
  Table table;
  JsonObject json;
  json.Add("model", opt.tiny ? "tiny" : "default");
  json.Add("hit", opt.hit);
  std::map<uint32_t, std::pair<std::shared_ptr<CacheStore>, std::vector<uint32_t>>> cold_stores;
  double decode_tps = 0;
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "worker bench: %s\n", st.ToString().c_str());
    return 1;
  };
  for (uint32_t len : opt.lengths) {
    std::fprintf(stderr, "worker bench: %u tokens, cold then warm...\n", len);
    Result<std::shared_ptr<CacheStore>> cache = NewStore();
    if (!cache.ok()) return fail(cache.status());
    ClientOptions co;
    co.inproc_store = *cache;
    Result<std::unique_ptr<Store>> store = OpenStore("inproc://", co);
    if (!store.ok()) return fail(store.status());
    const std::vector<uint32_t> prompt = Tokens(len, len);
    // Cold: nothing cached; the run commits every block and SWA state.
    Result<Run> cold = bench.RunPrompt(store->get(), prompt, 1);
    if (!cold.ok()) return fail(cold.status());
    // Warm: the first `hit` of the prompt is shared, the rest is new.
    const uint32_t shared = static_cast<uint32_t>(len * opt.hit) / 256 * 256;
    std::vector<uint32_t> warm_prompt(prompt.begin(), prompt.begin() + shared);
    const std::vector<uint32_t> tail = Tokens(len - shared, len + 1);
    warm_prompt.insert(warm_prompt.end(), tail.begin(), tail.end());
    Result<Run> warm = bench.RunPrompt(store->get(), warm_prompt, opt.decode_tokens);
    if (!warm.ok()) return fail(warm.status());
    if (decode_tps == 0) decode_tps = warm->decode_tokens_per_s;
    const std::string k = std::to_string(len / 1024) + "k";
    table.Add("TTFT cold " + k, Fixed(cold->ttft_ms, 1) + " ms",
              std::to_string(cold->stats.computed_tokens) + " tokens computed");
    table.Add("TTFT warm " + k, Fixed(warm->ttft_ms, 1) + " ms",
              Fixed(warm->ttft_ms / cold->ttft_ms, 3) + "x cold; hit " +
                  std::to_string(warm->stats.hit_tokens) + (warm->stats.swa_hit ? " + SWA" : ""));
    json.Add("ttft_cold_ms_" + std::to_string(len), cold->ttft_ms);
    json.Add("ttft_warm_ms_" + std::to_string(len), warm->ttft_ms);
    json.Add("warm_over_cold_" + std::to_string(len), warm->ttft_ms / cold->ttft_ms);
    json.Add("hit_tokens_" + std::to_string(len), static_cast<double>(warm->stats.hit_tokens));
    cold_stores[len] = {*cache, prompt};
  }
  // SWA missing: the same uncached suffix after 8K and 32K of cached
  // context; the SWA state at the boundary is deleted, so the encoder
  // replays its last W tokens.
  std::map<uint32_t, double> miss, miss_single;
  for (uint32_t ctx : {8192u, 32768u}) {
    auto it = cold_stores.find(ctx);
    if (it == cold_stores.end()) continue;
    auto& [cache, prompt] = it->second;
    const uint32_t cached = (ctx - opt.swa_miss_suffix) / 256 * 256;
    std::vector<uint32_t> p(prompt.begin(), prompt.begin() + cached);
    const std::vector<uint32_t> tail = Tokens(ctx - cached, ctx + 2);
    p.insert(p.end(), tail.begin(), tail.end());
    ClientOptions co;
    co.inproc_store = cache;
    Result<std::unique_ptr<Store>> store = OpenStore("inproc://", co);
    if (!store.ok()) return fail(store.status());
    EngineOptions eo;
    eo.weights_revision = "bench";
    Result<std::unique_ptr<Engine>> probe = Engine::Create(*model, eo);
    if (!probe.ok()) return fail(probe.status());
    Result<std::vector<ChainKey>> keys =
        ChainKeys::ForPrompt(ChainRoot{"default", (*probe)->model_id(), ""}, p, 256);
    if (!keys.ok()) return fail(keys.status());
    const Principal admin{"default", Role::kAdmin};
    std::fprintf(stderr, "worker bench: SWA state missing at %u tokens...\n", ctx);
    // Each run commits SWA state again: delete it before each.
    for (const ChainKey& key : *keys) (void)cache->Delete(admin, key, StateKind::kSwaState);
    Result<Run> r = bench.RunPrompt(store->get(), p, 1);
    if (!r.ok()) return fail(r.status());
    if (r->stats.swa_hit) return fail(Internal("SWA state was not missing"));
    miss[ctx] = r->ttft_ms;
    // The same with one kernel thread: the indexer's full scan, the part
    // that grows with the context, is the part kernel threads split.
    for (const ChainKey& key : *keys) (void)cache->Delete(admin, key, StateKind::kSwaState);
    Result<Run> single = bench.RunPrompt(store->get(), p, 1, 1);
    if (!single.ok()) return fail(single.status());
    if (single->stats.swa_hit) return fail(Internal("SWA state was not missing"));
    miss_single[ctx] = single->ttft_ms;
    table.Add("TTFT SWA miss " + std::to_string(ctx / 1024) + "k", Fixed(r->ttft_ms, 1) + " ms",
              "hit " + std::to_string(r->stats.hit_tokens) + ", replayed " +
                  std::to_string(r->stats.replayed_tokens) + ", computed " +
                  std::to_string(r->stats.computed_tokens));
    json.Add("swa_miss_ttft_" + std::to_string(ctx / 1024) + "k_ms", r->ttft_ms);
    json.Add("swa_miss_ttft_" + std::to_string(ctx / 1024) + "k_1thread_ms", single->ttft_ms);
  }
  if (miss.count(8192) && miss.count(32768)) {
    const double ratio = miss[32768] / miss[8192];
    table.Add("SWA miss 32k / 8k", Fixed(ratio, 3), "target <= 1.3 (bounded replay keeps it flat)");
    json.Add("swa_miss_32k_over_8k", ratio);
    const double single = miss_single[32768] / miss_single[8192];
    table.Add("SWA miss 32k / 8k, 1 thread", Fixed(single, 3),
              "kernel_threads = 1 (default: one per core)");
    json.Add("swa_miss_32k_over_8k_1thread", single);
  }
  table.Add("decode", Fixed(decode_tps, 1) + " tokens/s", "one request, after the first warm run");
  json.Add("decode_tokens_per_s", decode_tps);
  if (opt.json) {
    std::printf("%s\n", json.Dump().c_str());
  } else {
    table.Print("strata-bench worker (mini V4.1, CPU, in-process store)");
  }
  return 0;
}

}  // namespace strata::bench

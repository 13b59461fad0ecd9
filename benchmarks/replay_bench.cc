#include "replay_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "strata/trace/reference_policies.h"
#include "strata/trace/replay.h"
#include "strata/trace/trace.h"

namespace strata::bench {

int RunReplayBench(const ReplayBenchOptions& o) {
  auto loaded = trace::ReadTrace(o.trace);
  if (!loaded.ok()) {
    std::fprintf(stderr, "strata-bench replay: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::vector<trace::TraceRequest> requests = std::move(loaded).value();
  if (requests.empty()) {
    std::fprintf(stderr, "strata-bench replay: %s holds no request\n", o.trace.c_str());
    return 1;
  }
  if (o.max_requests > 0 && requests.size() > o.max_requests) requests.resize(o.max_requests);
  // Two tiers are inclusive (every block is written back), so the
  // references get the larger tier's capacity: the bound to compare with.
  const uint64_t reference_tokens = std::max(o.capacity_tokens, o.ssd_capacity_tokens);
  const uint64_t capacity_blocks = reference_tokens / trace::kTraceBlockTokens;
  std::fprintf(stderr,
               "strata-bench replay: %zu requests, %llu input tokens, capacity %llu tokens%s\n",
               requests.size(), static_cast<unsigned long long>(trace::InputTokens(requests)),
               static_cast<unsigned long long>(o.capacity_tokens),
               o.ssd_capacity_tokens > 0
                   ? (" (DRAM) + " + std::to_string(o.ssd_capacity_tokens) + " (SSD)").c_str()
                   : "");

  const bool remote = !o.node.empty();
  if (remote) {
    if (o.ssd_capacity_tokens > 0) {
      std::fprintf(stderr,
                   "strata-bench replay: --node replays under the node's own tiers; "
                   "drop --ssd-capacity-tokens\n");
      return 1;
    }
    // The node's configuration decides what is measured: say what matches
    // the in-process lines.
    std::fprintf(
        stderr,
        "strata-bench replay: against %s; a fresh node (what it holds carries over from run to "
        "run) should run with --set "
        "extra_layouts=\"%s\" --set dram_bytes=%llu --set high_watermark=1 --set "
        "low_watermark=1 --set max_held_share_per_namespace=1 --set eviction_policy=%s\n",
        o.node.c_str(), FormatLayoutSpec(trace::ReplayLayout(o.full_payload)).c_str(),
        static_cast<unsigned long long>(
            trace::ReplayNodeDramBytes(o.capacity_tokens, o.full_payload)),
        o.policy.c_str());
  }
  const std::string policy = remote ? "node" : o.policy;

  auto replay = [&](const std::string& store_policy, const std::string& ssd_policy,
                    const std::string& node) -> Result<trace::ReplayResult> {
    trace::ReplayOptions ro;
    ro.capacity_tokens = o.capacity_tokens;
    if (node.empty()) ro.policy = store_policy;
    ro.ssd_policy = ssd_policy;
    ro.full_payload = o.full_payload;
    ro.ssd_capacity_tokens = o.ssd_capacity_tokens;
    ro.ssd_dir = o.ssd_dir;
    ro.store_uri = node;
    ro.token = o.token;
    const std::string label = "replay (" + store_policy + ")";
    ro.progress = [label](size_t done, size_t total) { Progress(label.c_str(), done, total); };
    return trace::ReplayThroughStore(requests, ro);
  };
  auto tested = replay(policy, o.ssd_policy, o.node);
  if (!tested.ok()) {
    std::fprintf(stderr, "strata-bench replay: %s\n", tested.status().ToString().c_str());
    return 1;
  }
  // The same store with LRU validates the replay against the reference line.
  auto lru_store =
      !remote && o.policy == "lru" && (o.ssd_capacity_tokens == 0 || o.ssd_policy == "lru")
          ? tested
          : replay("lru", "lru", "");
  if (!lru_store.ok()) {
    std::fprintf(stderr, "strata-bench replay: %s\n", lru_store.status().ToString().c_str());
    return 1;
  }
  const trace::HitStats lru_ref = trace::SimulateLru(requests, capacity_blocks);
  const trace::HitStats belady = trace::SimulateBelady(requests, capacity_blocks);

  const trace::ReplayResult& r = *tested;
  // nan (null in JSON, "-" in the table), not 1e+12, when a reference hit nothing.
  const auto over = [](double x, double y) { return y > 0 ? x / y : std::nan(""); };
  const auto shown = [](double v, int digits) {
    return std::isfinite(v) ? Fixed(v, digits) : std::string("-");
  };
  if (o.json) {
    JsonObject j;
    j.Add("trace", o.trace);
    j.Add("requests", static_cast<double>(requests.size()));
    j.Add("capacity_tokens", static_cast<double>(o.capacity_tokens));
    j.Add("ssd_capacity_tokens", static_cast<double>(o.ssd_capacity_tokens));
    j.Add("reference_capacity_tokens", static_cast<double>(reference_tokens));
    j.Add("policy", policy);
    if (remote) j.Add("node", o.node);
    if (o.ssd_capacity_tokens > 0) j.Add("ssd_policy", o.ssd_policy);
    j.AddBool("full_payload", o.full_payload);
    j.Add("hit_ratio", r.hit_ratio());
    j.Add("lru_hit_ratio", lru_store->hit_ratio());
    j.Add("lru_reference_hit_ratio", lru_ref.ratio());
    j.Add("belady_hit_ratio", belady.ratio());
    j.Add("vs_lru", over(r.hit_ratio(), lru_store->hit_ratio()));
    j.Add("vs_belady", over(r.hit_ratio(), belady.ratio()));
    j.Add("ops_per_s", r.ops_per_s());
    j.Add("block_ops", static_cast<double>(r.block_ops));
    j.Add("evictions", static_cast<double>(r.evictions));
    j.Add("ssd_promotions", static_cast<double>(r.ssd_promotions));
    j.Add("ssd_evictions", static_cast<double>(r.ssd_evictions));
    j.Add("fetched_bytes", static_cast<double>(r.fetched_bytes));
    j.Add("committed_bytes", static_cast<double>(r.committed_bytes));
    j.Add("seconds", r.seconds);
    std::printf("%s\n", j.Dump().c_str());
    return 0;
  }
  Table t;
  t.Add("requests / capacity",
        std::to_string(requests.size()) + " / " + std::to_string(o.capacity_tokens) + " tokens",
        o.full_payload ? "full payload (890 B/token)" : "metadata only");
  if (o.ssd_capacity_tokens > 0) {
    t.Add("SSD tier", std::to_string(o.ssd_capacity_tokens) + " tokens, " + o.ssd_policy,
          "references at " + std::to_string(reference_tokens) + " tokens (tiers are inclusive)");
  }
  if (remote) t.Add("store", o.node, "a strata-node, under its own policy");
  t.Add("hit ratio, store + " + policy, Fixed(r.hit_ratio(), 4),
        "x" + shown(over(r.hit_ratio(), lru_store->hit_ratio()), 2) + " of LRU, " +
            shown(100 * over(r.hit_ratio(), belady.ratio()), 1) + "% of optimum");
  t.Add("hit ratio, store + lru", Fixed(lru_store->hit_ratio(), 4),
        o.ssd_capacity_tokens > 0 ? "both tiers lru"
        : remote                  ? "in-process, same capacity"
                                  : "the replay itself");
  t.Add("hit ratio, LRU reference", Fixed(lru_ref.ratio(), 4), "simulated from the trace alone");
  t.Add("hit ratio, Belady (offline optimum)", Fixed(belady.ratio(), 4), "");
  t.Add("block ops/s (" + policy + ")", Fixed(r.ops_per_s() / 1e6, 2) + " M",
        std::to_string(r.block_ops) + " lookups+inserts in " + Fixed(r.seconds, 2) + " s");
  if (remote) {
    t.Add("evictions", "-", "see the node's strata_evictions_total");
  } else {
    t.Add("evictions", std::to_string(r.evictions), o.ssd_capacity_tokens > 0 ? "DRAM" : "");
  }
  if (o.ssd_capacity_tokens > 0) {
    t.Add("SSD promotions / evictions",
          std::to_string(r.ssd_promotions) + " / " + std::to_string(r.ssd_evictions), "");
  }
  if (o.full_payload) {
    t.Add("bytes fetched / committed",
          Fixed(r.fetched_bytes / 1e9, 2) + " / " + Fixed(r.committed_bytes / 1e9, 2) + " GB", "");
  }
  t.Print("strata-bench replay");
  return 0;
}

}  // namespace strata::bench

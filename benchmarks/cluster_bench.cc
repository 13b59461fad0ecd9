// See cluster_bench.h.
#include "cluster_bench.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "bench_blocks.h"
#include "bench_util.h"
#include "cluster/cluster_store.h"
#include "node_process.h"
#include "strata/client.h"
#include "strata/layout.h"

namespace strata::bench {
namespace {

using testing::kTokenA;
using testing::NodeProcess;

// "strata://a,b,..." over the first `n` nodes; one node gives the plain
// node client (the baseline).
Result<std::unique_ptr<Store>> Connect(const std::vector<std::unique_ptr<NodeProcess>>& nodes,
                                       size_t n) {
  std::string uri = "strata://";
  for (size_t i = 0; i < n; ++i) uri += (i > 0 ? "," : "") + nodes[i]->target();
  ClientOptions co;
  co.token = kTokenA.token;
  co.replication_factor = 1;
  return OpenStore(uri, co);
}

// The cluster client over a one-node membership.
Result<std::unique_ptr<Store>> ConnectClusterOfOne(const NodeProcess& node) {
  ClientOptions co;
  co.token = kTokenA.token;
  co.replication_factor = 1;
  return OpenClusterStore(MakeStaticMembership({{node.target(), node.target(), false}}), co);
}

using Opener = std::function<Result<std::unique_ptr<Store>>()>;

// Clients loop match (with lease) -> fetch every block -> release; returns
// the aggregate GB/s over the timed window.
Result<double> MeasureFetch(const Opener& open, const ClusterBenchOptions& o,
                            const std::vector<std::vector<uint32_t>>& prompts) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> go{false}, stop{false}, failed{false};
  std::string error;
  std::mutex error_mu;
  std::vector<std::thread> clients;
  for (uint32_t c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      auto fail = [&](const Status& st) {
        std::lock_guard lock(error_mu);
        error = st.ToString();
        failed = true;
      };
      auto store = open();
      if (!store.ok()) return fail(store.status());
      const uint64_t payload = MakeGlobalKvLayout(kV41GlobalKvLayoutId).PayloadBytes();
      std::vector<std::vector<std::byte>> buffers(o.prompt_blocks, std::vector<std::byte>(payload));
      for (auto& b : buffers) std::memset(b.data(), 0, b.size());  // touch every page
      FetchRequest fetch;
      for (auto& b : buffers) fetch.block_buffers.emplace_back(b);
      for (uint64_t i = c; !stop.load(); ++i) {
        const bool counting = go.load();
        MatchRequest req;
        req.model_id = BenchModel();
        req.tokens = prompts[i % prompts.size()];
        req.want_swa = false;
        req.take_lease = true;
        auto m = (*store)->Match(req);
        if (!m.ok()) return fail(m.status());
        if (m->blocks.size() != o.prompt_blocks) {
          return fail(Internal("prompt " + std::to_string(i % prompts.size()) + ": " +
                               std::to_string(m->blocks.size()) + " of " +
                               std::to_string(o.prompt_blocks) + " blocks cached"));
        }
        fetch.match = &*m;
        const FetchOutcome out = (*store)->Fetch(fetch).Wait();
        (void)(*store)->Abort(m->lease);
        if (!out.status.ok()) return fail(out.status);
        if (counting) bytes += out.bytes;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm up
  const double start = NowSeconds();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  const uint64_t moved = bytes.load();
  const double elapsed = NowSeconds() - start;
  stop = true;
  for (auto& t : clients) t.join();
  if (failed) return Internal("fetch: " + error);
  return static_cast<double>(moved) / elapsed / 1e9;
}

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
};

// Match of the whole prompt, every block a hit, no lease (as the node
// bench measures it).
Result<Latency> MeasureMatch(Store& store, std::span<const uint32_t> tokens,
                             const ClusterBenchOptions& o) {
  MatchRequest req;
  req.model_id = BenchModel();
  req.tokens = tokens;
  const size_t blocks = tokens.size() / MakeGlobalKvLayout(kV41GlobalKvLayoutId).block_tokens;
  std::vector<double> us;
  for (uint32_t i = 0; i < o.match_iters + o.match_iters / 10; ++i) {
    const double t0 = NowSeconds();
    auto m = store.Match(req);
    const double t1 = NowSeconds();
    if (!m.ok()) return m.status();
    if (m->blocks.size() != blocks) {
      return Internal("match found " + std::to_string(m->blocks.size()) + " of " +
                      std::to_string(blocks) + " blocks");
    }
    if (i >= o.match_iters / 10) us.push_back((t1 - t0) * 1e6);  // the first tenth warms up
  }
  return Latency{Percentile(us, 0.5), Percentile(us, 0.99)};
}

}  // namespace

int RunClusterBench(const ClusterBenchOptions& o) {
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const uint64_t block_bytes = layout.PayloadBytes();
  const std::string dir = testing::TempDir("cluster-bench");
  auto fail = [&](const std::string& what, const Status& st) {
    std::fprintf(stderr, "strata-bench cluster: %s: %s\n", what.c_str(), st.ToString().c_str());
    std::filesystem::remove_all(dir);
    return 1;
  };

  std::fprintf(stderr, "strata-bench cluster: starting 3 nodes...\n");
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (int i = 0; i < 3; ++i) {
    std::string error;
    NodeProcess::Options no;
    no.settings = {"dram_bytes=1GiB"};
    auto node = NodeProcess::Start(dir, no, &error);
    if (node == nullptr) return fail("strata-node", Unavailable(error));
    nodes.push_back(std::move(node));
  }

  // The blocks every phase serves.
  std::vector<SealedBlock> blocks;
  for (uint64_t b = 0; b < uint64_t{o.prompts} * o.prompt_blocks; ++b) {
    blocks.push_back(MakeBlock(layout, 1000 + b));
  }
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < o.prompts; ++p) {
    prompts.push_back(RandomTokens(size_t{o.prompt_blocks} * layout.block_tokens, 500 + p));
  }
  const SealedBlock match_block = MakeBlock(layout, 7);
  const std::vector<uint32_t> match_tokens = RandomTokens(o.match_tokens, 99);

  // Fetch throughput over 1, 2 and 3 nodes; each phase commits the prompts
  // into its own cluster first (blocks a smaller cluster placed elsewhere
  // are written where this one places them).
  double fetch_gbps[4] = {0, 0, 0, 0};
  Latency match[4];
  Latency single;
  for (size_t n = 1; n <= 3; ++n) {
    std::fprintf(stderr, "strata-bench cluster: %zu node(s): commit, fetch...\n", n);
    const Opener open = [&] { return n == 1 ? ConnectClusterOfOne(*nodes[0]) : Connect(nodes, n); };
    {
      auto store = open();
      if (!store.ok()) return fail("connect", store.status());
      for (uint32_t p = 0; p < o.prompts; ++p) {
        Status st = CommitPrompt(**store, prompts[p], [&](size_t b) -> const SealedBlock& {
          return blocks[p * o.prompt_blocks + b];
        });
        if (!st.ok()) return fail("commit", st);
      }
      if (n != 2) {
        Status st = CommitPrompt(**store, match_tokens,
                                 [&](size_t) -> const SealedBlock& { return match_block; });
        if (!st.ok()) return fail("commit", st);
      }
    }
    auto gbps = MeasureFetch(open, o, prompts);
    if (!gbps.ok()) return fail("fetch", gbps.status());
    fetch_gbps[n] = *gbps;
    if (n == 2) continue;
    std::fprintf(stderr, "strata-bench cluster: %zu node(s): match latency, %u tokens...\n", n,
                 o.match_tokens);
    auto store = open();
    if (!store.ok()) return fail("connect", store.status());
    auto lat = MeasureMatch(**store, match_tokens, o);
    if (!lat.ok()) return fail("match", lat.status());
    match[n] = *lat;
    if (n == 1) {
      // The baseline: the plain node client, no cluster layer.
      auto plain = Connect(nodes, 1);
      if (!plain.ok()) return fail("connect", plain.status());
      auto base = MeasureMatch(**plain, match_tokens, o);
      if (!base.ok()) return fail("match", base.status());
      single = *base;
    }
  }
  for (auto& node : nodes) node->Terminate();
  std::filesystem::remove_all(dir);

  const double ratio = match[3].p99_us / match[1].p99_us;
  Table table;
  for (size_t n = 1; n <= 3; ++n) {
    table.Add("fetch, " + std::to_string(n) + " node(s)", Fixed(fetch_gbps[n], 2) + " GB/s",
              n == 1 ? "baseline" : Fixed(fetch_gbps[n] / fetch_gbps[1], 2) + "x 1 node");
  }
  const std::string tokens = std::to_string(o.match_tokens) + " tokens";
  table.Add("match p50, 1 node (plain client)", Fixed(single.p50_us, 1) + " us", tokens);
  table.Add("match p99, 1 node (plain client)", Fixed(single.p99_us, 1) + " us");
  table.Add("match p50, 1 node", Fixed(match[1].p50_us, 1) + " us");
  table.Add("match p99, 1 node", Fixed(match[1].p99_us, 1) + " us",
            Fixed(match[1].p99_us / single.p99_us, 2) + "x plain client");
  table.Add("match p50, 3 nodes", Fixed(match[3].p50_us, 1) + " us");
  table.Add("match p99, 3 nodes", Fixed(match[3].p99_us, 1) + " us",
            Fixed(ratio, 2) + "x 1 node (target <= 1.5)");

  JsonObject json;
  json.Add("block_bytes", static_cast<double>(block_bytes));
  json.Add("clients", o.clients);
  json.Add("prompt_blocks", o.prompt_blocks);
  json.Add("match_tokens", o.match_tokens);
  json.Add("fetch_gbps_1", fetch_gbps[1]);
  json.Add("fetch_gbps_2", fetch_gbps[2]);
  json.Add("fetch_gbps_3", fetch_gbps[3]);
  json.Add("match_p50_us_plain", single.p50_us);
  json.Add("match_p99_us_plain", single.p99_us);
  json.Add("match_p50_us_1", match[1].p50_us);
  json.Add("match_p99_us_1", match[1].p99_us);
  json.Add("match_p50_us_3", match[3].p50_us);
  json.Add("match_p99_us_3", match[3].p99_us);
  json.Add("match_p99_ratio_3_vs_1", ratio);
  if (o.json) {
    std::printf("%s\n", json.Dump().c_str());
  } else {
    table.Print("strata cluster (loopback, static membership, R=1): " +
                std::to_string(block_bytes) + " B blocks, " + std::to_string(o.clients) +
                " clients, " + std::to_string(o.prompt_blocks) + " blocks per fetch");
  }
  return 0;
}

}  // namespace strata::bench

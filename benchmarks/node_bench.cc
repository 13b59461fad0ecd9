// See node_bench.h. Order matters: the raw-UCX servers fork before this
// process creates any UCX context; then Redis; then the node phases (which
// create UCX contexts here), each measured in turn with its raw server.
#include "node_bench.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "bench_blocks.h"
#include "bench_util.h"
#include "node_process.h"
#include "raw_ucx.h"
#include "strata/client.h"
#include "strata/layout.h"

namespace strata::bench {
namespace {

using testing::kTokenA;
using testing::NodeProcess;

constexpr const char* kShmTls = "posix,sysv,cma,self";
constexpr const char* kTcpTls = "tcp";

// Lets running clients warm up, then counts the bytes they move (they add
// to `bytes` while `go` is set) over `seconds`; stops and joins them.
double TimedWindow(double seconds, std::atomic<bool>& go, std::atomic<bool>& stop,
                   std::atomic<uint64_t>& bytes, std::vector<std::thread>& clients) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double start = NowSeconds();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const uint64_t moved = bytes.load();
  const double elapsed = NowSeconds() - start;
  stop = true;
  for (auto& t : clients) t.join();
  return static_cast<double>(moved) / elapsed / 1e9;
}

// Keeps the next prompt's leased match in flight while the current
// prompt's blocks are fetched, as an engine matches queued requests while
// it loads running ones (raw UCX and Redis keep their requests in flight
// too). Prompts first, first + step, ...
class MatchAhead {
 public:
  MatchAhead(Store& store, const std::vector<std::vector<uint32_t>>& prompts, uint64_t first,
             uint64_t step)
      : store_(store), prompts_(prompts), next_(first), step_(step), thread_([this] { Loop(); }) {}
  ~MatchAhead() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (ready_.has_value() && ready_->ok()) store_.Release((*ready_)->lease);
  }

  // The match in flight (waits for it); starts the following one.
  Result<MatchResult> Next() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return ready_.has_value(); });
    Result<MatchResult> m = std::move(*ready_);
    ready_.reset();
    want_ = true;
    cv_.notify_all();
    return m;
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || want_; });
      if (stop_) return;
      want_ = false;
      lock.unlock();
      MatchRequest req;
      req.model_id = BenchModel();
      req.tokens = prompts_[next_ % prompts_.size()];
      req.want_swa = false;
      req.take_lease = true;
      next_ += step_;
      Result<MatchResult> m = store_.Match(req);
      lock.lock();
      ready_.emplace(std::move(m));
      cv_.notify_all();
    }
  }

  Store& store_;
  const std::vector<std::vector<uint32_t>>& prompts_;
  uint64_t next_;
  const uint64_t step_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Result<MatchResult>> ready_;  // mu_
  bool want_ = true;                          // mu_
  bool stop_ = false;                         // mu_
  std::thread thread_;                        // last: starts once the rest exists
};

// Clients loop match (with lease, one prompt ahead) -> fetch every block
// -> release. copy_threads: ClientOptions::copy_threads (0 = the default).
Result<double> MeasureNodeFetch(const NodeProcess& node, const NodeBenchOptions& o,
                                const std::string& mode,
                                const std::vector<std::vector<uint32_t>>& prompts,
                                uint32_t copy_threads = 0) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> clients;
  for (uint32_t c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      ClientOptions co;
      co.token = kTokenA.token;
      co.data_plane_mode = mode;
      co.copy_threads = copy_threads;
      auto store = OpenStore(node.uri(), co);
      auto fail = [&](const Status& st) {
        std::lock_guard lock(error_mu);
        error = st.ToString();
        failed = true;
      };
      if (!store.ok()) return fail(store.status());
      const uint64_t payload = MakeGlobalKvLayout(kV41GlobalKvLayoutId).PayloadBytes();
      std::vector<std::vector<std::byte>> buffers(o.prompt_blocks, std::vector<std::byte>(payload));
      for (auto& b : buffers) std::memset(b.data(), 0, b.size());  // touch every page
      FetchRequest fetch;
      for (auto& b : buffers) fetch.block_buffers.emplace_back(b);
      bool counting = false;
      MatchAhead matches(**store, prompts, c, 1);
      while (!stop.load()) {
        counting = go.load();
        auto m = matches.Next();
        if (!m.ok()) return fail(m.status());
        if (m->blocks.size() != o.prompt_blocks) return fail(Internal("prompt not cached"));
        fetch.match = &*m;
        const FetchOutcome out = (*store)->Fetch(fetch).Wait();
        (*store)->Release(m->lease);
        if (!out.status.ok()) return fail(out.status);
        if (counting) bytes += out.bytes;
      }
    });
  }
  const double gbps = TimedWindow(o.seconds, go, stop, bytes, clients);
  if (failed) return Internal("node fetch: " + error);
  return gbps;
}

// An SWA-hit fetch of `prompt` (its SWA state committed at its end), timed
// from its start to when a worker could run layer 0 (layer group 0 of every
// block and the SWA state verified) and to its end. Medians, ms.
struct Layer0Timing {
  double layer0_ms = 0;
  double whole_ms = 0;
};
Result<Layer0Timing> MeasureLayer0Ready(const NodeProcess& node, const std::string& mode,
                                        std::span<const uint32_t> prompt, uint32_t fetches) {
  ClientOptions co;
  co.token = kTokenA.token;
  co.data_plane_mode = mode;
  auto store = OpenStore(node.uri(), co);
  if (!store.ok()) return store.status();
  MatchRequest req;
  req.model_id = BenchModel();
  req.tokens = prompt;
  req.take_lease = false;
  auto m = (*store)->Match(req);
  if (!m.ok()) return m.status();
  const Layout swa_layout = MakeSwaLayout(kV41SwaLayoutId);
  const SealedBlock swa = MakeBlock(swa_layout, 999);
  CommitPayload c;
  c.block = {m->prefix_key, StateKind::kSwaState, kV41SwaLayoutId, swa.bytes.size(), std::nullopt};
  c.bytes = swa.bytes;
  c.checksum = swa.checksum;
  auto committed = (*store)->Commit(BenchModel(), std::span(&c, 1));
  if (!committed.ok()) return committed.status();
  // Already there (a second run on one node) is as good.
  if (!committed->blocks.front().ok()) return committed->blocks.front();

  std::vector<std::vector<std::byte>> buffers;
  std::vector<std::byte> swa_buffer(swa.bytes.size());
  std::vector<double> layer0_ms, whole_ms;
  req.take_lease = true;
  for (uint32_t i = 0; i < fetches; ++i) {
    auto hit = (*store)->Match(req);
    if (!hit.ok()) return hit.status();
    if (!hit->swa.has_value()) return Internal("the SWA state did not match");
    buffers.resize(hit->blocks.size());
    FetchRequest fetch;
    fetch.match = &*hit;
    for (size_t b = 0; b < hit->blocks.size(); ++b) {
      buffers[b].resize(hit->blocks[b].payload_bytes);
      fetch.block_buffers.emplace_back(buffers[b]);
    }
    fetch.swa_buffer = swa_buffer;
    const auto start = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> swa_at, group0_at;
    fetch.on_event = [&](const FetchEvent& e) {
      const auto now = std::chrono::steady_clock::now();
      if (e.type == FetchEvent::Type::kSwaReady && !swa_at) swa_at = now;
      if (e.type == FetchEvent::Type::kLayerGroupDone && e.group == 0 && !group0_at) {
        group0_at = now;
      }
    };
    const FetchOutcome out = (*store)->Fetch(fetch).Wait();
    const auto end = std::chrono::steady_clock::now();
    (*store)->Release(hit->lease);
    if (!out.status.ok()) return out.status;
    if (!out.swa_ready || !swa_at || !group0_at) return Internal("the SWA-hit fetch fell short");
    auto ms = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::milli>(t - start).count();
    };
    layer0_ms.push_back(ms(std::max(*swa_at, *group0_at)));
    whole_ms.push_back(ms(end));
  }
  return Layer0Timing{Median(layer0_ms), Median(whole_ms)};
}

Result<std::pair<double, double>> MeasureMatch(const NodeProcess& node, const NodeBenchOptions& o,
                                               double* hash_p50_us) {
  ClientOptions co;
  co.token = kTokenA.token;
  auto store = OpenStore(node.uri(), co);
  if (!store.ok()) return store.status();
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const SealedBlock block = MakeBlock(layout, 7);
  const std::vector<uint32_t> tokens = RandomTokens(o.match_tokens, 99);
  STRATA_RETURN_IF_ERROR(
      CommitPrompt(**store, tokens, [&](size_t) -> const SealedBlock& { return block; }));
  MatchRequest req;
  req.model_id = BenchModel();
  req.tokens = tokens;
  std::vector<double> us, hash_us;
  for (uint32_t i = 0; i < o.match_iters; ++i) {
    const double t0 = NowSeconds();
    auto m = (*store)->Match(req);
    const double t1 = NowSeconds();
    if (!m.ok()) return m.status();
    if (m->blocks.size() != tokens.size() / layout.block_tokens) {
      return Internal("match found " + std::to_string(m->blocks.size()) + " blocks");
    }
    us.push_back((t1 - t0) * 1e6);
    const double h0 = NowSeconds();
    auto keys = ChainKeys::ForPrompt({"tenant-a", BenchModel(), ""}, tokens, layout.block_tokens);
    hash_us.push_back((NowSeconds() - h0) * 1e6);
    if (!keys.ok()) return keys.status();
  }
  *hash_p50_us = Median(hash_us);
  return std::make_pair(Percentile(us, 0.5), Percentile(us, 0.99));
}

// ---- Redis --------------------------------------------------------------------

class RedisServer {
 public:
  static Result<std::unique_ptr<RedisServer>> Start(const std::string& binary,
                                                    const std::string& dir) {
    std::unique_ptr<RedisServer> r(new RedisServer());
    r->port_ = testing::FreePort();
    r->socket_ = dir + "/redis.sock";
    std::vector<std::string> args = {binary,
                                     "--port",
                                     std::to_string(r->port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--unixsocket",
                                     r->socket_,
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir,
                                     "--protected-mode",
                                     "no",
                                     "--loglevel",
                                     "warning"};
    std::string error;
    if (!r->process_.Start(args, dir + "/redis.log", &error, /*search_path=*/true)) {
      return Unavailable(error + " (apt install redis-server)");
    }
    for (int i = 0; i < 100; ++i) {
      redisContext* c = redisConnectUnix(r->socket_.c_str());
      if (c != nullptr && c->err == 0) {
        redisFree(c);
        return r;
      }
      if (c != nullptr) redisFree(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Unavailable("redis-server did not come up");
  }
  int port() const { return port_; }
  const std::string& socket() const { return socket_; }

 private:
  RedisServer() = default;
  testing::ChildProcess process_;
  int port_ = 0;
  std::string socket_;
};

// GETs of `keys` values of `value_bytes`, `depth` pipelined per client.
Result<double> MeasureRedis(const RedisServer& server, bool unix_socket, const NodeBenchOptions& o,
                            const std::vector<SealedBlock>& values) {
  auto connect = [&]() -> redisContext* {
    return unix_socket ? redisConnectUnix(server.socket().c_str())
                       : redisConnect("127.0.0.1", server.port());
  };
  {
    redisContext* c = connect();
    if (c == nullptr || c->err) return Unavailable("cannot connect to redis");
    for (size_t k = 0; k < values.size(); ++k) {
      const std::string key = "block:" + std::to_string(k);
      auto* reply = static_cast<redisReply*>(redisCommand(
          c, "SET %b %b", key.data(), key.size(), values[k].bytes.data(), values[k].bytes.size()));
      if (reply == nullptr) return Unavailable("redis SET failed");
      freeReplyObject(reply);
    }
    redisFree(c);
  }
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> go{false}, stop{false}, failed{false};
  std::vector<std::thread> clients;
  for (uint32_t t = 0; t < o.clients; ++t) {
    clients.emplace_back([&, t] {
      redisContext* c = connect();
      if (c == nullptr || c->err) {
        failed = true;
        if (c != nullptr) redisFree(c);
        return;
      }
      for (uint64_t i = t * 7919; !stop.load();) {
        const bool counting = go.load();
        for (uint32_t d = 0; d < o.depth; ++d, ++i) {
          const std::string key = "block:" + std::to_string(i % values.size());
          redisAppendCommand(c, "GET %b", key.data(), key.size());
        }
        for (uint32_t d = 0; d < o.depth; ++d) {
          void* r = nullptr;
          if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) {
            failed = true;
            redisFree(c);
            return;
          }
          auto* reply = static_cast<redisReply*>(r);
          if (counting && reply->type == REDIS_REPLY_STRING) bytes += reply->len;
          freeReplyObject(reply);
        }
      }
      redisFree(c);
    });
  }
  const double gbps = TimedWindow(o.seconds, go, stop, bytes, clients);
  if (failed) return Unavailable("redis GET failed");
  return gbps;
}

}  // namespace

int RunNodeBench(const NodeBenchOptions& options) {
  NodeBenchOptions o = options;
  if (o.depth == 0) o.depth = o.prompt_blocks;
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const uint64_t block_bytes = layout.PayloadBytes();
  const std::string dir = testing::TempDir("node-bench");
  Table table;
  JsonObject json;
  json.Add("block_bytes", static_cast<double>(block_bytes));
  json.Add("clients", o.clients);
  json.Add("prompt_blocks", o.prompt_blocks);
  json.Add("depth", o.depth);
  json.Add("repeats", o.repeats);
  auto fail = [&](const std::string& what, const Status& st) {
    std::fprintf(stderr, "strata-bench node: %s: %s\n", what.c_str(), st.ToString().c_str());
    std::filesystem::remove_all(dir);
    return 1;
  };

  // 1. Raw UCX servers, same block size, one per transport: forked now,
  // before this process has any UCX or gRPC state, and measured later in
  // turn with the node so that both see the same machine.
  RawUcxOptions raw;
  raw.block_bytes = block_bytes;
  raw.blocks = uint64_t{o.prompts} * o.prompt_blocks;
  raw.depth = o.depth;
  raw.seconds = o.seconds;
  raw.pattern = UcxFetchPattern::kRma;
  raw.tls = kShmTls;
  raw.ucx_allocated = true;  // like the node's arena: real RMA over shared memory
  auto shm_server = RawUcxServer::Start(raw);
  if (!shm_server.ok()) return fail("raw UCX shm", shm_server.status());
  // Active messages over shared memory, rendezvous replies from a region UCX
  // did not allocate: the node's `am` path (cma reads, zero copy).
  raw.pattern = UcxFetchPattern::kActiveMessage;
  raw.ucx_allocated = false;
  auto shm_am_server = RawUcxServer::Start(raw);
  if (!shm_am_server.ok()) return fail("raw UCX shm, active messages", shm_am_server.status());
  raw.tls = kTcpTls;
  auto tcp_server = RawUcxServer::Start(raw);
  if (!tcp_server.ok()) return fail("raw UCX tcp", tcp_server.status());
  // Over TCP the baseline is the better of rendezvous and eager replies (the
  // node replies eagerly there).
  raw.eager_replies = true;
  auto tcp_eager_server = RawUcxServer::Start(raw);
  if (!tcp_eager_server.ok()) return fail("raw UCX tcp, eager", tcp_eager_server.status());
  const std::vector<RawUcxServer*> raw_servers[3] = {
      {shm_server->get()}, {shm_am_server->get()}, {tcp_server->get(), tcp_eager_server->get()}};
  unsetenv("UCX_TLS");

  // The blocks every phase serves.
  std::vector<SealedBlock> blocks;
  for (uint64_t b = 0; b < raw.blocks; ++b) blocks.push_back(MakeBlock(layout, 1000 + b));

  // 2. Redis, same values and concurrency.
  double redis_tcp = 0, redis_unix = 0;
  if (!o.skip_redis) {
    std::fprintf(stderr, "strata-bench node: Redis over TCP and a unix socket...\n");
    auto redis = RedisServer::Start(o.redis_server, dir);
    if (!redis.ok()) return fail("redis", redis.status());
    auto t = MeasureRedis(**redis, false, o, blocks);
    if (!t.ok()) return fail("redis tcp", t.status());
    auto u = MeasureRedis(**redis, true, o, blocks);
    if (!u.ok()) return fail("redis unix", u.status());
    redis_tcp = *t;
    redis_unix = *u;
  }

  // 3. The node, once per transport.
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < o.prompts; ++p) {
    prompts.push_back(RandomTokens(size_t{o.prompt_blocks} * layout.block_tokens, 500 + p));
  }
  // The transfer paths a client can get: RMA over shared memory (a node one
  // tenant has), active messages over shared memory (what a node shared by
  // tenants serves) and active messages over TCP. Each phase names the path
  // its client asks for, so a figure is never of another one.
  struct Phase {
    const char* name;  // JSON prefix and table label
    const char* tls;
    const char* mode;
    int raw;  // which raw UCX baseline: 0 shm get, 1 shm active messages, 2 tcp
  };
  const Phase phases[] = {
      {"shm", kShmTls, "rma", 0}, {"shm_am", kShmTls, "am", 1}, {"tcp", kTcpTls, "am", 2}};
  constexpr int kPhases = 3;
  double fetch_gbps[kPhases] = {}, raw_gbps[kPhases] = {}, ratio[kPhases] = {};
  std::vector<double> raw_variant_runs[kPhases][2];  // [phase][rendezvous, eager]
  double match_p50 = 0, match_p99 = 0, hash_p50 = 0;
  double shm_single_gbps = 0;  // one copying thread
  Layer0Timing layer0[kPhases];
  for (int phase = 0; phase < kPhases; ++phase) {
    const Phase& ph = phases[phase];
    std::fprintf(stderr, "strata-bench node: through strata-node, %s (%s)...\n", ph.name, ph.mode);
    setenv("UCX_TLS", ph.tls, 1);
    std::string error;
    NodeProcess::Options no;
    no.settings = {"dram_bytes=1GiB", std::string("data_plane_mode=") + ph.mode};
    // RMA reads the whole arena: a node serves it to one tenant only.
    const std::vector<testing::TestToken> one_tenant = {
        kTokenA, testing::kTokenReadA, testing::kTokenAdminA, testing::kTokenOperator};
    auto node = NodeProcess::Start(
        dir, no, &error,
        std::string_view(ph.mode) == "rma" ? one_tenant : std::vector<testing::TestToken>{});
    if (node == nullptr) return fail("strata-node", Unavailable(error));
    {
      ClientOptions co;
      co.token = kTokenA.token;
      auto store = OpenStore(node->uri(), co);
      if (!store.ok()) return fail("connect", store.status());
      for (uint32_t p = 0; p < o.prompts; ++p) {
        Status st = CommitPrompt(**store, prompts[p], [&](size_t b) -> const SealedBlock& {
          return blocks[p * o.prompt_blocks + b];
        });
        if (!st.ok()) return fail("commit", st);
      }
    }
    std::fprintf(stderr, "strata-bench node: layer 0 of an SWA hit, %s (%s)...\n", ph.name,
                 ph.mode);
    auto layer0_run = MeasureLayer0Ready(*node, ph.mode, prompts[0], 20);
    if (!layer0_run.ok()) return fail("SWA-hit fetch", layer0_run.status());
    layer0[phase] = *layer0_run;
    // Raw UCX and the node in turn; the ratio is the median of the pairs'.
    std::vector<double> raw_runs, node_runs, ratios;
    for (uint32_t r = 0; r < o.repeats; ++r) {
      double best_raw = 0;
      for (size_t v = 0; v < raw_servers[ph.raw].size(); ++v) {
        auto raw_run = raw_servers[ph.raw][v]->FetchGbps();
        if (!raw_run.ok()) return fail("raw UCX", raw_run.status());
        raw_variant_runs[phase][v].push_back(*raw_run);
        best_raw = std::max(best_raw, *raw_run);
      }
      auto node_run = MeasureNodeFetch(*node, o, ph.mode, prompts);
      if (!node_run.ok()) return fail("node fetch", node_run.status());
      raw_runs.push_back(best_raw);
      node_runs.push_back(*node_run);
      ratios.push_back(*node_run / best_raw);
    }
    raw_gbps[phase] = Median(raw_runs);
    fetch_gbps[phase] = Median(node_runs);
    ratio[phase] = Median(ratios);
    if (phase == 0) {
      // The default client splits a large verified copy across two threads;
      // this line shows what one copying thread gets.
      auto single = MeasureNodeFetch(*node, o, ph.mode, prompts, 1);
      if (!single.ok()) return fail("node fetch, one copy thread", single.status());
      shm_single_gbps = *single;
      std::fprintf(stderr, "strata-bench node: match latency, %u-token prompt...\n",
                   o.match_tokens);
      auto lat = MeasureMatch(*node, o, &hash_p50);
      if (!lat.ok()) return fail("match", lat.status());
      match_p50 = lat->first;
      match_p99 = lat->second;
    }
    node->Terminate();
  }
  unsetenv("UCX_TLS");
  std::filesystem::remove_all(dir);

  const double shm_ratio = ratio[0];
  const double tcp_ratio = ratio[2];
  table.Add("shm: fetch via node (rma)", Fixed(fetch_gbps[0], 2) + " GB/s",
            Fixed(shm_ratio, 2) + "x raw UCX (target >= 0.70)");
  table.Add("shm: fetch, one copy thread", Fixed(shm_single_gbps, 2) + " GB/s",
            Fixed(shm_single_gbps / raw_gbps[0], 2) + "x raw UCX");
  table.Add("shm: raw UCX get", Fixed(raw_gbps[0], 2) + " GB/s");
  table.Add("shm: fetch via node (am)", Fixed(fetch_gbps[1], 2) + " GB/s",
            Fixed(ratio[1], 2) + "x raw UCX am, " + Fixed(fetch_gbps[1] / raw_gbps[0], 2) +
                "x raw get (tenants sharing a node)");
  table.Add("shm: raw UCX active messages", Fixed(raw_gbps[1], 2) + " GB/s",
            "rendezvous replies (cma)");
  table.Add("tcp: fetch via node (am)", Fixed(fetch_gbps[2], 2) + " GB/s",
            Fixed(tcp_ratio, 2) + "x raw UCX (target >= 0.70)");
  const double tcp_rndv = Median(raw_variant_runs[2][0]);
  const double tcp_eager = Median(raw_variant_runs[2][1]);
  table.Add("tcp: raw UCX active messages", Fixed(raw_gbps[2], 2) + " GB/s",
            "best of rendezvous " + Fixed(tcp_rndv, 2) + ", eager " + Fixed(tcp_eager, 2));
  if (!o.skip_redis) {
    table.Add("redis GET over TCP", Fixed(redis_tcp, 2) + " GB/s",
              "node tcp = " + Fixed(fetch_gbps[2] / redis_tcp, 2) + "x (target >= 1.5)");
    table.Add("redis GET over unix socket", Fixed(redis_unix, 2) + " GB/s",
              "node shm = " + Fixed(fetch_gbps[0] / redis_unix, 2) + "x (target >= 3)");
  }
  for (int phase = 0; phase < kPhases; ++phase) {
    const std::string name = phases[phase].name;
    const std::string label = std::string(phase == 2 ? "tcp" : "shm") + " (" + phases[phase].mode +
                              "): SWA hit, layer 0 ready";
    table.Add(label, Fixed(layer0[phase].layer0_ms, 2) + " ms",
              Fixed(layer0[phase].layer0_ms / layer0[phase].whole_ms, 2) + "x the whole fetch (" +
                  Fixed(layer0[phase].whole_ms, 2) + " ms)");
    json.Add(name + "_swa_hit_layer0_ms", layer0[phase].layer0_ms);
    json.Add(name + "_swa_hit_fetch_ms", layer0[phase].whole_ms);
  }
  table.Add("match p50, " + std::to_string(o.match_tokens) + " tokens", Fixed(match_p50, 1) + " us",
            "hashing alone: " + Fixed(hash_p50, 1) + " us");
  table.Add("match p99", Fixed(match_p99, 1) + " us", "target < 1000 us");

  json.Add("shm_fetch_gbps", fetch_gbps[0]);
  json.Add("shm_fetch_1thread_gbps", shm_single_gbps);
  json.Add("shm_am_fetch_gbps", fetch_gbps[1]);
  json.Add("shm_am_ratio", ratio[1]);  // to raw UCX active messages over shm
  json.Add("shm_am_raw_gbps", raw_gbps[1]);
  json.Add("shm_am_vs_raw_get", fetch_gbps[1] / raw_gbps[0]);
  json.Add("shm_raw_gbps", raw_gbps[0]);
  json.Add("shm_ratio", shm_ratio);
  json.Add("tcp_fetch_gbps", fetch_gbps[2]);
  json.Add("tcp_raw_gbps", raw_gbps[2]);
  json.Add("tcp_raw_rndv_gbps", tcp_rndv);
  json.Add("tcp_raw_eager_gbps", tcp_eager);
  json.Add("tcp_ratio", tcp_ratio);
  if (!o.skip_redis) {
    json.Add("redis_tcp_gbps", redis_tcp);
    json.Add("redis_unix_gbps", redis_unix);
    json.Add("tcp_vs_redis", fetch_gbps[2] / redis_tcp);
    json.Add("shm_vs_redis_unix", fetch_gbps[0] / redis_unix);
  }
  json.Add("match_p50_us", match_p50);
  json.Add("match_p99_us", match_p99);
  json.Add("match_hash_p50_us", hash_p50);
  if (o.json) {
    std::printf("%s\n", json.Dump().c_str());
  } else {
    table.Print("strata-node: " + std::to_string(block_bytes) + " B blocks, " +
                std::to_string(o.clients) + " client(s), " + std::to_string(o.prompt_blocks) +
                " blocks per match");
  }
  return 0;
}

}  // namespace strata::bench

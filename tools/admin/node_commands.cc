// nodes, stats, top, drain: node-wide views from Stats, and Drain.
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <thread>

#include "commands.h"
#include "table.h"

namespace strata::admin {
namespace {

uint64_t EvictionTotal(const v1::StatsResponse& s) {
  uint64_t n = 0;
  for (const auto& [reason, count] : s.evictions()) n += count;
  for (const auto& [reason, count] : s.ssd_evictions()) n += count;
  return n;
}

Json HitRatio(const v1::StatsResponse& s) {
  if (s.match_tokens() == 0) return {};
  return static_cast<double>(s.hit_tokens()) / static_cast<double>(s.match_tokens());
}

// Protobuf maps have no order; output does.
std::map<std::string, uint64_t> Sorted(const google::protobuf::Map<std::string, uint64_t>& m) {
  return {m.begin(), m.end()};
}

// A tenant's token is told its own namespace's figures only (scope
// "namespace"); the node-wide ones are an operator's (scope "node").
bool NodeScope(const v1::StatsResponse& s) { return s.scope() != "namespace"; }

Json StatsJson(const std::string& address, const v1::StatsResponse& s) {
  Json evictions = Json::MakeObject();
  for (const auto& [reason, count] : Sorted(s.evictions())) evictions.Set(reason, count);
  Json dram = Json::MakeObject()
                  .Set("capacity_bytes", s.capacity_bytes())
                  .Set("used_bytes", s.used_bytes())
                  .Set("global_kv_entries", s.global_kv_entries())
                  .Set("swa_entries", s.swa_entries())
                  .Set("evictions", std::move(evictions));
  Json j = Json::MakeObject();
  j.Set("node_id", s.node_id())
      .Set("address", address)
      .Set("scope", NodeScope(s) ? "node" : "namespace")
      .Set("state", s.draining() ? "draining" : "serving")
      .Set("uptime_ms", s.uptime_ms())
      .Set("lookups", s.match_requests())
      .Set("prompt_tokens", s.match_tokens())
      .Set("hit_tokens", s.hit_tokens())
      .Set("hit_bytes", s.hit_bytes())
      .Set("hit_ratio", HitRatio(s));
  if (!NodeScope(s)) {
    j.Set("dram", std::move(dram));
    j.Set("namespace_leases", Json::MakeObject()
                                  .Set("held_bytes", s.lease_held_bytes())
                                  .Set("limit_bytes", s.lease_held_limit_bytes())
                                  .Set("entries", s.leased_entries())
                                  .Set("entries_limit", s.leased_entries_limit()));
    return j;
  }
  Json ssd_evictions = Json::MakeObject();
  for (const auto& [reason, count] : Sorted(s.ssd_evictions())) ssd_evictions.Set(reason, count);
  Json transports = Json::MakeArray();
  for (const std::string& t : s.data_plane_transports()) transports.Push(t);
  dram.Set("payload_bytes", s.payload_bytes()).Set("reserved_entries", s.reserved_entries());
  j.Set("dram", std::move(dram))
      .Set("ssd", Json::MakeObject()
                      .Set("enabled", s.ssd_enabled())
                      .Set("capacity_bytes", s.ssd_capacity_bytes())
                      .Set("used_bytes", s.ssd_used_bytes())
                      .Set("entries", s.ssd_entries())
                      .Set("evictions", std::move(ssd_evictions)))
      .Set("read_leases", s.read_leases())
      .Set("write_leases", s.write_leases())
      .Set("checksum_failures", s.checksum_failures() + s.ssd_checksum_failures())
      .Set("data_plane", Json::MakeObject()
                             .Set("bytes_sent", s.data_plane_bytes_sent())
                             .Set("bytes_received", s.data_plane_bytes_received())
                             .Set("transports", std::move(transports)));
  Json namespaces = Json::MakeArray();
  for (const std::string& ns : s.namespaces()) namespaces.Push(ns);
  j.Set("namespaces", std::move(namespaces));
  return j;
}

std::string EvictionList(const google::protobuf::Map<std::string, uint64_t>& by_reason) {
  std::string out;
  for (const auto& [reason, count] : Sorted(by_reason)) {
    out += (out.empty() ? "" : ", ") + reason + "=" + std::to_string(count);
  }
  return out.empty() ? "0" : out;
}

void PrintStats(const std::string& address, const v1::StatsResponse& s) {
  std::printf("node %s (%s), %s, up %s%s\n", s.node_id().c_str(), address.c_str(),
              s.draining() ? "draining" : "serving",
              FormatMs(static_cast<int64_t>(s.uptime_ms())).c_str(),
              NodeScope(s) ? "" : "; your namespace's figures only");
  KeyValues kv;
  kv.Add("hit ratio", FormatRatio(s.hit_tokens(), s.match_tokens()) + " of " +
                          std::to_string(s.match_tokens()) + " prompt tokens in " +
                          std::to_string(s.match_requests()) + " lookups");
  kv.Add("hit tokens", std::to_string(s.hit_tokens()));
  kv.Add("hit bytes", std::to_string(s.hit_bytes()) + " (" + FormatBytes(s.hit_bytes()) + ")");
  kv.Add("dram", FormatBytes(s.used_bytes()) + " used of " + FormatBytes(s.capacity_bytes()) +
                     ", " + std::to_string(s.global_kv_entries()) + " global + " +
                     std::to_string(s.swa_entries()) + " swa entries");
  kv.Add("evictions (dram)", EvictionList(s.evictions()));
  if (!NodeScope(s)) {
    kv.Add("namespace leases", FormatBytes(s.lease_held_bytes()) + " held of " +
                                   FormatBytes(s.lease_held_limit_bytes()) + " allowed, " +
                                   std::to_string(s.leased_entries()) + " of " +
                                   std::to_string(s.leased_entries_limit()) + " entries");
    kv.Print(stdout);
    return;
  }
  kv.Add("ssd", s.ssd_enabled() ? FormatBytes(s.ssd_used_bytes()) + " used of " +
                                      FormatBytes(s.ssd_capacity_bytes()) + ", " +
                                      std::to_string(s.ssd_entries()) + " entries"
                                : std::string("none"));
  if (s.ssd_enabled()) kv.Add("evictions (ssd)", EvictionList(s.ssd_evictions()));
  kv.Add("live leases",
         std::to_string(s.read_leases()) + " read, " + std::to_string(s.write_leases()) + " write");
  kv.Add("checksum failures", std::to_string(s.checksum_failures() + s.ssd_checksum_failures()));
  kv.Add("data plane", FormatBytes(s.data_plane_bytes_sent()) + " sent, " +
                           FormatBytes(s.data_plane_bytes_received()) + " received");
  if (s.namespaces_size() > 0) {
    std::string list;
    for (const std::string& ns : s.namespaces()) list += (list.empty() ? "" : ", ") + ns;
    kv.Add("namespaces", list);
  }
  kv.Print(stdout);
}

std::string Devices(const v1::StatsResponse& s) {
  std::string out;
  for (const std::string& d : s.rdma_devices()) out += (out.empty() ? "" : ",") + d;
  return out.empty() ? "-" : out;
}

// ---- nodes --------------------------------------------------------------------

int RunNodes(Context& ctx) {
  Table table({"NODE", "ADDRESS", "STATE", "DRAM USED", "DRAM CAPACITY", "SSD USED", "SSD CAPACITY",
               "ENTRIES", "RDMA", "UPTIME"});
  Json nodes = Json::MakeArray();
  Status first_error;
  for (const auto& c : ctx.clients) {
    Result<v1::StatsResponse> s = c->Stats();
    if (!s.ok()) {
      // One node down is part of the picture, not the end of it.
      if (first_error.ok()) first_error = s.status();
      std::fprintf(stderr, "strata-admin: %s\n", s.status().message().c_str());
      table.AddRow({"?", c->address(), "unreachable"});
      nodes.Push(Json::MakeObject()
                     .Set("address", c->address())
                     .Set("state", "unreachable")
                     .Set("error", s.status().message()));
      continue;
    }
    Json devices = Json::MakeArray();
    for (const std::string& d : s->rdma_devices()) devices.Push(d);
    nodes.Push(Json::MakeObject()
                   .Set("node_id", s->node_id())
                   .Set("address", c->address())
                   .Set("state", s->draining() ? "draining" : "serving")
                   .Set("dram_capacity_bytes", s->capacity_bytes())
                   .Set("dram_used_bytes", s->used_bytes())
                   .Set("ssd_enabled", s->ssd_enabled())
                   .Set("ssd_capacity_bytes", s->ssd_capacity_bytes())
                   .Set("ssd_used_bytes", s->ssd_used_bytes())
                   .Set("entries", s->global_kv_entries() + s->swa_entries())
                   .Set("rdma_devices", std::move(devices))
                   .Set("uptime_ms", s->uptime_ms()));
    table.AddRow({s->node_id(), c->address(), s->draining() ? "draining" : "serving",
                  FormatBytes(s->used_bytes()), FormatBytes(s->capacity_bytes()),
                  s->ssd_enabled() ? FormatBytes(s->ssd_used_bytes()) : "-",
                  s->ssd_enabled() ? FormatBytes(s->ssd_capacity_bytes()) : "-",
                  std::to_string(s->global_kv_entries() + s->swa_entries()), Devices(*s),
                  FormatMs(static_cast<int64_t>(s->uptime_ms()))});
  }
  if (ctx.json) {
    std::printf("%s\n", Json::MakeObject().Set("nodes", std::move(nodes)).Dump().c_str());
  } else {
    table.Print(stdout);
  }
  return static_cast<int>(ExitCodeFor(first_error.code()));
}

// ---- stats --------------------------------------------------------------------

int RunStats(Context& ctx, const std::string& node) {
  std::vector<size_t> targets;  // into ctx.clients
  if (!node.empty()) {
    Result<NodeClient*> c = ctx.FindNode(node);
    if (!c.ok()) return ctx.Fail(c.status());
    for (size_t i = 0; i < ctx.clients.size(); ++i) {
      if (ctx.clients[i].get() == *c) targets.push_back(i);
    }
  } else {
    for (size_t i = 0; i < ctx.clients.size(); ++i) targets.push_back(i);
  }
  // A node that does not answer does not hide the others.
  Json nodes = Json::MakeArray();
  std::vector<NodeFailure> failed;
  bool printed = false;
  for (const size_t i : targets) {
    Result<v1::StatsResponse> s = ctx.clients[i]->Stats();
    if (!s.ok()) {
      failed.push_back({i, s.status()});
      continue;
    }
    if (ctx.json) {
      nodes.Push(StatsJson(ctx.clients[i]->address(), *s));
    } else {
      if (printed) std::printf("\n");
      PrintStats(ctx.clients[i]->address(), *s);
      printed = true;
    }
  }
  if (failed.size() == targets.size()) return ctx.Fail(failed.front().status);
  Json out = Json::MakeObject();
  const int code = ReportNodeFailures(ctx, failed, &out);
  if (ctx.json) std::printf("%s\n", out.Set("nodes", std::move(nodes)).Dump().c_str());
  return code;
}

// ---- top ----------------------------------------------------------------------

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int /*signal*/) { g_interrupted.store(true); }

struct TopOptions {
  double interval_s = 1;
  uint64_t iterations = 0;
};

struct Sample {
  bool ok = false;
  v1::StatsResponse stats;
  std::chrono::steady_clock::time_point at;
  std::string error;
};

std::vector<Sample> SampleAll(Context& ctx) {
  std::vector<Sample> out;
  for (const auto& c : ctx.clients) {
    Sample s;
    Result<v1::StatsResponse> r = c->Stats();
    s.at = std::chrono::steady_clock::now();
    s.ok = r.ok();
    if (r.ok()) {
      s.stats = std::move(r).value();
    } else {
      s.error = r.status().message();
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Sleeps in short steps so Ctrl-C ends the wait at once.
void SleepInterruptibly(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!g_interrupted.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// One refresh: a row per node, in the table and as JSON.
struct TopView {
  Table table = Table({"NODE", "STATE", "LOOKUPS/S", "HIT TOKENS/S", "HIT BYTES/S", "HIT RATIO",
                       "SENT/S", "RECEIVED/S", "EVICTIONS/S", "LEASES R/W", "DRAM USED"});
  Json nodes = Json::MakeArray();
};

// A node's rates between two samples that both answered.
void AddRates(const std::string& address, const Sample& prev, const Sample& now, TopView& view) {
  const v1::StatsResponse& a = prev.stats;
  const v1::StatsResponse& b = now.stats;
  const double dt = std::chrono::duration<double>(now.at - prev.at).count();
  // A restarted node's counters start over: no negative rates.
  auto rate = [&](uint64_t x, uint64_t y) {
    return y >= x && dt > 0 ? static_cast<double>(y - x) / dt : 0.0;
  };
  const double lookups = rate(a.match_requests(), b.match_requests());
  const double hit_tokens = rate(a.hit_tokens(), b.hit_tokens());
  const double hit_bytes = rate(a.hit_bytes(), b.hit_bytes());
  const double sent = rate(a.data_plane_bytes_sent(), b.data_plane_bytes_sent());
  const double received = rate(a.data_plane_bytes_received(), b.data_plane_bytes_received());
  const double evictions = rate(EvictionTotal(a), EvictionTotal(b));
  const uint64_t d_prompt =
      b.match_tokens() >= a.match_tokens() ? b.match_tokens() - a.match_tokens() : 0;
  const uint64_t d_hit = b.hit_tokens() >= a.hit_tokens() ? b.hit_tokens() - a.hit_tokens() : 0;
  Json ratio;
  if (d_prompt > 0) ratio = static_cast<double>(d_hit) / static_cast<double>(d_prompt);
  view.nodes.Push(Json::MakeObject()
                      .Set("node_id", b.node_id())
                      .Set("address", address)
                      .Set("state", b.draining() ? "draining" : "serving")
                      .Set("lookups_per_s", lookups)
                      .Set("hit_tokens_per_s", hit_tokens)
                      .Set("hit_bytes_per_s", hit_bytes)
                      .Set("hit_ratio", ratio)
                      .Set("bytes_sent_per_s", sent)
                      .Set("bytes_received_per_s", received)
                      .Set("evictions_per_s", evictions)
                      .Set("read_leases", b.read_leases())
                      .Set("write_leases", b.write_leases())
                      .Set("dram_used_bytes", b.used_bytes()));
  view.table.AddRow({b.node_id(), b.draining() ? "draining" : "serving", FormatRate(lookups),
                     FormatRate(hit_tokens), FormatBytes(static_cast<uint64_t>(hit_bytes)) + "/s",
                     FormatRatio(d_hit, d_prompt), FormatBytes(static_cast<uint64_t>(sent)) + "/s",
                     FormatBytes(static_cast<uint64_t>(received)) + "/s", FormatRate(evictions),
                     std::to_string(b.read_leases()) + "/" + std::to_string(b.write_leases()),
                     FormatBytes(b.used_bytes())});
}

TopView ViewOf(Context& ctx, const std::vector<Sample>& prev, const std::vector<Sample>& now) {
  TopView view;
  for (size_t i = 0; i < now.size(); ++i) {
    const std::string& address = ctx.clients[i]->address();
    if (!now[i].ok || !prev[i].ok) {
      view.table.AddRow({address, "unreachable"});
      view.nodes.Push(Json::MakeObject()
                          .Set("address", address)
                          .Set("state", "unreachable")
                          .Set("error", now[i].ok ? prev[i].error : now[i].error));
      continue;
    }
    AddRates(address, prev[i], now[i], view);
  }
  return view;
}

void PrintView(Context& ctx, const TopOptions& opt, uint64_t it, double elapsed, bool tty,
               TopView& view) {
  if (ctx.json) {
    std::printf("%s\n", Json::MakeObject()
                            .Set("iteration", it + 1)
                            .Set("elapsed_s", elapsed)
                            .Set("interval_s", opt.interval_s)
                            .Set("nodes", std::move(view.nodes))
                            .Dump()
                            .c_str());
  } else {
    if (tty) std::printf("\033[H\033[2J");  // a refreshing screen on a terminal
    std::printf("strata-admin top: every %.3gs, %.1fs elapsed (Ctrl-C ends)\n", opt.interval_s,
                elapsed);
    view.table.Print(stdout);
    if (!tty) std::printf("\n");
  }
  std::fflush(stdout);
}

int RunTop(Context& ctx, const TopOptions& opt) {
  std::signal(SIGINT, OnInterrupt);
  std::vector<Sample> prev = SampleAll(ctx);
  bool any = false;
  for (const Sample& s : prev) any = any || s.ok;
  if (!any) {
    Result<v1::StatsResponse> r = ctx.clients.front()->Stats();
    return ctx.Fail(r.ok() ? Unavailable("no node answered") : r.status());
  }
  const auto start = prev.front().at;
  const bool tty = isatty(STDOUT_FILENO) != 0 && !ctx.json;
  for (uint64_t it = 0; opt.iterations == 0 || it < opt.iterations; ++it) {
    SleepInterruptibly(opt.interval_s);
    if (g_interrupted.load()) break;
    std::vector<Sample> now = SampleAll(ctx);
    TopView view = ViewOf(ctx, prev, now);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    PrintView(ctx, opt, it, elapsed, tty, view);
    prev = std::move(now);
  }
  return 0;
}

// ---- drain --------------------------------------------------------------------

int RunDrain(Context& ctx, const std::string& node) {
  Result<NodeClient*> c = ctx.FindNode(node);
  if (!c.ok()) return ctx.Fail(c.status());
  Result<v1::DrainResponse> d = (*c)->Drain();
  if (!d.ok()) return ctx.Fail(d.status());
  Result<v1::StatsResponse> s = (*c)->Stats();
  if (!s.ok()) return ctx.Fail(s.status());
  if (ctx.json) {
    std::printf("%s\n", Json::MakeObject()
                            .Set("node_id", s->node_id())
                            .Set("address", (*c)->address())
                            .Set("state", s->draining() ? "draining" : "serving")
                            .Set("read_leases", d->read_leases())
                            .Set("write_leases", d->write_leases())
                            .Dump()
                            .c_str());
  } else {
    std::printf("node %s (%s) is %s: new writes are refused; %lu read and %lu write leases live\n",
                s->node_id().c_str(), (*c)->address().c_str(),
                s->draining() ? "draining" : "serving",
                static_cast<unsigned long>(d->read_leases()),
                static_cast<unsigned long>(d->write_leases()));
  }
  return 0;
}

}  // namespace

void AddNodeCommands(CLI::App& app, Runner* run) {
  CLI::App* nodes = app.add_subcommand("nodes", "Membership: state, tier capacity and use, RDMA");
  nodes->callback([run] { *run = RunNodes; });

  auto stats_node = std::make_shared<std::string>();
  CLI::App* stats =
      app.add_subcommand("stats", "Hit ratio, hit tokens and bytes, tiers, evictions, leases");
  stats->add_option("--node", *stats_node, "Only this node (id or address)");
  stats->callback([run, stats_node] {
    *run = [stats_node](Context& ctx) { return RunStats(ctx, *stats_node); };
  });

  auto top_opt = std::make_shared<TopOptions>();
  CLI::App* top = app.add_subcommand("top", "Refreshing rates per node (hits/s, bytes/s, ...)");
  top->add_option("--interval", top_opt->interval_s, "Seconds between refreshes")
      ->check(Finite())
      ->check(CLI::Range(0.01, 3600.0));
  top->add_option("--iterations", top_opt->iterations, "Refreshes, then exit; 0: until Ctrl-C");
  top->callback(
      [run, top_opt] { *run = [top_opt](Context& ctx) { return RunTop(ctx, *top_opt); }; });

  auto drain_node = std::make_shared<std::string>();
  CLI::App* drain = app.add_subcommand("drain", "Stop new writes to a node (operator token)");
  drain->add_option("node", *drain_node, "Node id or address")->required();
  drain->callback([run, drain_node] {
    *run = [drain_node](Context& ctx) { return RunDrain(ctx, *drain_node); };
  });
}

}  // namespace strata::admin

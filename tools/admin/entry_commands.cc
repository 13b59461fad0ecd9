// ls, inspect, pin, unpin, evict: entries, on every node of --store.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "prompt_input.h"
#include "table.h"

namespace strata::admin {
namespace {

std::vector<std::string> EntryRow(const v1::EntryInfo& e) {
  return {Hex(e.key()),
          KindName(e.kind()),
          e.namespace_(),
          TierName(e.tier()),
          FormatBytes(e.payload_bytes()),
          FormatMs(e.age_ms()),
          FormatMs(e.expires_in_ms()),
          e.pinned_for_ms() > 0 ? FormatMs(e.pinned_for_ms()) : "-",
          std::to_string(e.live_leases()),
          std::to_string(e.hits()),
          Hex(e.model_id()).substr(0, 12)};
}
const std::vector<std::string> kEntryHeaders = {"KEY",     "KIND", "NAMESPACE", "TIER",
                                                "PAYLOAD", "AGE",  "EXPIRES",   "PINNED",
                                                "LEASES",  "HITS", "MODEL"};

// The filter options ls and evict share.
struct FilterOptions {
  std::string ns;
  std::string model;
  std::string kind;
  std::string tier;
  std::string older_than;
  bool pinned = false;
  bool unpinned = false;
};

void AddFilterOptions(CLI::App* cmd, FilterOptions* f, bool with_model) {
  cmd->add_option("--namespace", f->ns, "Namespace (operator tokens must name one)");
  if (with_model) {
    cmd->add_option("--model", f->model, "Model: fingerprint id (32 hex), seed:N or a model file");
  }
  cmd->add_option("--kind", f->kind, "global or swa");
  cmd->add_option("--older-than", f->older_than,
                  "Committed at least this long ago (90s, 15m, 2h, 3d)");
}

Status BuildFilter(const FilterOptions& o, v1::EntryFilter* f) {
  f->set_namespace_(o.ns);
  if (!o.model.empty()) {
    Result<ModelId> m = ResolveModel(o.model);
    if (!m.ok()) return m.status();
    f->set_model_id(std::string(reinterpret_cast<const char*>(m->bytes.data()), m->bytes.size()));
  }
  if (!o.kind.empty()) {
    Result<v1::StateKind> k = ParseKind(o.kind);
    if (!k.ok()) return k.status();
    f->set_kind(*k);
  }
  if (!o.tier.empty()) {
    if (o.tier == "dram") {
      f->set_tier(v1::DRAM);
    } else if (o.tier == "ssd") {
      f->set_tier(v1::SSD);
    } else {
      return InvalidArgument("--tier: '" + o.tier + "' is not dram or ssd");
    }
  }
  if (!o.older_than.empty()) {
    Result<uint64_t> s = ParseDuration(o.older_than);
    if (!s.ok()) return s.status();
    // The request reads 0 as "any age": evict would take the namespace.
    if (*s == 0) return InvalidArgument("--older-than must be positive (--all: every entry)");
    f->set_older_than_s(*s);
  }
  if (o.pinned && o.unpinned) return InvalidArgument("--pinned and --unpinned exclude each other");
  if (o.pinned) f->set_pinned(v1::EntryFilter::PINNED_ONLY);
  if (o.unpinned) f->set_pinned(v1::EntryFilter::UNPINNED_ONLY);
  return Status::Ok();
}

// ---- ls -----------------------------------------------------------------------

struct LsOptions {
  FilterOptions filter;
  uint32_t page_size = 100;
  std::string page_token;
  bool all = false;
  std::string sort = "key";
  bool reverse = false;
};

// A page token: the node's index in --store, '.', the node's own token in
// hex (empty: that node's first page). Pages walk the nodes in order.
std::string PageToken(size_t node, const std::string& token) {
  return std::to_string(node) + "." + Hex(token);
}
Status ParsePageToken(const std::string& text, size_t nodes, size_t* node, std::string* token) {
  const size_t dot = text.find('.');
  Status bad = InvalidArgument("--page-token: '" + text + "' is not a token ls printed");
  if (dot == 0 || dot == std::string::npos || dot > 6 ||
      text.substr(0, dot).find_first_not_of("0123456789") != std::string::npos) {
    return bad;
  }
  *node = std::stoul(text.substr(0, dot));
  const std::string hex = text.substr(dot + 1);
  if (*node >= nodes || hex.size() % 2 != 0 || hex.size() > 64 ||
      hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return bad;
  }
  token->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    token->push_back(static_cast<char>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  }
  return Status::Ok();
}

int RunLs(Context& ctx, const LsOptions& o) {
  v1::ListEntriesRequest req;
  if (Status st = BuildFilter(o.filter, req.mutable_filter()); !st.ok()) return ctx.Fail(st);
  static const std::vector<std::string> kSorts = {"key", "age", "size", "hits", "expires"};
  if (std::find(kSorts.begin(), kSorts.end(), o.sort) == kSorts.end()) {
    return ctx.Fail(
        InvalidArgument("--sort: '" + o.sort + "' is not key, age, size, hits or expires"));
  }
  size_t node = 0;
  std::string token;
  if (!o.page_token.empty()) {
    if (Status st = ParsePageToken(o.page_token, ctx.clients.size(), &node, &token); !st.ok()) {
      return ctx.Fail(st);
    }
  }
  struct Row {
    size_t node;
    v1::EntryInfo entry;
  };
  std::vector<Row> rows;
  std::string next;
  while (node < ctx.clients.size()) {
    // A page can hold a few more than asked (one key's models are never split).
    const size_t want =
        o.all ? kMaxBlocksPerCall : o.page_size - std::min<size_t>(rows.size(), o.page_size);
    if (want == 0) {
      next = PageToken(node, token);
      break;
    }
    req.set_page_size(static_cast<uint32_t>(want));
    req.set_page_token(token);
    Result<v1::ListEntriesResponse> page = ctx.clients[node]->ListEntries(req);
    if (!page.ok()) return ctx.Fail(page.status());
    for (const v1::EntryInfo& e : page->entries()) rows.push_back({node, e});
    token = page->next_page_token();
    if (token.empty()) ++node;
  }
  if (next.empty() && node < ctx.clients.size()) next = PageToken(node, token);
  // Sorting orders the rows shown (all of them with --all); pages follow key order.
  auto key_of = [&](const Row& r) -> int64_t {
    const v1::EntryInfo& e = r.entry;
    if (o.sort == "age") return e.age_ms();
    if (o.sort == "size") return static_cast<int64_t>(e.payload_bytes());
    if (o.sort == "hits") return static_cast<int64_t>(e.hits());
    if (o.sort == "expires") return e.expires_in_ms();
    return 0;
  };
  if (o.sort != "key") {
    std::stable_sort(rows.begin(), rows.end(),
                     [&](const Row& a, const Row& b) { return key_of(a) < key_of(b); });
  }
  if (o.reverse) std::reverse(rows.begin(), rows.end());

  if (ctx.json) {
    Json entries = Json::MakeArray();
    for (const Row& r : rows) {
      Json e = EntryJson(r.entry);
      e.Set("node", ctx.clients[r.node]->address());
      entries.Push(std::move(e));
    }
    Json out = Json::MakeObject();
    out.Set("entries", std::move(entries));
    out.Set("next_page_token", next.empty() ? Json() : Json(next));
    std::printf("%s\n", out.Dump().c_str());
    return 0;
  }
  std::vector<std::string> headers = kEntryHeaders;
  if (ctx.many()) headers.insert(headers.begin(), "NODE");
  Table table(headers);
  for (const Row& r : rows) {
    std::vector<std::string> cells = EntryRow(r.entry);
    if (ctx.many()) cells.insert(cells.begin(), ctx.clients[r.node]->address());
    table.AddRow(std::move(cells));
  }
  table.Print(stdout);
  std::printf("%zu entries", rows.size());
  if (!next.empty()) std::printf("; next page: --page-token %s", next.c_str());
  std::printf("\n");
  return 0;
}

// ---- inspect --------------------------------------------------------------------

struct EntryArgs {
  std::string key;
  std::string kind = "global";
  std::string ns;
};

void AddEntryArgs(CLI::App* cmd, EntryArgs* a) {
  cmd->add_option("key", a->key, "Chain key, 32 hex digits (as ls prints)")->required();
  cmd->add_option("--kind", a->kind, "global or swa");
  cmd->add_option("--namespace", a->ns, "Namespace (operator tokens must name one)");
}

Status BuildRef(const EntryArgs& a, v1::EntryRef* ref) {
  Result<std::string> key = ParseKeyHex(a.key);
  if (!key.ok()) return key.status();
  Result<v1::StateKind> kind = ParseKind(a.kind);
  if (!kind.ok()) return kind.status();
  ref->set_key(*key);
  ref->set_kind(*kind);
  return Status::Ok();
}

// Asks every node; a node without the entry is not an error unless none has it.
// A node that fails otherwise fails the call, or, with `failed`, is noted
// there while the others are asked (the call fails only if none answered
// with the entry).
struct Replica {
  size_t node;
  v1::EntryInfo entry;
};
Result<std::vector<Replica>> FindReplicas(Context& ctx, const v1::InspectRequest& req,
                                          std::vector<NodeFailure>* failed = nullptr) {
  std::vector<Replica> found;
  Status not_found;
  for (size_t i = 0; i < ctx.clients.size(); ++i) {
    Result<v1::EntryInfo> e = ctx.clients[i]->Inspect(req);
    if (e.ok()) {
      found.push_back({i, std::move(e).value()});
    } else if (e.status().code() == StatusCode::kNotFound) {
      not_found = e.status();
    } else if (failed != nullptr) {
      failed->push_back({i, e.status()});
    } else {
      return e.status();
    }
  }
  if (found.empty() && failed != nullptr && !failed->empty()) return failed->front().status;
  if (found.empty()) {
    if (ctx.many()) {
      return NotFound("no such key: " + KindName(req.entry().kind()) + " entry " +
                      Hex(req.entry().key()) + " is on none of the " +
                      std::to_string(ctx.clients.size()) + " nodes");
    }
    return not_found;
  }
  return found;
}

int RunInspect(Context& ctx, const EntryArgs& a) {
  v1::InspectRequest req;
  if (Status st = BuildRef(a, req.mutable_entry()); !st.ok()) return ctx.Fail(st);
  req.set_namespace_(a.ns);
  Result<std::vector<Replica>> replicas = FindReplicas(ctx, req);
  if (!replicas.ok()) return ctx.Fail(replicas.status());
  uint64_t leases = 0;
  for (const Replica& r : *replicas) leases += r.entry.live_leases();
  const v1::EntryInfo& e = replicas->front().entry;
  if (ctx.json) {
    Json list = Json::MakeArray();
    for (const Replica& r : *replicas) {
      list.Push(Json::MakeObject()
                    .Set("node", ctx.clients[r.node]->address())
                    .Set("tier", TierName(r.entry.tier()))
                    .Set("live_leases", r.entry.live_leases())
                    .Set("hits", r.entry.hits())
                    .Set("age_ms", r.entry.age_ms()));
    }
    std::printf("%s\n", Json::MakeObject()
                            .Set("entry", EntryJson(e))
                            .Set("replicas", std::move(list))
                            .Set("live_leases", leases)
                            .Dump()
                            .c_str());
    return 0;
  }
  KeyValues kv;
  kv.Add("key", Hex(e.key()));
  kv.Add("kind", KindName(e.kind()));
  kv.Add("namespace", e.namespace_());
  kv.Add("model", Hex(e.model_id()));
  kv.Add("layout", std::to_string(e.layout_id()));
  kv.Add("payload",
         std::to_string(e.payload_bytes()) + " bytes (" + FormatBytes(e.payload_bytes()) + ")");
  kv.Add("checksum", Hex64(e.checksum()));
  kv.Add("tier", TierName(e.tier()));
  kv.Add("age", FormatMs(e.age_ms()));
  kv.Add("expires in", FormatMs(e.expires_in_ms()));
  kv.Add("pinned", e.pinned_for_ms() > 0 ? "for " + FormatMs(e.pinned_for_ms()) : "no");
  kv.Add("hits", std::to_string(e.hits()));
  kv.Add("parent", e.has_parent() ? "yes" : "no (first block)");
  kv.Add("children", std::to_string(e.children()));
  kv.Add("live leases", std::to_string(leases));
  std::string where;
  for (const Replica& r : *replicas) {
    where += (where.empty() ? "" : ", ") + ctx.clients[r.node]->address() + " (" +
             TierName(r.entry.tier()) + ")";
  }
  kv.Add("replicas", std::to_string(replicas->size()) + ": " + where);
  kv.Print(stdout);
  return 0;
}

// ---- pin / unpin ----------------------------------------------------------------

int RunPin(Context& ctx, const EntryArgs& a, uint64_t ttl_s) {
  v1::InspectRequest find;
  if (Status st = BuildRef(a, find.mutable_entry()); !st.ok()) return ctx.Fail(st);
  find.set_namespace_(a.ns);
  // A node that is down does not keep the others from pinning (or, for an
  // operator on call, from unpinning): it is named among the failures.
  std::vector<NodeFailure> failed;
  Result<std::vector<Replica>> replicas = FindReplicas(ctx, find, &failed);
  if (!replicas.ok()) return ctx.Fail(replicas.status());
  v1::PinRequest req;
  *req.mutable_entry() = find.entry();
  req.set_namespace_(a.ns);
  req.set_ttl_s(static_cast<uint32_t>(ttl_s));
  Json nodes = Json::MakeArray();
  std::string where;
  for (const Replica& r : *replicas) {
    if (Status st = ctx.clients[r.node]->Pin(req); !st.ok()) {
      failed.push_back({r.node, st});
      continue;
    }
    nodes.Push(ctx.clients[r.node]->address());
    where += (where.empty() ? "" : ", ") + ctx.clients[r.node]->address();
  }
  if (where.empty()) return ctx.Fail(failed.front().status);
  Json out = Json::MakeObject();
  const int code = ReportNodeFailures(ctx, failed, &out);
  if (ctx.json) {
    out.Set("key", Hex(find.entry().key()))
        .Set("kind", KindName(find.entry().kind()))
        .Set("pinned", ttl_s > 0)
        .Set("ttl_s", ttl_s)
        .Set("nodes", std::move(nodes));
    std::printf("%s\n", out.Dump().c_str());
  } else if (ttl_s > 0) {
    std::printf("pinned %s %s for %s on %s\n", KindName(find.entry().kind()).c_str(),
                Hex(find.entry().key()).c_str(),
                FormatMs(static_cast<int64_t>(ttl_s) * 1000).c_str(), where.c_str());
  } else {
    std::printf("unpinned %s %s on %s\n", KindName(find.entry().kind()).c_str(),
                Hex(find.entry().key()).c_str(), where.c_str());
  }
  return code;
}

// ---- evict ----------------------------------------------------------------------

struct EvictOptions {
  FilterOptions filter;
  std::string key;
  std::string key_kind = "global";
  PromptOptions prompt;  // --tokens-file with --model: a prompt prefix
  bool all = false;
  bool dry_run = false;
  uint32_t max_listed = 100;
};

// The prompt prefix's keys, derived as the client derives them, as the target.
Status SetPromptTarget(Context& ctx, const EvictOptions& o, v1::EvictRequest* req) {
  PromptOptions prompt = o.prompt;
  prompt.model = o.filter.model;
  Result<PromptKeys> keys = DerivePromptKeys(ctx, prompt, o.filter.ns);
  if (!keys.ok()) return keys.status();
  for (const ChainKey& k : keys->keys) {
    req->mutable_prefix()->add_keys(
        std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
  }
  req->set_namespace_(o.filter.ns);
  return Status::Ok();
}

// What evict asks every node: exactly one target, a key, a prompt prefix or
// a filter.
Status BuildEvictRequest(Context& ctx, const EvictOptions& o, v1::EvictRequest* req) {
  req->set_dry_run(o.dry_run);
  req->set_max_listed(o.max_listed);
  const bool by_prompt = !o.prompt.tokens_file.empty();
  const bool by_filter = (!o.filter.model.empty() && !by_prompt) || !o.filter.older_than.empty() ||
                         !o.filter.kind.empty() || o.all;
  const int targets = (o.key.empty() ? 0 : 1) + (by_prompt ? 1 : 0) + (by_filter ? 1 : 0);
  if (by_prompt && o.filter.model.empty()) {
    return InvalidArgument("--tokens-file needs --model: the keys commit to the model");
  }
  if (targets != 1) {
    return InvalidArgument(
        "evict needs exactly one target: a KEY, --tokens-file (with --model), or a filter "
        "(--model, --older-than, --kind; --all for a whole namespace)");
  }
  if (!o.key.empty()) {
    EntryArgs a{o.key, o.key_kind, o.filter.ns};
    if (Status st = BuildRef(a, req->mutable_entry()); !st.ok()) return st;
    req->set_namespace_(o.filter.ns);
    return Status::Ok();
  }
  if (by_prompt) return SetPromptTarget(ctx, o, req);
  return BuildFilter(o.filter, req->mutable_filter());
}

// What the nodes evicted, added up, and the nodes that could not.
struct EvictTally {
  uint64_t evicted = 0, deferred = 0, pinned = 0, bytes = 0;
  struct Row {
    size_t node;
    v1::EntryInfo entry;
  };
  std::vector<Row> rows;
  size_t missing = 0;  // nodes without the key or prefix
  Status not_found;
  std::vector<NodeFailure> failed;
};

// Asks every node in turn. A node that fails does not stop the others: what
// they evicted is listed.
EvictTally EvictOnNodes(Context& ctx, const v1::EvictRequest& req) {
  EvictTally t;
  for (size_t i = 0; i < ctx.clients.size(); ++i) {
    Result<v1::EvictResponse> r = ctx.clients[i]->Evict(req);
    if (!r.ok()) {
      // A key or prefix lives on some nodes only.
      if (r.status().code() == StatusCode::kNotFound && !req.has_filter()) {
        ++t.missing;
        t.not_found = r.status();
      } else {
        t.failed.push_back({i, r.status()});
      }
      continue;
    }
    t.evicted += r->evicted();
    t.deferred += r->deferred();
    t.pinned += r->skipped_pinned();
    t.bytes += r->bytes();
    for (const v1::EntryInfo& e : r->entries()) t.rows.push_back({i, e});
  }
  return t;
}

// Leased entries are not forced: the node frees them when the lease ends.
std::string EvictStatus(const v1::EntryInfo& e, bool dry_run) {
  if (e.live_leases() > 0) return "deferred";
  return dry_run ? "would evict" : "evicted";
}

int PrintEvictJson(Context& ctx, const EvictOptions& o, const EvictTally& t) {
  Json entries = Json::MakeArray();
  for (const EvictTally::Row& r : t.rows) {
    Json e = EntryJson(r.entry);
    e.Set("node", ctx.clients[r.node]->address());
    e.Set("status", EvictStatus(r.entry, o.dry_run));
    entries.Push(std::move(e));
  }
  Json out = Json::MakeObject();
  out.Set("dry_run", o.dry_run)
      .Set("evicted", t.evicted)
      .Set("deferred", t.deferred)
      .Set("skipped_pinned", t.pinned)
      .Set("bytes", t.bytes)
      .Set("entries", std::move(entries));
  const int code = ReportNodeFailures(ctx, t.failed, &out);
  std::printf("%s\n", out.Dump().c_str());
  return code;
}

int PrintEvictTable(Context& ctx, const EvictOptions& o, const EvictTally& t) {
  std::vector<std::string> headers = {"STATUS", "KEY", "KIND", "NAMESPACE", "PAYLOAD", "LEASES"};
  if (ctx.many()) headers.insert(headers.begin(), "NODE");
  Table table(headers);
  for (const EvictTally::Row& r : t.rows) {
    std::vector<std::string> cells = {EvictStatus(r.entry, o.dry_run),
                                      Hex(r.entry.key()),
                                      KindName(r.entry.kind()),
                                      r.entry.namespace_(),
                                      FormatBytes(r.entry.payload_bytes()),
                                      std::to_string(r.entry.live_leases())};
    if (ctx.many()) cells.insert(cells.begin(), ctx.clients[r.node]->address());
    table.AddRow(std::move(cells));
  }
  if (table.rows() > 0) table.Print(stdout);
  std::printf("%s%lu entries (%s)%s, %lu deferred (leased: freed when released), %lu pinned kept\n",
              o.dry_run ? "dry run: would evict " : "evicted ",
              static_cast<unsigned long>(t.evicted), FormatBytes(t.bytes).c_str(),
              o.dry_run ? "; nothing was removed" : "", static_cast<unsigned long>(t.deferred),
              static_cast<unsigned long>(t.pinned));
  return ReportNodeFailures(ctx, t.failed, nullptr);
}

int RunEvict(Context& ctx, const EvictOptions& o) {
  v1::EvictRequest req;
  if (Status st = BuildEvictRequest(ctx, o, &req); !st.ok()) return ctx.Fail(st);
  const EvictTally t = EvictOnNodes(ctx, req);
  if (!t.failed.empty() && t.failed.size() + t.missing == ctx.clients.size()) {
    return ctx.Fail(t.failed.front().status);  // no node evicted anything
  }
  if (t.missing == ctx.clients.size()) {
    return ctx.Fail(
        ctx.many() ? NotFound("no such key on any of the " + std::to_string(t.missing) + " nodes")
                   : t.not_found);
  }
  return ctx.json ? PrintEvictJson(ctx, o, t) : PrintEvictTable(ctx, o, t);
}

}  // namespace

void AddEntryCommands(CLI::App& app, Runner* run) {
  auto ls = std::make_shared<LsOptions>();
  CLI::App* ls_cmd = app.add_subcommand("ls", "List entries: filtered, paginated, sortable");
  AddFilterOptions(ls_cmd, &ls->filter, /*with_model=*/true);
  ls_cmd->add_option("--tier", ls->filter.tier, "dram or ssd");
  ls_cmd->add_flag("--pinned", ls->filter.pinned, "Only pinned entries");
  ls_cmd->add_flag("--unpinned", ls->filter.unpinned, "Only unpinned entries");
  ls_cmd->add_option("--page-size", ls->page_size, "Entries per page")
      ->check(CLI::Range(1u, static_cast<uint32_t>(kMaxBlocksPerCall)));
  ls_cmd->add_option("--page-token", ls->page_token, "Continue where the last page ended");
  ls_cmd->add_flag("--all", ls->all, "Every page");
  ls_cmd->add_option("--sort", ls->sort, "key, age, size, hits or expires");
  ls_cmd->add_flag("--reverse", ls->reverse, "Descending");
  ls_cmd->callback([run, ls] { *run = [ls](Context& ctx) { return RunLs(ctx, *ls); }; });

  auto inspect = std::make_shared<EntryArgs>();
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "Every field of an entry, its replicas, live leases");
  AddEntryArgs(inspect_cmd, inspect.get());
  inspect_cmd->callback(
      [run, inspect] { *run = [inspect](Context& ctx) { return RunInspect(ctx, *inspect); }; });

  auto pin = std::make_shared<EntryArgs>();
  auto pin_ttl = std::make_shared<std::string>();
  CLI::App* pin_cmd = app.add_subcommand("pin", "Keep an entry from eviction for a while");
  AddEntryArgs(pin_cmd, pin.get());
  pin_cmd->add_option("--ttl", *pin_ttl, "How long (90s, 15m, 2h, 3d; at most 30d)")->required();
  pin_cmd->callback([run, pin, pin_ttl] {
    *run = [pin, pin_ttl](Context& ctx) {
      Result<uint64_t> ttl = ParseDuration(*pin_ttl);
      if (!ttl.ok()) return ctx.Fail(ttl.status());
      if (*ttl == 0) return ctx.Fail(InvalidArgument("--ttl must be positive; unpin ends a pin"));
      // Checked here: the request carries 32 bits, and a wrapped 0 unpins.
      if (*ttl > kMaxPinTtlSeconds) return ctx.Fail(InvalidArgument("--ttl must be at most 30d"));
      return RunPin(ctx, *pin, *ttl);
    };
  });

  auto unpin = std::make_shared<EntryArgs>();
  CLI::App* unpin_cmd = app.add_subcommand("unpin", "End an entry's pin");
  AddEntryArgs(unpin_cmd, unpin.get());
  unpin_cmd->callback(
      [run, unpin] { *run = [unpin](Context& ctx) { return RunPin(ctx, *unpin, 0); }; });

  auto evict = std::make_shared<EvictOptions>();
  CLI::App* evict_cmd = app.add_subcommand(
      "evict", "Evict by key, prompt prefix, namespace, model or age (--dry-run lists only)");
  evict_cmd->add_option("key", evict->key, "Chain key, 32 hex digits (with its descendants)");
  evict_cmd->add_option("--key-kind", evict->key_kind, "Kind of KEY: global or swa");
  AddFilterOptions(evict_cmd, &evict->filter, /*with_model=*/true);
  evict_cmd->add_option("--tokens-file", evict->prompt.tokens_file,
                        "A prompt prefix (with --model): its last block and descendants");
  evict_cmd->add_option("--block-tokens", evict->prompt.block_tokens, "Tokens per block")
      ->check(CLI::Range(kMinBlockTokens, kMaxBlockTokens));
  evict_cmd->add_option("--extra", evict->prompt.extra,
                        "What fed key[0] besides model and namespace");
  evict_cmd->add_flag("--all", evict->all, "Every unpinned entry of the namespace");
  evict_cmd->add_flag("--dry-run", evict->dry_run, "List what would go; remove nothing");
  evict_cmd->add_option("--max-listed", evict->max_listed, "Entries listed per node")
      ->check(CLI::Range(1u, static_cast<uint32_t>(kMaxBlocksPerCall)));
  evict_cmd->callback(
      [run, evict] { *run = [evict](Context& ctx) { return RunEvict(ctx, *evict); }; });
}

}  // namespace strata::admin

// strata-admin end to end: the real binary against a real strata-node,
// with entries put in through the client library. Asserts on the human
// output and on the --json output (parsed), errors and exit codes included.
#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "node_test_util.h"

namespace strata::testing {
namespace {

using google::protobuf::Value;

struct AdminRun {
  int code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs strata-admin with `args`; STRATA_* variables come only from `env`.
AdminRun RunAdmin(const std::string& dir, const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env = {}) {
  static int counter = 0;
  const std::string out_path = dir + "/admin-" + std::to_string(++counter) + ".out";
  const std::string err_path = dir + "/admin-" + std::to_string(counter) + ".err";
  std::vector<std::string> argv_s = {STRATA_ADMIN_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_s.size() + 1);
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("STRATA_")) continue;
    env_s.emplace_back(*e);
  }
  for (const auto& [k, v] : env) env_s.push_back(std::string(k).append("=").append(v));
  std::vector<char*> envp;
  envp.reserve(env_s.size() + 1);
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  AdminRun run;
  if (rc != 0) {
    run.err = "cannot spawn strata-admin";
    return run;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = ReadFile(out_path);
  run.err = ReadFile(err_path);
  return run;
}

Value ParseJson(const std::string& text) {
  Value v;
  const auto st = google::protobuf::util::JsonStringToMessage(text, &v);
  EXPECT_TRUE(st.ok()) << "not JSON: " << text;
  return v;
}
const Value& F(const Value& v, const std::string& name) {
  static const Value kNull;
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(name);
  EXPECT_TRUE(it != fields.end()) << "no field '" << name << "'";
  return it == fields.end() ? kNull : it->second;
}
const Value& At(const Value& v, int i) {
  static const Value kNull;
  EXPECT_LT(i, v.list_value().values_size());
  return i < v.list_value().values_size() ? v.list_value().values(i) : kNull;
}
int Size(const Value& v) { return v.list_value().values_size(); }
double Num(const Value& v) { return v.number_value(); }
const std::string& Str(const Value& v) { return v.string_value(); }

std::string Hex(const ChainKey& k) { return k.ToHex(); }

class AdminCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("admin-cli");
    std::string error;
    node_ = NodeProcess::Start(dir_, {}, &error);
    ASSERT_NE(node_, nullptr) << error;
    store_a_ = Open(*node_, kTokenA.token);
    store_b_ = Open(*node_, kTokenB.token);
    ASSERT_NE(store_a_, nullptr);
    ASSERT_NE(store_b_, nullptr);
  }
  void TearDown() override {
    store_a_.reset();
    store_b_.reset();
    if (node_ != nullptr) node_->Terminate();
  }

  // strata-admin against the node with a token.
  AdminRun Admin(const char* token, std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", node_->uri(), "--token", token});
    return RunAdmin(dir_, args);
  }
  Value AdminJson(const char* token, std::vector<std::string> args, int want_code = 0) {
    args.emplace_back("--json");
    AdminRun r = Admin(token, args);
    EXPECT_EQ(r.code, want_code) << r.out << r.err;
    return ParseJson(r.out);
  }
  std::string TokensFile(const std::vector<uint32_t>& tokens, size_t count) {
    std::string path = dir_ + "/tokens-" + std::to_string(++files_) + ".txt";
    std::ofstream out(path);
    out << "# a prompt\n";
    for (size_t i = 0; i < count; ++i) out << tokens[i] << (i % 16 == 15 ? "\n" : " ");
    return path;
  }

  std::string dir_;
  std::unique_ptr<NodeProcess> node_;
  std::unique_ptr<Store> store_a_, store_b_;
  int files_ = 0;
};

const char* const kAdminA = kTokenAdminA.token;
const char* const kOperator = kTokenOperator.token;

TEST_F(AdminCliTest, NodesShowsTheNodeServingWithItsTiers) {
  AdminRun human = Admin(kTokenReadA.token, {"nodes"});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("NODE"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("DRAM CAPACITY"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find(node_->target()), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("serving"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("256.0 MiB"), std::string::npos) << human.out;

  const Value j = AdminJson(kTokenReadA.token, {"nodes"});
  ASSERT_EQ(Size(F(j, "nodes")), 1);
  const Value& n = At(F(j, "nodes"), 0);
  EXPECT_EQ(Str(F(n, "address")), node_->target());
  EXPECT_EQ(Str(F(n, "state")), "serving");
  EXPECT_EQ(Num(F(n, "dram_capacity_bytes")), 256.0 * 1024 * 1024);
  EXPECT_EQ(Num(F(n, "dram_used_bytes")), 0);
  EXPECT_FALSE(Str(F(n, "node_id")).empty());
  EXPECT_TRUE(F(n, "rdma_devices").has_list_value());
}

TEST_F(AdminCliTest, StatsCountWhatTheTestDid) {
  Prompt p = MakePrompt(*store_a_, 2, 11);
  CommitAll(*store_a_, p, /*with_swa=*/true);
  const Value before = AdminJson(kAdminA, {"stats"});
  const Value& b = At(F(before, "nodes"), 0);
  auto m = MatchPrompt(*store_a_, p, /*lease=*/true);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 2u);

  const Value after = AdminJson(kAdminA, {"stats"});
  const Value& a = At(F(after, "nodes"), 0);
  EXPECT_EQ(Num(F(a, "lookups")) - Num(F(b, "lookups")), 1);
  EXPECT_EQ(Num(F(a, "prompt_tokens")) - Num(F(b, "prompt_tokens")), 512);
  EXPECT_EQ(Num(F(a, "hit_tokens")) - Num(F(b, "hit_tokens")), 512);
  EXPECT_EQ(Num(F(a, "hit_bytes")) - Num(F(b, "hit_bytes")),
            static_cast<double>(p.blocks[0].bytes.size() + p.blocks[1].bytes.size()));
  // A tenant's stats are its namespace's own (issue #38).
  EXPECT_EQ(Str(F(a, "scope")), "namespace");
  EXPECT_EQ(Num(F(F(a, "dram"), "global_kv_entries")), 2);
  EXPECT_EQ(Num(F(F(a, "dram"), "swa_entries")), 1);
  EXPECT_TRUE(F(F(F(a, "dram"), "evictions"), "explicit").has_number_value());
  EXPECT_GT(Num(F(a, "uptime_ms")), 0);
  // The tenant's lease pins its two blocks and the SWA entry, once each.
  const Value& held = F(a, "namespace_leases");
  EXPECT_EQ(Num(F(held, "entries")), 3);
  EXPECT_GE(Num(F(held, "held_bytes")), Num(F(F(a, "dram"), "used_bytes")));
  EXPECT_GT(Num(F(held, "limit_bytes")), Num(F(held, "held_bytes")));
  // Node-wide figures, and which namespaces hold entries, are the
  // operator's; it holds no leases of its own.
  for (const char* node_wide : {"namespaces", "read_leases", "ssd", "data_plane"}) {
    EXPECT_FALSE(a.struct_value().fields().contains(node_wide)) << node_wide;
  }
  const Value op = At(F(AdminJson(kOperator, {"stats"}), "nodes"), 0);
  EXPECT_EQ(Str(F(op, "scope")), "node");
  ASSERT_EQ(Size(F(op, "namespaces")), 1);
  EXPECT_EQ(Str(At(F(op, "namespaces"), 0)), "tenant-a");
  EXPECT_FALSE(op.struct_value().fields().contains("namespace_leases"));
  EXPECT_EQ(Num(F(op, "read_leases")), 1);  // the match's lease
  EXPECT_EQ(Num(F(F(op, "dram"), "payload_bytes")),
            static_cast<double>(p.blocks[0].bytes.size() + p.blocks[1].bytes.size() +
                                p.swa.bytes.size()));
  EXPECT_EQ(Num(F(op, "checksum_failures")), 0);
  EXPECT_FALSE(F(F(op, "ssd"), "enabled").bool_value());

  AdminRun human = Admin(kAdminA, {"stats", "--node", Str(F(a, "node_id"))});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_TRUE(std::regex_search(
      human.out, std::regex("hit tokens: +" +
                            std::to_string(static_cast<uint64_t>(Num(F(a, "hit_tokens")))) + "\n")))
      << human.out;
  EXPECT_NE(human.out.find("your namespace's figures only"), std::string::npos) << human.out;
  EXPECT_EQ(human.out.find("live leases"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("2 global + 1 swa entries"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("3 of " +
                           std::to_string(static_cast<uint64_t>(Num(F(held, "entries_limit")))) +
                           " entries"),
            std::string::npos)
      << human.out;
  AdminRun op_human = Admin(kOperator, {"stats", "--node", Str(F(a, "node_id"))});
  ASSERT_EQ(op_human.code, 0) << op_human.err;
  EXPECT_NE(op_human.out.find("live leases:       1 read, 0 write"), std::string::npos)
      << op_human.out;
  ASSERT_TRUE(store_a_->Abort(m->lease).ok());
}

TEST_F(AdminCliTest, StatsAndNodesShowTheSsdTier) {
  std::string error;
  auto ssd_node = NodeProcess::Start(
      dir_,
      {.port = 0, .settings = {"ssd_dir=" + dir_ + "/ssd", "ssd_bytes=128MiB", "ssd_sync=false"}},
      &error);
  ASSERT_NE(ssd_node, nullptr) << error;
  auto store = Open(*ssd_node, kTokenA.token);
  ASSERT_NE(store, nullptr);
  Prompt p = MakePrompt(*store, 2, 141);
  CommitAll(*store, p, /*with_swa=*/false);
  // The SSD tier's figures are node-wide: the operator's.
  const std::vector<std::string> args = {"--store", ssd_node->uri(), "--token",
                                         kOperator, "stats",         "--json"};
  // Write-back is asynchronous: wait until both blocks are on SSD.
  Value ssd;
  for (int i = 0; i < 200; ++i) {
    AdminRun r = RunAdmin(dir_, args);
    ASSERT_EQ(r.code, 0) << r.err;
    ssd = F(At(F(ParseJson(r.out), "nodes"), 0), "ssd");
    if (Num(F(ssd, "entries")) == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(F(ssd, "enabled").bool_value());
  EXPECT_EQ(Num(F(ssd, "entries")), 2);
  EXPECT_EQ(Num(F(ssd, "capacity_bytes")), 128.0 * 1024 * 1024);
  EXPECT_GE(Num(F(ssd, "used_bytes")),
            static_cast<double>(p.blocks[0].bytes.size() + p.blocks[1].bytes.size()));

  AdminRun human = RunAdmin(dir_, {"--store", ssd_node->uri(), "--token", kOperator, "nodes"});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("128.0 MiB"), std::string::npos) << human.out;
  AdminRun stats = RunAdmin(dir_, {"--store", ssd_node->uri(), "--token", kOperator, "stats"});
  EXPECT_NE(stats.out.find("of 128.0 MiB, 2 entries"), std::string::npos) << stats.out;
  store.reset();
  ssd_node->Terminate();
}

TEST_F(AdminCliTest, LsFiltersPaginatesAndSorts) {
  Prompt p = MakePrompt(*store_a_, 3, 21);
  CommitAll(*store_a_, p, /*with_swa=*/true);
  Prompt other = MakePrompt(*store_b_, 2, 22);  // another tenant: never listed for tenant-a
  CommitAll(*store_b_, other, /*with_swa=*/false);

  const Value all = AdminJson(kAdminA, {"ls"});
  ASSERT_EQ(Size(F(all, "entries")), 4);
  EXPECT_TRUE(F(all, "next_page_token").has_null_value());
  std::set<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    const Value& e = At(F(all, "entries"), i);
    EXPECT_EQ(Str(F(e, "namespace")), "tenant-a");
    EXPECT_EQ(Str(F(e, "model_id")), TestModel().ToHex());
    EXPECT_EQ(Str(F(e, "tier")), "dram");
    keys.insert(Str(F(e, "key")) + "/" + Str(F(e, "kind")));
  }
  for (size_t b = 1; b <= 3; ++b) EXPECT_TRUE(keys.contains(Hex(p.keys[b]) + "/global"));
  EXPECT_TRUE(keys.contains(Hex(p.keys[3]) + "/swa"));

  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--kind", "swa"}), "entries")), 1);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--kind", "global"}), "entries")), 3);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--model", TestModel().ToHex()}), "entries")), 4);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--model", std::string(32, 'a')}), "entries")), 0);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--pinned"}), "entries")), 0);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--unpinned"}), "entries")), 4);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--older-than", "1h"}), "entries")), 0);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--tier", "dram"}), "entries")), 4);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--tier", "ssd"}), "entries")), 0);
  // The operator names the namespace.
  EXPECT_EQ(Size(F(AdminJson(kOperator, {"ls", "--namespace", "tenant-b"}), "entries")), 2);

  // Pages of 3 then 1, together the whole listing.
  const Value page1 = AdminJson(kAdminA, {"ls", "--page-size", "3"});
  ASSERT_EQ(Size(F(page1, "entries")), 3);
  const std::string token = Str(F(page1, "next_page_token"));
  ASSERT_FALSE(token.empty());
  const Value page2 = AdminJson(kAdminA, {"ls", "--page-size", "3", "--page-token", token});
  ASSERT_EQ(Size(F(page2, "entries")), 1);
  EXPECT_TRUE(F(page2, "next_page_token").has_null_value());
  std::set<std::string> paged;
  for (const Value* page : {&page1, &page2}) {
    for (int i = 0; i < Size(F(*page, "entries")); ++i) {
      const Value& e = At(F(*page, "entries"), i);
      paged.insert(Str(F(e, "key")) + "/" + Str(F(e, "kind")));
    }
  }
  EXPECT_EQ(paged, keys);

  // Largest first: the SWA state and the global blocks differ in size.
  ASSERT_NE(p.swa.bytes.size(), p.blocks[0].bytes.size());
  const bool swa_larger = p.swa.bytes.size() > p.blocks[0].bytes.size();
  const Value by_size = AdminJson(kAdminA, {"ls", "--sort", "size", "--reverse"});
  ASSERT_EQ(Size(F(by_size, "entries")), 4);
  EXPECT_EQ(Str(F(At(F(by_size, "entries"), 0), "kind")), swa_larger ? "swa" : "global");
  EXPECT_EQ(Str(F(At(F(by_size, "entries"), 3), "kind")), swa_larger ? "global" : "swa");
  for (int i = 1; i < 4; ++i) {
    EXPECT_GE(Num(F(At(F(by_size, "entries"), i - 1), "payload_bytes")),
              Num(F(At(F(by_size, "entries"), i), "payload_bytes")));
  }

  AdminRun human = Admin(kAdminA, {"ls", "--page-size", "3"});
  ASSERT_EQ(human.code, 0) << human.err;
  for (const char* col : {"KEY", "KIND", "NAMESPACE", "TIER", "PAYLOAD", "LEASES", "HITS"}) {
    EXPECT_NE(human.out.find(col), std::string::npos) << col << "\n" << human.out;
  }
  EXPECT_NE(human.out.find("3 entries; next page: --page-token " + token), std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("tenant-a"), std::string::npos);
  EXPECT_EQ(human.out.find(Hex(other.keys[1])), std::string::npos) << "tenant-b leaked";
}

TEST_F(AdminCliTest, InspectShowsEveryFieldAndLiveLeases) {
  Prompt p = MakePrompt(*store_a_, 2, 31);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  const Value j = AdminJson(kAdminA, {"inspect", Hex(p.keys[1])});
  const Value& e = F(j, "entry");
  EXPECT_EQ(Str(F(e, "key")), Hex(p.keys[1]));
  EXPECT_EQ(Str(F(e, "kind")), "global");
  EXPECT_EQ(Str(F(e, "namespace")), "tenant-a");
  EXPECT_EQ(Num(F(e, "payload_bytes")), static_cast<double>(p.blocks[0].bytes.size()));
  EXPECT_EQ(Num(F(e, "layout_id")), kV41GlobalKvLayoutId);
  EXPECT_FALSE(F(e, "has_parent").bool_value());
  EXPECT_EQ(Num(F(e, "children")), 1);
  EXPECT_FALSE(F(e, "pinned").bool_value());
  EXPECT_EQ(Num(F(j, "live_leases")), 0);
  ASSERT_EQ(Size(F(j, "replicas")), 1);
  EXPECT_EQ(Str(F(At(F(j, "replicas"), 0), "node")), node_->target());

  auto m = MatchPrompt(*store_a_, p, /*lease=*/true);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(Num(F(AdminJson(kAdminA, {"inspect", Hex(p.keys[2])}), "live_leases")), 1);
  AdminRun human = Admin(kAdminA, {"inspect", Hex(p.keys[2])});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("key:         " + Hex(p.keys[2])), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("live leases: 1"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("parent:      yes"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("replicas:    1: " + node_->target()), std::string::npos) << human.out;
  ASSERT_TRUE(store_a_->Abort(m->lease).ok());

  // No such key: exit 5, in words and in JSON.
  const std::string missing(32, '7');
  AdminRun none = Admin(kAdminA, {"inspect", missing});
  EXPECT_EQ(none.code, 5) << none.out << none.err;
  EXPECT_NE(none.err.find("not found on node " + node_->target()), std::string::npos) << none.err;
  EXPECT_NE(none.err.find(missing), std::string::npos) << none.err;
  const Value err = AdminJson(kAdminA, {"inspect", missing}, 5);
  EXPECT_EQ(Str(F(F(err, "error"), "code")), "NOT_FOUND");
  EXPECT_EQ(Num(F(F(err, "error"), "exit_code")), 5);
  // A key that is not a key.
  AdminRun bad = Admin(kAdminA, {"inspect", "xyz"});
  EXPECT_EQ(bad.code, 6) << bad.err;
  EXPECT_NE(bad.err.find("not a chain key"), std::string::npos) << bad.err;
}

TEST_F(AdminCliTest, PrefixReportsHitsTierNodeAndFirstMissingBlock) {
  Prompt p = MakePrompt(*store_a_, 4, 41);
  auto payloads = Payloads(p, 0, 2, /*with_swa=*/true);  // blocks 0-1, SWA at boundary 2
  auto r = store_a_->Commit(TestModel(), payloads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string tokens = TokensFile(p.tokens, p.tokens.size() - 10);  // a partial tail
  const Value before = AdminJson(kAdminA, {"stats"});

  const Value j =
      AdminJson(kAdminA, {"prefix", "--model", TestModel().ToHex(), "--tokens-file", tokens});
  ASSERT_EQ(Size(F(j, "blocks")), 3);  // the 4th block is not full
  EXPECT_EQ(Str(F(j, "namespace")), "tenant-a");
  EXPECT_EQ(Num(F(j, "hit_blocks")), 2);
  EXPECT_EQ(Num(F(j, "hit_tokens")), 512);
  EXPECT_EQ(Num(F(j, "first_missing_block")), 2);
  EXPECT_EQ(Num(F(j, "unkeyed_tail_tokens")), 246);
  for (int b = 0; b < 3; ++b) {
    const Value& blk = At(F(j, "blocks"), b);
    EXPECT_EQ(Str(F(blk, "key")), Hex(p.keys[static_cast<size_t>(b) + 1])) << b;
    EXPECT_EQ(F(blk, "hit").bool_value(), b < 2) << b;
  }
  EXPECT_EQ(Str(F(At(F(j, "blocks"), 0), "tier")), "dram");
  EXPECT_EQ(Str(F(At(F(j, "blocks"), 0), "node")), node_->target());
  EXPECT_FALSE(Str(F(At(F(j, "blocks"), 0), "node_id")).empty());
  EXPECT_TRUE(F(At(F(j, "blocks"), 1), "swa").bool_value());
  EXPECT_FALSE(F(At(F(j, "blocks"), 0), "swa").bool_value());
  EXPECT_TRUE(F(At(F(j, "blocks"), 2), "tier").has_null_value());
  // An operator's probe: no lookup counted.
  const Value after = AdminJson(kAdminA, {"stats"});
  EXPECT_EQ(Num(F(At(F(after, "nodes"), 0), "lookups")),
            Num(F(At(F(before, "nodes"), 0), "lookups")));

  AdminRun human =
      Admin(kAdminA, {"prefix", "--model", TestModel().ToHex(), "--tokens-file", tokens});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("2 of 3 blocks hit (512 tokens); first missing block: 2"),
            std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("miss"), std::string::npos);
  EXPECT_NE(human.out.find(Hex(p.keys[3])), std::string::npos);

  // Another model's keys: nothing hits. The worker's seed:N form resolves too.
  const Value cold = AdminJson(kAdminA, {"prefix", "--model", "seed:1", "--tokens-file", tokens});
  EXPECT_EQ(Num(F(cold, "hit_blocks")), 0);
  EXPECT_EQ(Num(F(cold, "first_missing_block")), 0);

  // The operator token must name the namespace; then it sees the same.
  AdminRun op =
      Admin(kOperator, {"prefix", "--model", TestModel().ToHex(), "--tokens-file", tokens});
  EXPECT_EQ(op.code, 6) << op.err;
  EXPECT_NE(op.err.find("--namespace"), std::string::npos) << op.err;
  const Value as_op = AdminJson(kOperator, {"prefix", "--model", TestModel().ToHex(),
                                            "--tokens-file", tokens, "--namespace", "tenant-a"});
  EXPECT_EQ(Num(F(as_op, "hit_blocks")), 2);

  // A malformed tokens file names the line.
  const std::string bad = dir_ + "/bad-tokens.txt";
  std::ofstream(bad) << "1 2 3\n4 five 6\n";
  AdminRun bad_run =
      Admin(kAdminA, {"prefix", "--model", TestModel().ToHex(), "--tokens-file", bad});
  EXPECT_EQ(bad_run.code, 6);
  EXPECT_NE(bad_run.err.find("bad-tokens.txt:2: 'five'"), std::string::npos) << bad_run.err;
  // An empty prompt has nothing to look up: said, not "0 of 0 blocks hit".
  const std::string empty = dir_ + "/empty-tokens.txt";
  std::ofstream(empty) << "# nothing\n";
  AdminRun empty_run =
      Admin(kAdminA, {"prefix", "--model", TestModel().ToHex(), "--tokens-file", empty});
  EXPECT_EQ(empty_run.code, 6);
  EXPECT_NE(empty_run.err.find("the prompt (0 tokens) has no full block"), std::string::npos)
      << empty_run.err;
}

TEST_F(AdminCliTest, EvictByKeyDryRunKeepsEverythingThenRemoves) {
  Prompt p = MakePrompt(*store_a_, 3, 51);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  const Value dry = AdminJson(kAdminA, {"evict", Hex(p.keys[1]), "--dry-run"});
  EXPECT_TRUE(F(dry, "dry_run").bool_value());
  EXPECT_EQ(Num(F(dry, "evicted")), 3);  // the block and its two descendants
  EXPECT_EQ(Num(F(dry, "deferred")), 0);
  ASSERT_EQ(Size(F(dry, "entries")), 3);
  EXPECT_EQ(Str(F(At(F(dry, "entries"), 0), "status")), "would evict");
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 3) << "a dry run removed entries";

  AdminRun human = Admin(kAdminA, {"evict", Hex(p.keys[2]), "--dry-run"});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("dry run: would evict 2 entries"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("nothing was removed"), std::string::npos) << human.out;

  const Value real = AdminJson(kAdminA, {"evict", Hex(p.keys[2])});
  EXPECT_EQ(Num(F(real, "evicted")), 2);
  EXPECT_EQ(Str(F(At(F(real, "entries"), 0), "status")), "evicted");
  EXPECT_EQ(Admin(kAdminA, {"inspect", Hex(p.keys[2])}).code, 5);
  EXPECT_EQ(Admin(kAdminA, {"inspect", Hex(p.keys[3])}).code, 5);
  EXPECT_EQ(Admin(kAdminA, {"inspect", Hex(p.keys[1])}).code, 0);
  // Evicting a key that is gone: exit 5.
  EXPECT_EQ(Admin(kAdminA, {"evict", Hex(p.keys[2])}).code, 5);
}

TEST_F(AdminCliTest, EvictByPromptPrefixTakesTheLastBlockAndDescendants) {
  Prompt p = MakePrompt(*store_a_, 3, 61);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  const std::string two_blocks = TokensFile(p.tokens, 512);
  const Value dry = AdminJson(
      kAdminA, {"evict", "--model", TestModel().ToHex(), "--tokens-file", two_blocks, "--dry-run"});
  EXPECT_EQ(Num(F(dry, "evicted")), 2);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 3);
  const Value real =
      AdminJson(kAdminA, {"evict", "--model", TestModel().ToHex(), "--tokens-file", two_blocks});
  EXPECT_EQ(Num(F(real, "evicted")), 2);
  const Value left = AdminJson(kAdminA, {"ls"});
  ASSERT_EQ(Size(F(left, "entries")), 1);
  EXPECT_EQ(Str(F(At(F(left, "entries"), 0), "key")), Hex(p.keys[1]));
}

TEST_F(AdminCliTest, EvictByNamespaceModelAndAge) {
  Prompt a = MakePrompt(*store_a_, 2, 71);
  CommitAll(*store_a_, a, /*with_swa=*/false);
  Prompt b = MakePrompt(*store_b_, 2, 72);
  CommitAll(*store_b_, b, /*with_swa=*/true);

  // By namespace, as the operator: tenant-b only.
  const Value dry =
      AdminJson(kOperator, {"evict", "--namespace", "tenant-b", "--all", "--dry-run"});
  EXPECT_EQ(Num(F(dry, "evicted")), 3);
  EXPECT_EQ(Size(F(AdminJson(kOperator, {"ls", "--namespace", "tenant-b"}), "entries")), 3);
  const Value real = AdminJson(kOperator, {"evict", "--namespace", "tenant-b", "--all"});
  EXPECT_EQ(Num(F(real, "evicted")), 3);
  EXPECT_EQ(Size(F(AdminJson(kOperator, {"ls", "--namespace", "tenant-b"}), "entries")), 0);
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 2) << "tenant-a was touched";

  // By model: a second model's entries only.
  ModelId other_model = TestModel();
  other_model.bytes[0] ^= 0xff;
  Prompt c = MakePrompt(*store_a_, 1, 73);
  auto committed = store_a_->Commit(other_model, Payloads(c, 0, 1, false));
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  const Value by_model = AdminJson(kAdminA, {"evict", "--model", other_model.ToHex()});
  EXPECT_EQ(Num(F(by_model, "evicted")), 1);
  EXPECT_EQ(Str(F(At(F(by_model, "entries"), 0), "key")), Hex(c.keys[1]));
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 2);

  // By age: what was committed a second ago goes, what is new stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  Prompt d = MakePrompt(*store_a_, 1, 74);
  CommitAll(*store_a_, d, /*with_swa=*/false);
  const Value by_age = AdminJson(kAdminA, {"evict", "--older-than", "1s"});
  EXPECT_EQ(Num(F(by_age, "evicted")), 2);
  const Value left = AdminJson(kAdminA, {"ls"});
  ASSERT_EQ(Size(F(left, "entries")), 1);
  EXPECT_EQ(Str(F(At(F(left, "entries"), 0), "key")), Hex(d.keys[1]));

  // An age of 0 reads as "any age" on the node: refused, nothing goes.
  AdminRun zero = Admin(kAdminA, {"evict", "--older-than", "0s"});
  EXPECT_EQ(zero.code, 6);
  EXPECT_NE(zero.err.find("--older-than must be positive"), std::string::npos) << zero.err;
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 1);

  // No target at all is refused, not taken as "everything".
  AdminRun none = Admin(kAdminA, {"evict"});
  EXPECT_EQ(none.code, 6);
  EXPECT_NE(none.err.find("exactly one target"), std::string::npos) << none.err;
}

TEST_F(AdminCliTest, LeasedEntriesAreDeferredNotForced) {
  Prompt p = MakePrompt(*store_a_, 2, 81);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  auto m = MatchPrompt(*store_a_, p, /*lease=*/true);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->blocks.size(), 2u);
  const Value j = AdminJson(kAdminA, {"evict", Hex(p.keys[1])});
  EXPECT_EQ(Num(F(j, "deferred")), 2);
  EXPECT_EQ(Num(F(j, "evicted")), 0);
  EXPECT_EQ(Str(F(At(F(j, "entries"), 0), "status")), "deferred");
  // The leased bytes are still readable by the lease holder.
  Fetched f = FetchAll(*store_a_, *m);
  EXPECT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  EXPECT_EQ(f.outcome.blocks_ready, 2u);
  ASSERT_TRUE(store_a_->Abort(m->lease).ok());
  EXPECT_EQ(Admin(kAdminA, {"inspect", Hex(p.keys[1])}).code, 5);

  Prompt q = MakePrompt(*store_a_, 1, 82);
  CommitAll(*store_a_, q, /*with_swa=*/false);
  auto mq = MatchPrompt(*store_a_, q, /*lease=*/true);
  ASSERT_TRUE(mq.ok());
  AdminRun human = Admin(kAdminA, {"evict", Hex(q.keys[1])});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("deferred"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("1 deferred (leased: freed when released)"), std::string::npos)
      << human.out;
  ASSERT_TRUE(store_a_->Abort(mq->lease).ok());
}

TEST_F(AdminCliTest, PinAndUnpinWithTtl) {
  Prompt p = MakePrompt(*store_a_, 2, 91);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  const std::string key = Hex(p.keys[2]);
  AdminRun pin = Admin(kAdminA, {"pin", key, "--ttl", "2h"});
  ASSERT_EQ(pin.code, 0) << pin.err;
  EXPECT_NE(pin.out.find("pinned global " + key + " for 2h00m"), std::string::npos) << pin.out;
  const Value e = F(AdminJson(kAdminA, {"inspect", key}), "entry");
  EXPECT_TRUE(F(e, "pinned").bool_value());
  EXPECT_GT(Num(F(e, "pinned_for_ms")), 7100e3);
  EXPECT_LE(Num(F(e, "pinned_for_ms")), 7200e3);
  // 2^32 s would wrap to 0 in the request, which unpins: refused here.
  EXPECT_EQ(Admin(kAdminA, {"pin", key, "--ttl", "4294967296"}).code, 6);
  EXPECT_TRUE(F(F(AdminJson(kAdminA, {"inspect", key}), "entry"), "pinned").bool_value());
  const Value pinned = AdminJson(kAdminA, {"ls", "--pinned"});
  ASSERT_EQ(Size(F(pinned, "entries")), 1);
  EXPECT_EQ(Str(F(At(F(pinned, "entries"), 0), "key")), key);
  // A filter eviction keeps the pinned entry and its ancestor.
  const Value kept = AdminJson(kAdminA, {"evict", "--all", "--dry-run"});
  EXPECT_EQ(Num(F(kept, "skipped_pinned")), 2);
  EXPECT_EQ(Num(F(kept, "evicted")), 0);

  const Value unpin = AdminJson(kAdminA, {"unpin", key});
  EXPECT_FALSE(F(unpin, "pinned").bool_value());
  EXPECT_FALSE(F(F(AdminJson(kAdminA, {"inspect", key}), "entry"), "pinned").bool_value());
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls", "--pinned"}), "entries")), 0);
  EXPECT_EQ(Admin(kAdminA, {"pin", key, "--ttl", "31d"}).code, 6);
  EXPECT_EQ(Admin(kAdminA, {"pin", std::string(32, '0'), "--ttl", "1h"}).code, 5);
}

TEST_F(AdminCliTest, DrainRefusesWritesAndShowsInNodes) {
  std::string error;
  auto second = NodeProcess::Start(dir_, {}, &error);
  ASSERT_NE(second, nullptr) << error;
  const std::string both = node_->uri() + "," + second->target();
  auto admin2 = [&](const char* token, std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", both, "--token", token});
    return RunAdmin(dir_, args);
  };
  // A tenant's admin token may not drain a node.
  AdminRun denied = admin2(kAdminA, {"drain", second->target()});
  EXPECT_EQ(denied.code, 4) << denied.err;
  EXPECT_NE(denied.err.find("permission denied"), std::string::npos) << denied.err;

  AdminRun drain = admin2(kOperator, {"drain", second->target(), "--json"});
  ASSERT_EQ(drain.code, 0) << drain.err;
  const Value d = ParseJson(drain.out);
  EXPECT_EQ(Str(F(d, "state")), "draining");
  EXPECT_EQ(Str(F(d, "address")), second->target());

  AdminRun nodes = admin2(kOperator, {"nodes", "--json"});
  ASSERT_EQ(nodes.code, 0) << nodes.err;
  const Value n = ParseJson(nodes.out);
  ASSERT_EQ(Size(F(n, "nodes")), 2);
  int draining = 0, serving = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string state = Str(F(At(F(n, "nodes"), i), "state"));
    draining += state == "draining";
    serving += state == "serving";
    if (state == "draining") {
      EXPECT_EQ(Str(F(At(F(n, "nodes"), i), "address")), second->target());
    }
  }
  EXPECT_EQ(draining, 1);
  EXPECT_EQ(serving, 1);
  AdminRun human = admin2(kOperator, {"nodes"});
  EXPECT_NE(human.out.find("draining"), std::string::npos) << human.out;

  // Writes to the drained node are refused; the other node still takes them.
  auto drained_store = Open(*second, kTokenA.token);
  ASSERT_NE(drained_store, nullptr);
  Prompt p = MakePrompt(*drained_store, 1, 101);
  auto r = drained_store->Commit(TestModel(), Payloads(p, 0, 1, false));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  CommitAll(*store_a_, p, /*with_swa=*/false);

  // Drain by node id works too; an unknown node is "not found".
  const std::string id = Str(F(d, "node_id"));
  EXPECT_EQ(admin2(kOperator, {"drain", id}).code, 0);
  AdminRun unknown = admin2(kOperator, {"drain", "no-such-node"});
  EXPECT_EQ(unknown.code, 5);
  EXPECT_NE(unknown.err.find("no node 'no-such-node'"), std::string::npos) << unknown.err;
  drained_store.reset();
  second->Terminate();
}

TEST_F(AdminCliTest, ANodeThatIsDownHidesNothingTheOthersDid) {
  Prompt p = MakePrompt(*store_a_, 2, 121);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  const std::string dead = "127.0.0.1:" + std::to_string(FreePort());
  auto admin2 = [&](const std::string& store, std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", store, "--token", kAdminA, "--timeout", "2"});
    return RunAdmin(dir_, args);
  };
  const std::string live_then_dead = node_->uri() + "," + dead;
  const std::string dead_then_live = dead + "," + node_->uri();

  // Pin and unpin go on past the dead node, in either order, and name it.
  const std::string key = Hex(p.keys[1]);
  auto pinned = [&] {
    return F(F(AdminJson(kAdminA, {"inspect", key}), "entry"), "pinned").bool_value();
  };
  for (const std::string& store : {dead_then_live, live_then_dead}) {
    AdminRun pin = admin2(store, {"pin", key, "--ttl", "1h", "--json"});
    EXPECT_EQ(pin.code, 2) << pin.err;
    const Value pj = ParseJson(pin.out);
    EXPECT_TRUE(F(pj, "pinned").bool_value()) << pin.out;
    ASSERT_EQ(Size(F(pj, "nodes")), 1) << pin.out;
    ASSERT_EQ(Size(F(pj, "errors")), 1) << pin.out;
    EXPECT_EQ(Str(F(At(F(pj, "errors"), 0), "node")), dead);
    EXPECT_TRUE(pinned());
    AdminRun unpin = admin2(store, {"unpin", key});
    EXPECT_EQ(unpin.code, 2) << unpin.err;
    EXPECT_NE(unpin.out.find("unpinned global " + key), std::string::npos) << unpin.out;
    EXPECT_NE(unpin.err.find("node " + dead + ": "), std::string::npos) << unpin.err;
    EXPECT_FALSE(pinned());
  }

  // Evict goes on past the dead node and lists what the live one evicted.
  AdminRun evict = admin2(live_then_dead, {"evict", "--all", "--json"});
  EXPECT_EQ(evict.code, 2) << evict.err;
  const Value ev = ParseJson(evict.out);
  EXPECT_EQ(Num(F(ev, "evicted")), 2);
  EXPECT_EQ(Size(F(ev, "entries")), 2);
  ASSERT_EQ(Size(F(ev, "errors")), 1);
  EXPECT_EQ(Str(F(At(F(ev, "errors"), 0), "node")), dead);
  EXPECT_NE(evict.err.find("node " + dead + ": "), std::string::npos) << evict.err;
  EXPECT_EQ(Size(F(AdminJson(kAdminA, {"ls"}), "entries")), 0);

  // Stats shows the live node either way; a node named by id is found past
  // one that does not answer.
  for (const std::string& store : {live_then_dead, dead_then_live}) {
    AdminRun stats = admin2(store, {"stats", "--json"});
    EXPECT_EQ(stats.code, 2) << stats.err;
    ASSERT_EQ(Size(F(ParseJson(stats.out), "nodes")), 1) << stats.out;
  }
  const std::string id = Str(F(At(F(AdminJson(kAdminA, {"stats"}), "nodes"), 0), "node_id"));
  AdminRun by_id = admin2(dead_then_live, {"stats", "--node", id, "--json"});
  EXPECT_EQ(by_id.code, 0) << by_id.err;
  AdminRun other_id = admin2(dead_then_live, {"stats", "--node", "no-such-node"});
  EXPECT_EQ(other_id.code, 2) << other_id.err;
  EXPECT_NE(other_id.err.find("among those that answered"), std::string::npos) << other_id.err;

  // nan passes CLI::Range (it compares false both ways): refused as usage.
  EXPECT_EQ(Admin(kAdminA, {"--timeout", "nan", "ls"}).code, 1);
  EXPECT_EQ(Admin(kAdminA, {"top", "--interval", "nan", "--iterations", "1"}).code, 1);
}

TEST_F(AdminCliTest, TopPrintsRatesPerRefresh) {
  Prompt p = MakePrompt(*store_a_, 1, 111);
  CommitAll(*store_a_, p, /*with_swa=*/false);
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop.load()) {
      auto m = MatchPrompt(*store_a_, p, /*lease=*/false);
      if (!m.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  AdminRun j = Admin(kAdminA, {"top", "--iterations", "2", "--interval", "0.3", "--json"});
  stop.store(true);
  load.join();
  ASSERT_EQ(j.code, 0) << j.err;
  std::istringstream lines(j.out);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    const Value v = ParseJson(line);
    ++count;
    EXPECT_EQ(Num(F(v, "iteration")), count);
    ASSERT_EQ(Size(F(v, "nodes")), 1);
    const Value& n = At(F(v, "nodes"), 0);
    EXPECT_EQ(Str(F(n, "state")), "serving");
    // Every lookup of the load hits its one block (give or take a lookup in
    // flight while the counters were read).
    const double lookups = Num(F(n, "lookups_per_s"));
    EXPECT_GT(lookups, 0) << line;
    EXPECT_NEAR(Num(F(n, "hit_tokens_per_s")), 256 * lookups, 0.2 * 256 * lookups) << line;
    EXPECT_NEAR(Num(F(n, "hit_ratio")), 1, 0.2) << line;
    EXPECT_EQ(Num(F(n, "evictions_per_s")), 0);
    EXPECT_GE(Num(F(n, "dram_used_bytes")), static_cast<double>(p.blocks[0].bytes.size()));
  }
  EXPECT_EQ(count, 2);

  AdminRun human = Admin(kAdminA, {"top", "--iterations", "2", "--interval", "0.2"});
  ASSERT_EQ(human.code, 0) << human.err;
  size_t tables = 0;
  for (size_t at = human.out.find("LOOKUPS/S"); at != std::string::npos;
       at = human.out.find("LOOKUPS/S", at + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 2u) << human.out;
  EXPECT_NE(human.out.find("HIT BYTES/S"), std::string::npos);
  EXPECT_NE(human.out.find("serving"), std::string::npos);
}

TEST_F(AdminCliTest, ErrorsNameTheProblemWithDocumentedExitCodes) {
  // Unreachable node.
  const std::string dead = "127.0.0.1:" + std::to_string(FreePort());
  AdminRun down = RunAdmin(
      dir_, {"--store", "strata://" + dead, "--token", kAdminA, "--timeout", "2", "stats"});
  EXPECT_EQ(down.code, 2) << down.err;
  EXPECT_NE(down.err.find("node " + dead + " unreachable (deadline 2s)"), std::string::npos)
      << down.err;
  // Token rejected, and no token at all.
  AdminRun bad = Admin("not-a-token", {"ls"});
  EXPECT_EQ(bad.code, 3) << bad.err;
  EXPECT_NE(bad.err.find("rejected the token"), std::string::npos) << bad.err;
  AdminRun no_token = RunAdmin(dir_, {"--store", node_->uri(), "ls"});
  EXPECT_EQ(no_token.code, 3) << no_token.err;
  EXPECT_NE(no_token.err.find("STRATA_TOKEN"), std::string::npos) << no_token.err;
  // A write token calling admin.
  AdminRun write = Admin(kTokenA.token, {"ls", "--json"});
  EXPECT_EQ(write.code, 4) << write.err;
  EXPECT_NE(write.err.find("permission denied"), std::string::npos) << write.err;
  EXPECT_EQ(Str(F(F(ParseJson(write.out), "error"), "code")), "PERMISSION_DENIED");
  // A tenant admin asking about another tenant's namespace.
  Prompt b = MakePrompt(*store_b_, 1, 131);
  CommitAll(*store_b_, b, /*with_swa=*/false);
  AdminRun other = Admin(kAdminA, {"ls", "--namespace", "tenant-b"});
  EXPECT_EQ(other.code, 4) << other.err;
  EXPECT_NE(other.err.find("may not act on namespace 'tenant-b'"), std::string::npos) << other.err;
  AdminRun other_inspect = Admin(kAdminA, {"inspect", Hex(b.keys[1]), "--namespace", "tenant-b"});
  EXPECT_EQ(other_inspect.code, 4) << other_inspect.err;
  // Without naming it, tenant-b's key is simply not visible to tenant-a.
  EXPECT_EQ(Admin(kAdminA, {"inspect", Hex(b.keys[1])}).code, 5);
  EXPECT_EQ(Admin(kAdminA, {"evict", Hex(b.keys[1])}).code, 5);
  EXPECT_EQ(Admin(kTokenAdminB.token, {"inspect", Hex(b.keys[1])}).code, 0);
  // Usage errors.
  EXPECT_EQ(RunAdmin(dir_, {"no-such-command"}).code, 1);
  EXPECT_EQ(RunAdmin(dir_, {"--store", node_->uri(), "--token", kAdminA, "ls", "--bogus"}).code, 1);
  // With --json (before or after the mistake) the refusal is on stdout too.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--json", "ls", "--bogus"},
        std::vector<std::string>{"ls", "--page-size", "lots", "--json"}}) {
    AdminRun usage = RunAdmin(dir_, args);
    EXPECT_EQ(usage.code, 1) << usage.err;
    const Value error = F(ParseJson(usage.out), "error");
    EXPECT_EQ(Str(F(error, "code")), "USAGE") << usage.out;
    EXPECT_EQ(Num(F(error, "exit_code")), 1) << usage.out;
    EXPECT_FALSE(Str(F(error, "message")).empty()) << usage.out;
  }
  EXPECT_TRUE(RunAdmin(dir_, {"ls", "--bogus"}).out.empty());
  EXPECT_EQ(RunAdmin(dir_, {"--store", "not a store", "--token", kAdminA, "ls"}).code, 6);
  // One node twice would hold both replicas of every block it is ranked for.
  AdminRun twice =
      RunAdmin(dir_, {"--store", node_->uri() + ", " + node_->target(), "--token", kAdminA, "ls"});
  EXPECT_EQ(twice.code, 6);
  EXPECT_NE(twice.err.find("listed twice"), std::string::npos) << twice.err;
  // --help documents the exit codes.
  AdminRun help = RunAdmin(dir_, {"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("2  node unreachable"), std::string::npos) << help.out;
}

TEST_F(AdminCliTest, CredentialsAndTargetFromEnvironmentAndFile) {
  const Value j =
      ParseJson(RunAdmin(dir_, {"nodes", "--json"},
                         {{"STRATA_STORE", node_->uri()}, {"STRATA_TOKEN", kTokenReadA.token}})
                    .out);
  ASSERT_EQ(Size(F(j, "nodes")), 1);
  EXPECT_EQ(Str(F(At(F(j, "nodes"), 0), "address")), node_->target());
  const std::string token_file = dir_ + "/admin-token";
  std::ofstream(token_file) << kAdminA << "\n";
  AdminRun from_file = RunAdmin(dir_, {"--store", node_->uri(), "--token-file", token_file, "ls"});
  EXPECT_EQ(from_file.code, 0) << from_file.err;
  // --token wins over the environment.
  AdminRun flag = RunAdmin(dir_, {"--store", node_->uri(), "--token", kAdminA, "ls"},
                           {{"STRATA_TOKEN", "not-a-token"}});
  EXPECT_EQ(flag.code, 0) << flag.err;
}

}  // namespace
}  // namespace strata::testing

// The node's config file, overrides and tokens file: what parses, and the
// errors that name what is wrong.
#include <gtest/gtest.h>

#include <fstream>

#include "node/node.h"
#include "node/token_auth.h"
#include "node_process.h"

namespace strata {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir("node-config") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(NodeConfigTest, ParsesEveryKindOfValue) {
  const std::string path = WriteFile("node.yaml", R"(
listen: 0.0.0.0:7070
http_listen: 127.0.0.1:9100
dram_bytes: 64GiB
high_watermark: 0.9
low_watermark: 0.8
global_kv_ttl: 72h
swa_ttl: 10m
read_lease_ttl: 250ms
write_lease_ttl: 30s
max_lease_life: 2h
max_leased_entries_per_namespace: 4096
max_held_share_per_namespace: 0.25
committed_share_per_namespace: 0.3
eviction_policy: aslru
tokens_file: /etc/strata/tokens
data_plane_mode: am
log_format: json
ssd_dir: /var/lib/strata/ssd
ssd_bytes: 2TiB
ssd_data_files: 4
ssd_sync: false
ssd_admission: hit_once
ssd_eviction_policy: deadline
)");
  auto c = LoadNodeConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen, "0.0.0.0:7070");
  EXPECT_EQ(c->dram_bytes, 64ull << 30);
  EXPECT_DOUBLE_EQ(c->high_watermark, 0.9);
  EXPECT_EQ(c->global_kv_ttl, Hours(72));
  EXPECT_EQ(c->swa_ttl, Minutes(10));
  EXPECT_EQ(c->read_lease_ttl, 250 * kNanosPerMilli);
  EXPECT_EQ(c->max_lease_life, Hours(2));
  EXPECT_EQ(c->max_leased_entries_per_namespace, 4096u);
  EXPECT_EQ(c->max_held_share_per_namespace, 0.25);
  EXPECT_EQ(c->committed_share_per_namespace, 0.3);
  EXPECT_EQ(c->eviction_policy, "aslru");
  EXPECT_EQ(c->data_plane_mode, "am");
  EXPECT_TRUE(ValidateNodeConfig(*c).ok());
  EXPECT_EQ(c->tokens_file, "/etc/strata/tokens");  // absolute: kept
  EXPECT_EQ(c->ssd_dir, "/var/lib/strata/ssd");
  EXPECT_EQ(c->ssd_bytes, 2ull << 40);
  EXPECT_EQ(c->ssd_data_files, 4u);
  EXPECT_FALSE(c->ssd_sync);
  EXPECT_EQ(c->ssd_admission, "hit_once");
  EXPECT_EQ(c->ssd_eviction_policy, "deadline");

  // Relative file names are relative to the config file.
  auto rel = LoadNodeConfig(
      WriteFile("rel.yaml", "tokens_file: tokens\ntls_cert_file: ../c.pem\nssd_dir: ssd\n"));
  ASSERT_TRUE(rel.ok());
  const std::string dir = std::filesystem::path(testing::TempDir("node-config")).string();
  EXPECT_EQ(rel->tokens_file, dir + "/tokens");
  EXPECT_EQ(rel->tls_cert_file, std::filesystem::path(dir).parent_path().string() + "/c.pem");
  EXPECT_EQ(rel->ssd_dir, dir + "/ssd");

  ASSERT_TRUE(ApplyNodeConfigOverride(&*c, "dram_bytes=512MiB").ok());
  EXPECT_EQ(c->dram_bytes, 512ull << 20);
  EXPECT_EQ(ApplyNodeConfigOverride(&*c, "dram_byte=1").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyNodeConfigOverride(&*c, "noequals").code(), StatusCode::kInvalidArgument);
}

TEST(NodeConfigTest, ExtraLayoutsFromYamlListStringOrOverride) {
  auto list = LoadNodeConfig(WriteFile("layouts.yaml", R"(
tokens_file: /etc/strata/tokens
extra_layouts:
  - "900:global_kv:512:meta=1"
  - "901:global_kv:512:v41"
)"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->extra_layouts.size(), 2u);
  EXPECT_EQ(list->extra_layouts[0].id, 900u);
  EXPECT_EQ(list->extra_layouts[0].PayloadBytes(), 64u + 1u);  // a header and one byte
  EXPECT_EQ(list->extra_layouts[1].BodyBytes(), 512u * 890u);
  EXPECT_TRUE(ValidateNodeConfig(*list).ok());

  auto one = LoadNodeConfig(WriteFile("layout.yaml", "extra_layouts: 7:swa_state:64:l0=100\n"));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->extra_layouts.size(), 1u);
  EXPECT_EQ(one->extra_layouts[0].kind, StateKind::kSwaState);

  NodeConfig c;
  c.tokens_file = "/etc/strata/tokens";
  ASSERT_TRUE(
      ApplyNodeConfigOverride(&c, "extra_layouts=5:global_kv:16:a=8;6:global_kv:16:b=9").ok());
  EXPECT_EQ(c.extra_layouts.size(), 2u);
  // A built-in layout's id, a bad spec, a list of non-strings: each named.
  ASSERT_TRUE(ApplyNodeConfigOverride(&c, "extra_layouts=1:global_kv:16:a=8").ok());
  EXPECT_NE(ValidateNodeConfig(c).message().find("built-in"), std::string::npos);
  EXPECT_NE(
      ApplyNodeConfigOverride(&c, "extra_layouts=5:global_kv:16").message().find("extra_layouts"),
      std::string::npos);
  for (const char* items : {"[a, b]", "\"\"", "\"5:global_kv:16:a=8;6:global_kv:16:b=9\""}) {
    auto bad = LoadNodeConfig(
        WriteFile("bad-layouts.yaml", std::string("extra_layouts:\n  - ") + items + "\n"));
    ASSERT_FALSE(bad.ok()) << items;
    EXPECT_NE(bad.status().message().find("extra_layouts[0]"), std::string::npos)
        << bad.status().ToString();
  }
  auto empty = LoadNodeConfig(WriteFile("no-layouts.yaml", "extra_layouts:\n"));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->extra_layouts.empty());

  // A node started with them has them (a whole in-process node, UCX
  // included: the config is only worth something if Node::Start applies it).
  NodeConfig node_config = *list;
  node_config.listen = "127.0.0.1:0";
  node_config.http_listen = "";
  node_config.dram_bytes = 64ull << 20;
  node_config.tokens_file = WriteFile("layout-tokens", HashToken("t") + " tenant write\n");
  auto node = Node::Start(node_config);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  for (uint32_t id : {900u, 901u}) {  // taken: another shape under the id is refused
    EXPECT_EQ((*node)->store().RegisterLayout({id, StateKind::kGlobalKv, 512, {{"x", 3}}}).code(),
              StatusCode::kAlreadyExists)
        << id;
  }
  EXPECT_TRUE((*node)->store().RegisterLayout(list->extra_layouts[0]).ok());  // the same: fine
}

// Keys left empty are YAML's null: the empty value, or an empty section;
// booleans come in any case.
TEST(NodeConfigTest, EmptyValuesAndSectionsAndCapitalizedBooleansAreRead) {
  auto c = LoadNodeConfig(WriteFile("empty-values.yaml",
                                    "tokens_file: t\ntls_cert_file:\ntls_key_file:\n"
                                    "ssd_sync: False\ncluster:\n  etcd_endpoints:\n"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->tls_cert_file.empty());
  EXPECT_TRUE(c->tls_key_file.empty());
  EXPECT_FALSE(c->ssd_sync);
  EXPECT_TRUE(c->cluster.etcd_endpoints.empty());
  EXPECT_TRUE(ValidateNodeConfig(*c).ok()) << ValidateNodeConfig(*c).ToString();
  auto section = LoadNodeConfig(WriteFile("empty-cluster.yaml", "tokens_file: t\ncluster:\n"));
  ASSERT_TRUE(section.ok()) << section.status().ToString();
  auto yes = LoadNodeConfig(WriteFile("true.yaml", "tokens_file: t\nssd_sync: TRUE\n"));
  ASSERT_TRUE(yes.ok()) << yes.status().ToString();
  EXPECT_TRUE(yes->ssd_sync);
  // A number left empty is still no number.
  EXPECT_FALSE(LoadNodeConfig(WriteFile("empty-size.yaml", "dram_bytes:\n")).ok());
}

TEST(NodeConfigTest, ErrorsNameTheProblem) {
  auto typo = LoadNodeConfig(WriteFile("typo.yaml", "dram_byts: 1GiB\n"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown config key 'dram_byts'"), std::string::npos);
  auto unit = LoadNodeConfig(WriteFile("unit.yaml", "dram_bytes: 1GB\n"));
  ASSERT_FALSE(unit.ok());
  EXPECT_NE(unit.status().message().find("dram_bytes"), std::string::npos);
  auto duration = LoadNodeConfig(WriteFile("dur.yaml", "swa_ttl: soon\n"));
  ASSERT_FALSE(duration.ok());
  EXPECT_NE(duration.status().message().find("not a duration"), std::string::npos);
  auto nested = LoadNodeConfig(WriteFile("nested.yaml", "listen: [a, b]\n"));
  EXPECT_FALSE(nested.ok());
  auto broken = LoadNodeConfig(WriteFile("broken.yaml", "listen: [unclosed\n"));
  EXPECT_FALSE(broken.ok());
  EXPECT_EQ(LoadNodeConfig("/nonexistent/strata.yaml").status().code(),
            StatusCode::kInvalidArgument);

  NodeConfig c;
  EXPECT_NE(ValidateNodeConfig(c).message().find("tokens_file"), std::string::npos);
  c.tokens_file = "/etc/strata/tokens";
  EXPECT_TRUE(ValidateNodeConfig(c).ok());
  c.max_lease_life = Minutes(5);  // shorter than a lease may be granted for
  EXPECT_NE(ValidateNodeConfig(c).message().find("max_lease_life"), std::string::npos);
  c.max_lease_life = Hours(1);
  c.tls_cert_file = "cert.pem";
  EXPECT_FALSE(ValidateNodeConfig(c).ok());
  c.tls_cert_file.clear();
  c.low_watermark = 0.99;
  EXPECT_FALSE(ValidateNodeConfig(c).ok());
  c.low_watermark = c.high_watermark = 1;  // equal: evict on demand only
  EXPECT_TRUE(ValidateNodeConfig(c).ok());
  // spdlog reads an unknown level as "off": the node would log nothing.
  c.log_level = "INFO";
  EXPECT_NE(ValidateNodeConfig(c).message().find("log_level"), std::string::npos);
  c.log_level = "warning";
  EXPECT_TRUE(ValidateNodeConfig(c).ok());
  c.low_watermark = 0.5;
  c.data_plane_mode = "fast";
  EXPECT_FALSE(ValidateNodeConfig(c).ok());
  c.data_plane_mode = "auto";
  c.ssd_admission = "sometimes";
  EXPECT_NE(ValidateNodeConfig(c).message().find("ssd_admission"), std::string::npos);
  c.ssd_admission = "all";
  c.ssd_eviction_policy = "mru";
  EXPECT_NE(ValidateNodeConfig(c).message().find("ssd_eviction_policy"), std::string::npos);
  c.ssd_eviction_policy = "lru";
  EXPECT_NE(ApplyNodeConfigOverride(&c, "ssd_sync=maybe").message().find("ssd_sync"),
            std::string::npos);
  EXPECT_NE(ApplyNodeConfigOverride(&c, "ssd_data_files=0").message().find("ssd_data_files"),
            std::string::npos);
  for (const char* bad :
       {"max_leased_entries_per_namespace=0", "max_leased_entries_per_namespace=-1",
        "max_leased_entries_per_namespace=1e30"}) {
    EXPECT_NE(ApplyNodeConfigOverride(&c, bad).message().find("max_leased_entries_per_namespace"),
              std::string::npos)
        << bad;
  }
  for (const std::string key : {"max_held_share_per_namespace", "committed_share_per_namespace"}) {
    for (const char* bad : {"=0", "=1.5", "=half"}) {
      EXPECT_NE(ApplyNodeConfigOverride(&c, key + bad).message().find(key), std::string::npos)
          << key << bad;
    }
  }
  ASSERT_TRUE(ApplyNodeConfigOverride(&c, "max_held_share_per_namespace=auto").ok());
  EXPECT_FALSE(c.max_held_share_per_namespace.has_value());
  ASSERT_TRUE(ApplyNodeConfigOverride(&c, "committed_share_per_namespace=0.25").ok());
  EXPECT_EQ(c.committed_share_per_namespace, 0.25);
  ASSERT_TRUE(ApplyNodeConfigOverride(&c, "committed_share_per_namespace=auto").ok());
  EXPECT_FALSE(c.committed_share_per_namespace.has_value());
}

// Issue #38: yaml-cpp keeps the last of two equal keys; a config that
// says a thing twice is refused, naming the key.
TEST(NodeConfigTest, KeysGivenTwiceAreRefused) {
  auto top = LoadNodeConfig(WriteFile("twice.yaml",
                                      "tokens_file: a\ndram_bytes: 1GiB\n"
                                      "dram_bytes: 2GiB\n"));
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("'dram_bytes' is given twice"), std::string::npos)
      << top.status().ToString();
  auto nested = LoadNodeConfig(
      WriteFile("twice-cluster.yaml", "tokens_file: a\ncluster:\n  name: x\n  name: y\n"));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("'cluster.name' is given twice"), std::string::npos)
      << nested.status().ToString();
}

// The node id goes into every log line: one line of printable text.
TEST(NodeConfigTest, NodeIdIsOnePrintableWord) {
  NodeConfig c;
  c.tokens_file = "/etc/strata/tokens";
  for (const std::string& bad :
       {std::string("node-1\nfake=line"), std::string("node 1"), std::string("node\t1"),
        std::string(256, 'n'), std::string("n\x7f")}) {
    c.node_id = bad;
    EXPECT_NE(ValidateNodeConfig(c).message().find("node_id"), std::string::npos) << bad;
  }
  c.node_id = "host-1.example:7000";
  EXPECT_TRUE(ValidateNodeConfig(c).ok());
}

TEST(TokenTableTest, ParsesAndAuthenticates) {
  const std::string text = "# tokens\n" + HashToken("alpha") + " tenant-a write\n\n" +
                           HashToken("ops") + " * admin  # operator\n";
  auto table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(table->size(), 2u);
  auto a = table->Authenticate("Bearer alpha");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ns, "tenant-a");
  EXPECT_EQ(a->role, Role::kWrite);
  EXPECT_EQ(table->Authenticate("Bearer ops")->ns, "*");
  EXPECT_EQ(table->Authenticate("").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(table->Authenticate("Basic alpha").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(table->Authenticate("Bearer ").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(table->Authenticate("Bearer beta").status().code(), StatusCode::kUnauthenticated);
}

TEST(TokenTableTest, MalformedLinesFailTheLoadWithTheirLineNumber) {
  const std::string good = HashToken("x");
  const std::string twice = good + " a read\n" + good + " b read";  // the same hash, twice
  for (const std::string& bad : std::vector<std::string>{
           good + " tenant-a", good + " tenant-a owner", "sha1:abc tenant-a read",
           good + " bad/namespace read", good + " * write", good + " a read extra", twice}) {
    auto t = TokenTable::Parse("# header\n" + bad + "\n", "tokens");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("tokens:"), std::string::npos) << t.status().ToString();
  }
  EXPECT_EQ(TokenTable::Load("/nonexistent/tokens").status().code(), StatusCode::kNotFound);
}

// Issue #38: a directory read as an empty file gave a node nobody could
// call, and no error. A directory, and a file with no token, are refused.
TEST(TokenTableTest, ADirectoryOrAFileWithoutTokensIsAnError) {
  const std::string dir = testing::TempDir("tokens-dir");
  auto from_dir = TokenTable::Load(dir);
  ASSERT_FALSE(from_dir.ok());
  EXPECT_NE(from_dir.status().message().find("is a directory"), std::string::npos)
      << from_dir.status().ToString();
  auto empty = TokenTable::Load(WriteFile("no-tokens", "# nobody yet\n\n"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("names no token"), std::string::npos)
      << empty.status().ToString();
}

// The same three mistakes stop a real strata-node at start-up, saying why.
TEST(NodeConfigTest, TheNodeRefusesToStartOnOperatorMistakes) {
  const std::string dir = testing::TempDir("node-config-start");
  const std::string tokens = WriteFile("start-tokens", HashToken("t") + " tenant write\n");
  struct Case {
    std::string config;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"tokens_file: " + dir + "\n", "is a directory"},
      {"tokens_file: " + tokens + "\nlisten: 127.0.0.1:0\nlisten: 0.0.0.0:0\n",
       "'listen' is given twice"},
      {"tokens_file: " + tokens + "\nnode_id: \"a\\nb\"\n", "node_id must be"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteFile("start-" + std::to_string(i) + ".yaml", cases[i].config);
    const std::string cmd = std::string(STRATA_NODE_BINARY) + " --config " + path +
                            " --listen 127.0.0.1:0 --http-listen '' 2>&1";
    FILE* out = popen(cmd.c_str(), "r");
    ASSERT_NE(out, nullptr);
    std::string log;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), out)) > 0;) log.append(buf, n);
    const int status = pclose(out);
    EXPECT_NE(status, 0) << cases[i].config << log;
    EXPECT_NE(log.find(cases[i].expected), std::string::npos) << cases[i].config << log;
  }
}

}  // namespace
}  // namespace strata

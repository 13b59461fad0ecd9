// Real strata-node processes registering in a real etcd: three nodes seen
// by EtcdMembership, kill -9 leaving within the lease TTL, drain then clean
// deregistration, an etcd restart under running nodes, and a network
// partition (network namespace + veth) where the machine allows one.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "cluster/etcd_membership.h"
#include "etcd_test_util.h"
#include "node/node.h"
#include "node_test_util.h"
#include "strata/membership.h"

namespace strata::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

class EtcdNodeTest : public EtcdTest {
 protected:
  std::unique_ptr<NodeProcess> StartNode(const std::string& id, const std::string& ttl = "2s") {
    NodeProcess::Options o;
    o.settings = {"node_id=" + id, "cluster.etcd_endpoints=" + etcd_->endpoint(),
                  "cluster.name=test", "cluster.lease_ttl=" + ttl, "dram_bytes=64MiB"};
    std::string error;
    auto n = NodeProcess::Start(dir_, o, &error);
    EXPECT_NE(n, nullptr) << error;
    return n;
  }

  std::unique_ptr<Membership> OpenMembership() {
    EtcdMembershipOptions o;
    o.endpoints = {etcd_->endpoint()};
    o.cluster = "test";
    auto m = OpenEtcdMembership(o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  static std::vector<std::string> Ids(const Membership& m) {
    std::vector<std::string> ids;
    for (const NodeInfo& n : m.Nodes()) ids.push_back(n.node_id);
    return ids;
  }
};

TEST_F(EtcdNodeTest, ThreeNodesRegisterAndAKilledOneLeavesWithinTheLeaseTtl) {
  auto m = OpenMembership();
  ASSERT_NE(m, nullptr);
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* id : {"n1", "n2", "n3"}) {
    nodes.push_back(StartNode(id));
    ASSERT_NE(nodes.back(), nullptr);
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ids(*m) == std::vector<std::string>{"n1", "n2", "n3"};
      },
      milliseconds(10000)))
      << nodes[0]->Log();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m->Nodes()[i].address, nodes[i]->target());  // what clients dial
    EXPECT_FALSE(m->Nodes()[i].draining);
  }
  // kill -9: no deregistration; the lease (2 s) runs out on its own.
  const auto killed = steady_clock::now();
  nodes[1]->Kill();
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ids(*m) == std::vector<std::string>{"n1", "n3"};
      },
      milliseconds(8000)));
  // etcd checks leases every 500 ms; the TTL is 2 s; a keep-alive may have
  // renewed it just before the kill; the rest is slack for a loaded machine.
  EXPECT_LE(steady_clock::now() - killed, milliseconds(2000 + 2500));
}

TEST_F(EtcdNodeTest, DrainShowsThenShutdownDeregistersAtOnce) {
  auto m = OpenMembership();
  ASSERT_NE(m, nullptr);
  // A long lease: only a clean deregistration can take the node out soon.
  auto node = StartNode("drainer", "60s");
  ASSERT_NE(node, nullptr);
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(10000)));
  EXPECT_FALSE(m->Nodes()[0].draining);
  v1::DrainResponse drained;
  ASSERT_TRUE(RawCall(*node, kTokenOperator.token, [&](auto channel, grpc::ClientContext* ctx) {
                return v1::Admin::NewStub(channel)->Drain(ctx, v1::DrainRequest(), &drained);
              }).ok());
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1 && m->Nodes()[0].draining; },
                      milliseconds(5000)));
  // Draining nodes still serve reads: the node stays listed.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(m->Nodes().size(), 1u);
  EXPECT_EQ(node->Terminate(), 0) << node->Log();
  // Gone at once (revoked), not after the 60 s lease.
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().empty(); }, milliseconds(5000)));
  EXPECT_NE(node->Log().find("event=etcd_deregistered"), std::string::npos) << node->Log();
}

TEST_F(EtcdNodeTest, EtcdRestartUnderRunningNodesMembershipRecovers) {
  auto m = OpenMembership();
  ASSERT_NE(m, nullptr);
  auto a = StartNode("a");
  auto b = StartNode("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 2; }, milliseconds(10000)));
  // etcd is down for longer than the lease TTL; the membership keeps the
  // last known list meanwhile.
  etcd_->Kill();
  std::this_thread::sleep_for(milliseconds(3000));
  EXPECT_EQ(Ids(*m), (std::vector<std::string>{"a", "b"}));
  std::string error;
  ASSERT_TRUE(etcd_->Restart(&error)) << error;
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ids(*m) == std::vector<std::string>{"a", "b"};
      },
      milliseconds(10000)));
  // The registrations are live again (kept alive or re-registered): a node
  // killed now still leaves within the TTL, and the other stays.
  std::this_thread::sleep_for(milliseconds(3000));  // past any lease left from before
  EXPECT_EQ(Ids(*m), (std::vector<std::string>{"a", "b"})) << a->Log();
  b->Kill();
  EXPECT_TRUE(
      WaitFor([&] { return Ids(*m) == std::vector<std::string>{"a"}; }, milliseconds(6000)));
}

TEST_F(EtcdNodeTest, BadClusterConfigIsRefusedAtStart) {
  for (const char* bad : {"cluster.etcd_endpoints=https://127.0.0.1:1",
                          "cluster.etcd_endpoints=nohost", "cluster.lease_ttl=0s"}) {
    NodeProcess::Options o;
    o.settings = {bad};
    if (std::string(bad).starts_with("cluster.lease_ttl")) {
      o.settings.push_back("cluster.etcd_endpoints=" + etcd_->endpoint());
    }
    std::string error;
    auto n = NodeProcess::Start(dir_, o, &error);
    EXPECT_EQ(n, nullptr) << bad;
    EXPECT_NE(error.find("cluster."), std::string::npos) << error;
  }
}

TEST(ClusterConfigTest, ExampleConfigAndOverridesParse) {
  auto c = LoadNodeConfig(std::string(STRATA_SOURCE_DIR) + "/deploy/cluster/node-a.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cluster.name, "prod");
  EXPECT_EQ(c->cluster.advertise, "10.0.0.1:7070");
  EXPECT_EQ(c->cluster.lease_ttl, Seconds(5));
  EXPECT_TRUE(ValidateNodeConfig(*c).ok()) << ValidateNodeConfig(*c).ToString();
  // The documented defaults file (cluster section commented out) stays
  // etcd-free.
  auto d = LoadNodeConfig(std::string(STRATA_SOURCE_DIR) + "/deploy/strata-node.yaml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->cluster.etcd_endpoints.empty());
  NodeConfig o;
  ASSERT_TRUE(ApplyNodeConfigOverride(&o, "cluster.lease_ttl=7s").ok());
  ASSERT_TRUE(ApplyNodeConfigOverride(&o, "cluster.name=x").ok());
  EXPECT_EQ(o.cluster.lease_ttl, Seconds(7));
  EXPECT_EQ(o.cluster.name, "x");
  EXPECT_FALSE(ApplyNodeConfigOverride(&o, "cluster.lease_ttl=soon").ok());
  EXPECT_FALSE(ApplyNodeConfigOverride(&o, "cluster.nope=1").ok());
  o.tokens_file = "t";
  o.cluster.etcd_endpoints = "http://127.0.0.1:2379";
  o.cluster.name = "a/b";
  EXPECT_EQ(ValidateNodeConfig(o).code(), StatusCode::kInvalidArgument);
}

// --- network partition ---

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// A network namespace joined to this one by a veth pair: host side
// 10.213.<n>.1, namespace side 10.213.<n>.2. Removed on destruction.
class NetNs {
 public:
  static std::unique_ptr<NetNs> Create(std::string* why) {
    std::unique_ptr<NetNs> ns(new NetNs());
    const int n = getpid() % 200 + 20;
    ns->name_ = "strata-t" + std::to_string(getpid());
    ns->host_if_ = "sth" + std::to_string(getpid());
    ns->ns_if_ = "stn" + std::to_string(getpid());
    ns->host_ip_ = "10.213." + std::to_string(n) + ".1";
    ns->ns_ip_ = "10.213." + std::to_string(n) + ".2";
    if (Sh("ip netns add " + ns->name_) != 0) {
      *why = "'ip netns add' failed (needs root / CAP_SYS_ADMIN and iproute2)";
      return nullptr;
    }
    ns->created_ = true;
    const std::string in = "ip netns exec " + ns->name_ + " ";
    if (Sh("ip link add " + ns->host_if_ + " type veth peer name " + ns->ns_if_) != 0 ||
        Sh("ip link set " + ns->ns_if_ + " netns " + ns->name_) != 0 ||
        Sh("ip addr add " + ns->host_ip_ + "/24 dev " + ns->host_if_) != 0 ||
        Sh("ip link set " + ns->host_if_ + " up") != 0 ||
        Sh(in + "ip addr add " + ns->ns_ip_ + "/24 dev " + ns->ns_if_) != 0 ||
        Sh(in + "ip link set " + ns->ns_if_ + " up") != 0 || Sh(in + "ip link set lo up") != 0) {
      *why = "could not wire a veth pair into the namespace";
      return nullptr;
    }
    return ns;
  }
  ~NetNs() {
    if (created_) Sh("ip netns del " + name_);  // takes the veth pair with it
    Sh("ip link del " + host_if_);
  }
  // A TCP connection from inside the namespace to host:port succeeds.
  bool CanReach(const std::string& host, int port) const {
    return Sh("ip netns exec " + name_ + " timeout 5 bash -c 'exec 3<>/dev/tcp/" + host + "/" +
              std::to_string(port) + "'") == 0;
  }
  bool Cut() { return Sh("ip link set " + host_if_ + " down") == 0; }
  bool Heal() { return Sh("ip link set " + host_if_ + " up") == 0; }
  const std::string& name() const { return name_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }

 private:
  NetNs() = default;
  bool created_ = false;
  std::string name_, host_if_, ns_if_, host_ip_, ns_ip_;
};

// A strata-node inside the namespace, killed on destruction.
class NodeInNs {
 public:
  NodeInNs(const NetNs& ns, const std::string& dir, const std::string& etcd) {
    log_ = dir + "/ns-node.log";
    const std::string tokens = dir + "/ns-tokens";
    {
      std::ofstream out(tokens);
      out << HashToken(kTokenA.token) << " " << kTokenA.ns << " " << kTokenA.role << "\n";
    }
    std::vector<std::string> args = {"/usr/sbin/ip",
                                     "netns",
                                     "exec",
                                     ns.name(),
                                     STRATA_NODE_BINARY,
                                     "--listen",
                                     ns.ns_ip() + ":0",
                                     "--http-listen",
                                     "",
                                     "--tokens-file",
                                     tokens,
                                     "--dram-bytes",
                                     "64MiB",
                                     "--set",
                                     "data_plane_mode=am",
                                     "--set",
                                     "node_id=partitioned",
                                     "--set",
                                     "cluster.etcd_endpoints=" + etcd,
                                     "--set",
                                     "cluster.name=test",
                                     "--set",
                                     "cluster.lease_ttl=2s"};
    if (access(args[0].c_str(), X_OK) != 0) args[0] = "/sbin/ip";
    std::string error;
    // `ip netns exec` execs the node: the child is the node.
    process_.Start(args, log_, &error);
  }
  bool started() const { return process_.running(); }
  std::string Log() const { return process_.Log(); }

 private:
  ChildProcess process_;
  std::string log_;
};

TEST(EtcdPartitionTest, PartitionedNodeLeavesAndComesBackWhenHealed) {
  if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissing;
  std::string why;
  auto ns = NetNs::Create(&why);
  if (ns == nullptr) GTEST_SKIP() << "network partition test skipped: " << why;
  const std::string dir = TempDir("partition");
  std::string error;
  auto etcd = EtcdProcess::Start(dir + "/etcd", &error, 0, ns->host_ip());
  ASSERT_NE(etcd, nullptr) << error;
  EtcdMembershipOptions o;
  o.endpoints = {etcd->endpoint()};
  o.cluster = "test";
  auto m = OpenEtcdMembership(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  if (!ns->CanReach(ns->host_ip(), etcd->client_port())) {
    GTEST_SKIP() << "network partition test skipped: no TCP from the namespace to etcd over veth";
  }
  NodeInNs node(*ns, dir, "http://" + ns->host_ip() + ":" + std::to_string(etcd->client_port()));
  ASSERT_TRUE(node.started());
  ASSERT_TRUE(WaitFor([&] { return (*m)->Nodes().size() == 1; }, milliseconds(20000)))
      << node.Log();
  EXPECT_EQ((*m)->Nodes()[0].address.rfind(ns->ns_ip() + ":", 0), 0u);
  // Cut the link: the node is alive but cannot renew its lease, so it
  // leaves routing within the TTL.
  ASSERT_TRUE(ns->Cut());
  const auto cut = steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return (*m)->Nodes().empty(); }, milliseconds(8000))) << node.Log();
  EXPECT_LE(steady_clock::now() - cut, milliseconds(2000 + 2500));
  // Heal: it registers again by itself.
  ASSERT_TRUE(ns->Heal());
  EXPECT_TRUE(WaitFor([&] { return (*m)->Nodes().size() == 1; }, milliseconds(15000)))
      << node.Log();
  EXPECT_NE(node.Log().find("event=etcd_lease_lost"), std::string::npos) << node.Log();
}

}  // namespace
}  // namespace strata::testing

// The etcd client, EtcdMembership and NodeRegistration against a real etcd
// server on loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/etcd_membership.h"
#include "cluster/node_registration.h"
#include "etcd_test_util.h"
#include "strata/membership.h"

namespace strata::testing {
namespace {

using cluster::EtcdClient;
using cluster::EtcdClientOptions;
using cluster::EtcdEvent;
using cluster::EtcdRange;
using cluster::EtcdWatchHandler;
using cluster::NodeRegistration;
using cluster::NodeRegistrationOptions;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::unique_ptr<EtcdClient> Connect(const std::vector<std::string>& endpoints,
                                    milliseconds timeout = milliseconds(2000)) {
  EtcdClientOptions o;
  o.endpoints = endpoints;
  o.call_timeout = timeout;
  auto c = EtcdClient::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A port with nothing listening (an etcd that is down).
std::string DeadEndpoint() {
  const int port = [] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }();
  return "http://127.0.0.1:" + std::to_string(port);
}

TEST(EtcdKeysTest, PrefixRangeEnd) {
  EXPECT_EQ(cluster::PrefixRangeEnd("/strata/a/"), "/strata/a0");
  EXPECT_EQ(cluster::PrefixRangeEnd("ab"), "ac");
  EXPECT_EQ(cluster::PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(cluster::PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(EtcdKeysTest, ParseEndpoints) {
  auto e = cluster::ParseEtcdEndpoints(" http://127.0.0.1:2379, 10.0.0.2:2379/ ,");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, (std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:2379"}));
  for (const char* bad : {"", " , ", "127.0.0.1", "host:", "host:99999", "host:0", ":2379",
                          "https://127.0.0.1:2379", "host:12ab"}) {
    auto r = cluster::ParseEtcdEndpoints(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(EtcdKeysTest, NodeRecordRoundTripAndBadInput) {
  cluster::NodeRecord r;
  r.info = {"node-1", "10.0.0.1:7070", true};
  r.data_plane_host = "host-a";
  r.capacity_bytes = 1ull << 40;
  auto back = cluster::DecodeNodeRecord(cluster::EncodeNodeRecord(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->info, r.info);
  EXPECT_EQ(back->data_plane_host, "host-a");
  EXPECT_EQ(back->capacity_bytes, 1ull << 40);
  for (const char* bad : {"", "{", "[]", "{\"address\": 7}", "{\"node_id\": \"x\"}", "\xff\xfe"}) {
    EXPECT_EQ(cluster::DecodeNodeRecord(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(cluster::ValidateKeySegment("id", "a/b").ok());
  EXPECT_FALSE(cluster::ValidateKeySegment("id", "").ok());
  EXPECT_FALSE(cluster::ValidateKeySegment("id", "a b").ok());
  EXPECT_TRUE(cluster::ValidateKeySegment("id", "host-1:7070").ok());
}

using EtcdClientTest = EtcdTest;

TEST_F(EtcdClientTest, PutGetListDelete) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put("/t/a", "1").ok());
  ASSERT_TRUE(c->Put("/t/b", "2").ok());
  ASSERT_TRUE(c->Put("/t/b", "22").ok());
  ASSERT_TRUE(c->Put("/u/c", "3").ok());
  auto a = c->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->value, "1");
  EXPECT_EQ(c->Get("/t/zz").status().code(), StatusCode::kNotFound);
  auto list = c->GetPrefix("/t/");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->kvs.size(), 2u);
  EXPECT_EQ(list->kvs[0].key, "/t/a");
  EXPECT_EQ(list->kvs[1].value, "22");
  EXPECT_GT(list->revision, 0);
  auto deleted = c->Delete("/t/a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(*c->Delete("/t/a"), 0);
  EXPECT_EQ(*c->DeletePrefix("/t/"), 1);
  EXPECT_TRUE(c->GetPrefix("/t/")->kvs.empty());
  EXPECT_EQ(c->Get("/u/c")->value, "3");
  EXPECT_EQ(c->Put("", "x").code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, PutIfAbsentWritesOnlyWhereNothingIs) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  auto lease = c->LeaseGrant(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto first = c->PutIfAbsent("/p/a", "mine", lease->id);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->has_value());
  // Present: nothing is written, and what is there comes back.
  auto second = c->PutIfAbsent("/p/a", "theirs");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->value, "mine");
  EXPECT_EQ((*second)->lease, lease->id);
  auto now = c->Get("/p/a");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->value, "mine");
  EXPECT_EQ(now->lease, lease->id);
  // Gone again: written again.
  ASSERT_EQ(c->Delete("/p/a").value(), 1);
  auto third = c->PutIfAbsent("/p/a", "theirs");
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->has_value());
  EXPECT_EQ(c->Get("/p/a")->value, "theirs");
  // A lease etcd does not know, and no key at all.
  EXPECT_EQ(c->PutIfAbsent("/p/b", "x", lease->id + 12345).status().code(),
            StatusCode::kLeaseExpired);
  EXPECT_EQ(c->Get("/p/b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->PutIfAbsent("", "x").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, LeaseExpiryKeepAliveAndRevoke) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  // Kept alive past its TTL, the key stays. (2 s: etcd raises shorter
  // TTLs to its minimum, 2 s with the default election timeout.)
  auto kept = c->LeaseGrant(2);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->ttl_seconds, 2);
  ASSERT_TRUE(c->Put("/l/kept", "v", kept->id).ok());
  for (int i = 0; i < 8; ++i) {
    auto ttl = c->LeaseKeepAlive(kept->id);
    ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
    EXPECT_EQ(*ttl, 2);
    std::this_thread::sleep_for(milliseconds(400));
  }
  EXPECT_TRUE(c->Get("/l/kept").ok());
  // Left alone, it expires and takes the key with it.
  EXPECT_TRUE(WaitFor([&] { return !c->Get("/l/kept").ok(); }, milliseconds(5000)));
  EXPECT_EQ(c->LeaseKeepAlive(kept->id).status().code(), StatusCode::kLeaseExpired);
  EXPECT_EQ(c->Put("/l/late", "v", kept->id).code(), StatusCode::kLeaseExpired);

  // Revoke removes the key at once.
  auto revoked = c->LeaseGrant(60);
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(c->Put("/l/revoked", "v", revoked->id).ok());
  ASSERT_TRUE(c->LeaseRevoke(revoked->id).ok());
  EXPECT_EQ(c->Get("/l/revoked").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->LeaseRevoke(revoked->id).code(), StatusCode::kLeaseExpired);
  EXPECT_EQ(c->LeaseGrant(0).status().code(), StatusCode::kInvalidArgument);
}

// Records what a watch reports, thread-safely.
struct WatchLog {
  std::mutex mu;
  std::vector<std::string> lines;  // "reset:<n keys>", "put:<key>=<v>", "delete:<key>"
  EtcdWatchHandler Handler() {
    EtcdWatchHandler h;
    h.on_reset = [this](const EtcdRange& r) {
      std::lock_guard lock(mu);
      lines.push_back("reset:" + std::to_string(r.kvs.size()));
    };
    h.on_events = [this](const std::vector<EtcdEvent>& events) {
      std::lock_guard lock(mu);
      for (const EtcdEvent& e : events) {
        lines.push_back(e.type == EtcdEvent::Type::kPut ? "put:" + e.kv.key + "=" + e.kv.value
                                                        : "delete:" + e.kv.key);
      }
    };
    return h;
  }
  std::vector<std::string> Get() {
    std::lock_guard lock(mu);
    return lines;
  }
  bool Has(const std::string& line) {
    std::lock_guard lock(mu);
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  }
};

TEST_F(EtcdClientTest, WatchReportsListingThenEventsInOrder) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put("/w/before", "0").ok());
  ASSERT_TRUE(c->Put("/other", "x").ok());
  WatchLog log;
  auto watch = c->WatchPrefix("/w/", log.Handler());
  ASSERT_TRUE(WaitFor([&] { return watch->resets() == 1; }, milliseconds(5000)));
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  ASSERT_TRUE(c->Put("/other", "y").ok());  // outside the prefix
  ASSERT_TRUE(c->Put("/w/a", "2").ok());
  ASSERT_TRUE(c->Delete("/w/before").ok());
  ASSERT_TRUE(WaitFor([&] { return log.Has("delete:/w/before"); }, milliseconds(5000)));
  EXPECT_EQ(log.Get(),
            (std::vector<std::string>{"reset:1", "put:/w/a=1", "put:/w/a=2", "delete:/w/before"}));
}

TEST_F(EtcdClientTest, WatchRelistsAfterEtcdRestart) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  WatchLog log;
  auto watch = c->WatchPrefix("/w/", log.Handler());
  ASSERT_TRUE(WaitFor([&] { return watch->resets() == 1; }, milliseconds(5000)));
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  ASSERT_TRUE(WaitFor([&] { return log.Has("put:/w/a=1"); }, milliseconds(5000)));
  etcd_->Kill();
  std::string error;
  ASSERT_TRUE(etcd_->Restart(&error)) << error;
  // The watch comes back by itself: a fresh listing, then new events.
  ASSERT_TRUE(WaitFor([&] { return watch->resets() >= 2; }, milliseconds(10000)));
  ASSERT_TRUE(WaitFor([&] { return c->Put("/w/b", "2").ok(); }, milliseconds(10000)));
  EXPECT_TRUE(WaitFor([&] { return log.Has("put:/w/b=2"); }, milliseconds(5000)));
  EXPECT_TRUE(log.Has("reset:1"));  // the listing after the restart holds /w/a
}

TEST_F(EtcdClientTest, WatchRelistsAfterACompactionAndSaysSo) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  // Between the first listing and the watch that follows it, a write and a
  // compaction past it: the watch starts below the compacted revision.
  WatchLog log;
  EtcdWatchHandler h = log.Handler();
  std::mutex mu;
  std::vector<std::string> errors;
  bool compacted = false;
  h.on_reset = [&, inner = h.on_reset](const EtcdRange& r) {
    inner(r);
    if (compacted) return;
    compacted = true;
    ASSERT_TRUE(c->Put("/w/b", "2").ok());
    ASSERT_TRUE(c->Put("/x", "bump").ok());
    auto now = c->GetPrefix("/x");
    ASSERT_TRUE(now.ok());
    ASSERT_TRUE(c->Compact(now->revision).ok());
  };
  h.on_error = [&](const Status& st) {
    std::lock_guard lock(mu);
    errors.push_back(st.message());
  };
  auto watch = c->WatchPrefix("/w/", h);
  ASSERT_TRUE(WaitFor([&] { return watch->resets() >= 2; }, milliseconds(10000)));
  EXPECT_TRUE(WaitFor([&] { return log.Has("reset:2"); }, milliseconds(5000)));  // /w/b too
  std::lock_guard lock(mu);
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors.front().find("history compacted at revision"), std::string::npos)
      << errors.front();
}

TEST_F(EtcdClientTest, FailsOverToTheEndpointThatAnswers) {
  auto c = Connect({DeadEndpoint(), etcd_->endpoint()}, milliseconds(1000));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put("/f/a", "1").ok());
  EXPECT_EQ(c->Get("/f/a")->value, "1");
  auto lease = c->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(c->LeaseKeepAlive(lease->id).ok());
}

TEST_F(EtcdClientTest, UnreachableEtcdIsUnavailableNotAHang) {
  auto c = Connect({DeadEndpoint(), DeadEndpoint()}, milliseconds(500));
  ASSERT_NE(c, nullptr);
  const auto start = std::chrono::steady_clock::now();
  Status st = c->Put("/x", "1");
  EXPECT_TRUE(st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded)
      << st.ToString();
  // Two endpoints, a 500 ms deadline each: far below this bound.
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
  EtcdMembershipOptions o;
  o.endpoints = {DeadEndpoint()};
  o.call_timeout_ms = 500;
  auto m = OpenEtcdMembership(o);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();
}

// --- membership and registration (in-process registrations) ---

class EtcdMembershipTest : public EtcdTest {
 protected:
  std::unique_ptr<Membership> Open(const std::string& cluster = "test") {
    EtcdMembershipOptions o;
    o.endpoints = {etcd_->endpoint()};
    o.cluster = cluster;
    auto m = OpenEtcdMembership(o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  std::unique_ptr<NodeRegistration> Register(const std::string& id,
                                             std::atomic<bool>* draining = nullptr,
                                             seconds ttl = seconds(2)) {
    NodeRegistrationOptions o;
    o.etcd_endpoints = {etcd_->endpoint()};
    o.cluster = "test";
    o.record.info.node_id = id;
    o.record.info.address = "127.0.0.1:" + std::to_string(7000 + id.size());
    o.lease_ttl = ttl;
    if (draining != nullptr) o.draining = [draining] { return draining->load(); };
    auto r = NodeRegistration::Start(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  static std::vector<std::string> Ids(const Membership& m) {
    std::vector<std::string> ids;
    for (const NodeInfo& n : m.Nodes()) ids.push_back(n.node_id);
    return ids;
  }
};

TEST_F(EtcdMembershipTest, RegisteredNodesAppearSortedAndListenersHearChanges) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->Nodes().empty());
  std::mutex mu;
  std::vector<size_t> sizes;
  const uint64_t sub = m->Subscribe([&](const std::vector<NodeInfo>& nodes) {
    std::lock_guard lock(mu);
    sizes.push_back(nodes.size());
  });
  auto b = Register("node-b");
  auto a = Register("node-a");
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ids(*m) == std::vector<std::string>{"node-a", "node-b"};
      },
      milliseconds(5000)));
  EXPECT_EQ(m->Nodes()[0].address, "127.0.0.1:7006");
  EXPECT_FALSE(m->Nodes()[0].draining);
  ASSERT_TRUE(b->Deregister().ok());
  ASSERT_TRUE(
      WaitFor([&] { return Ids(*m) == std::vector<std::string>{"node-a"}; }, milliseconds(5000)));
  // Listeners hear a change just after Nodes() shows it.
  EXPECT_TRUE(WaitFor(
      [&] {
        std::lock_guard lock(mu);
        return !sizes.empty() && sizes.back() == 1u;
      },
      milliseconds(5000)));
  {
    std::lock_guard lock(mu);
    EXPECT_GE(sizes.size(), 2u);  // [1,] 2, 1: the two joins may come in one watch response
  }
  m->Unsubscribe(sub);
  const size_t heard = [&] {
    std::lock_guard lock(mu);
    return sizes.size();
  }();
  a.reset();  // deregisters
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().empty(); }, milliseconds(5000)));
  std::lock_guard lock(mu);
  EXPECT_EQ(sizes.size(), heard) << "a listener was called after Unsubscribe";
}

TEST_F(EtcdMembershipTest, DrainingShowsInTheRecord) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  std::atomic<bool> draining{false};
  auto r = Register("node-d", &draining);
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
  EXPECT_FALSE(m->Nodes()[0].draining);
  draining = true;
  EXPECT_TRUE(WaitFor([&] { return m->Nodes().size() == 1 && m->Nodes()[0].draining; },
                      milliseconds(5000)));
}

TEST_F(EtcdMembershipTest, AListingLargerThanGrpcsDefaultLimitStillLoads) {
  // Large values anyone may write under the cluster's prefix: the listing
  // is bigger than gRPC's 4 MiB default receive limit.
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  const std::string big((1 << 20) + (400 << 10), 'x');
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(c->Put("/strata/test/junk/" + std::to_string(i), big).ok());
  }
  auto r = Register("node-big");
  auto m = Open();
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(
      WaitFor([&] { return Ids(*m) == std::vector<std::string>{"node-big"}; }, milliseconds(5000)));
}

TEST_F(EtcdMembershipTest, ARefusedRecordUpdateDoesNotStopTheKeepAlives) {
  // etcd refuses every Put once its space quota is hit (the NOSPACE alarm)
  // but still renews leases: a node that starts draining then must stay
  // registered, under the same lease, not spin on the refused update.
  etcd_.reset();
  std::string error;
  etcd_ = EtcdProcess::Start(dir_ + "/etcd-quota", &error, 0, "",
                             {"--quota-backend-bytes", std::to_string(4 << 20)});
  ASSERT_NE(etcd_, nullptr) << error;
  auto m = Open();
  ASSERT_NE(m, nullptr);
  std::atomic<bool> draining{false};
  auto r = Register("node-q", &draining);
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
  const int64_t lease = r->lease_id();
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  const std::string big(1 << 20, 'x');
  // etcd checks the quota against its backend's size as last committed
  // (every 100 ms), so a quick burst of puts can all pass: past the quota,
  // put more slowly until one is refused.
  bool refused = false;
  for (int i = 0; i < 64 && !refused; ++i) {
    refused = !c->Put("/fill/" + std::to_string(i), big).ok();
    if (i >= 8 && !refused) std::this_thread::sleep_for(milliseconds(150));
  }
  ASSERT_TRUE(refused) << "etcd never hit its quota";
  draining = true;
  std::this_thread::sleep_for(seconds(6));  // three lease TTLs
  EXPECT_EQ(r->lease_id(), lease);
  EXPECT_EQ(r->registrations(), 1u);
  auto kv = c->Get(cluster::NodeKey("test", "node-q"));
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->lease, lease);
}

TEST_F(EtcdMembershipTest, SettingsFromEtcdBadValuesIgnored) {
  auto c = Connect({etcd_->endpoint()});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put(cluster::SettingKey("test", cluster::kReplicationFactorSetting), "2").ok());
  auto m = Open();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->Settings().replication_factor, 2u);
  EXPECT_EQ(m->Settings().block_tokens, 0u);
  ASSERT_TRUE(c->Put(cluster::SettingKey("test", cluster::kBlockTokensSetting), "256").ok());
  EXPECT_TRUE(WaitFor([&] { return m->Settings().block_tokens == 256; }, milliseconds(5000)));
  // As `echo 3 | etcdctl put KEY` writes it.
  ASSERT_TRUE(c->Put(cluster::SettingKey("test", cluster::kReplicationFactorSetting), "3\n").ok());
  EXPECT_TRUE(WaitFor([&] { return m->Settings().replication_factor == 3; }, milliseconds(5000)));
  ASSERT_TRUE(c->Put(cluster::SettingKey("test", cluster::kReplicationFactorSetting), "two").ok());
  EXPECT_TRUE(WaitFor([&] { return m->Settings().replication_factor == 1; }, milliseconds(5000)));
  // A garbage node record is skipped; the good ones stay.
  ASSERT_TRUE(c->Put(cluster::NodeKey("test", "junk"), "not json").ok());
  auto r = Register("node-ok");
  ASSERT_TRUE(
      WaitFor([&] { return Ids(*m) == std::vector<std::string>{"node-ok"}; }, milliseconds(5000)));
  // Another cluster's nodes are not ours.
  auto other = Open("other");
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(other->Nodes().empty());
}

TEST_F(EtcdMembershipTest, LostLeaseReRegisters) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  auto r = Register("node-l");
  ASSERT_TRUE(WaitFor([&] { return r->registered(); }, milliseconds(5000)));
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
  // Someone revokes the lease (an operator, or etcd losing it): the key
  // goes, and the registration puts it back under a new lease.
  auto c = Connect({etcd_->endpoint()});
  ASSERT_TRUE(c->LeaseRevoke(r->lease_id()).ok());
  EXPECT_TRUE(WaitFor([&] { return r->registrations() == 2; }, milliseconds(5000)));
  EXPECT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
}

TEST_F(EtcdMembershipTest, ADeletedKeyIsPutBackUnderTheLiveLease) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  auto r = Register("node-k");
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
  const int64_t lease = r->lease_id();
  // Someone deletes the key but the lease lives on: the node would serve
  // unseen. The registration notices at its next keep-alive.
  auto c = Connect({etcd_->endpoint()});
  ASSERT_EQ(c->Delete(cluster::NodeKey("test", "node-k")).value(), 1);
  EXPECT_TRUE(WaitFor([&] { return r->registrations() == 2; }, milliseconds(5000)));
  EXPECT_TRUE(WaitFor([&] { return m->Nodes().size() == 1; }, milliseconds(5000)));
  EXPECT_EQ(r->lease_id(), lease);
  auto kv = c->Get(cluster::NodeKey("test", "node-k"));
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->lease, lease);
}

// A second node started with the same id holds the key under its own
// lease: the first reports it and leaves it alone rather than fight.
TEST_F(EtcdMembershipTest, AKeyHeldByAnotherLeaseIsLeftAlone) {
  auto r = Register("node-t");
  ASSERT_TRUE(WaitFor([&] { return r->registered(); }, milliseconds(5000)));
  auto c = Connect({etcd_->endpoint()});
  auto other = c->LeaseGrant(30);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const std::string key = cluster::NodeKey("test", "node-t");
  ASSERT_TRUE(c->Put(key, "the other node", other->id).ok());
  // A 2 s TTL checks the key every ~0.7 s: several checks pass.
  std::this_thread::sleep_for(milliseconds(2500));
  auto kv = c->Get(key);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->value, "the other node");
  EXPECT_EQ(kv->lease, other->id);
  EXPECT_EQ(r->registrations(), 1u);
  EXPECT_TRUE(r->registered());
}

TEST_F(EtcdMembershipTest, EmptyEtcdAfterRestartGetsEveryoneBack) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  auto a = Register("node-a");
  auto b = Register("node-b");
  ASSERT_TRUE(WaitFor([&] { return m->Nodes().size() == 2; }, milliseconds(5000)));
  // etcd dies and comes back on the same port with its data lost: the
  // leases are gone, both nodes must register again, and the membership
  // (which re-lists) must see them.
  etcd_->Kill();
  std::filesystem::remove_all(dir_ + "/etcd/data");
  std::string error;
  ASSERT_TRUE(etcd_->Restart(&error)) << error;
  EXPECT_TRUE(WaitFor([&] { return a->registrations() >= 2 && b->registrations() >= 2; },
                      milliseconds(15000)));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Ids(*m) == std::vector<std::string>{"node-a", "node-b"};
      },
      milliseconds(10000)));
}

}  // namespace
}  // namespace strata::testing

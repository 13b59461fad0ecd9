// strata-node as users run it: a real process on loopback, reached through
// OpenStore("strata://...") and raw gRPC calls. Covers round trips over
// both data-plane modes, leases across the wire, a client killed while it
// holds leases, abort after a partial write, SIGTERM during transfers and a
// restart, tenant isolation, credentials, request limits, the admin calls,
// /metrics and /healthz, and many concurrent clients.
#include <absl/cleanup/cleanup.h>
#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "dataplane/data_plane.h"
#include "http2_flood.h"
#include "node/node.h"
#include "node_test_util.h"
#include "raw_socket.h"
#include "sanitizers.h"
#include "tampering_proxy.h"

namespace strata::testing {
namespace {

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir("node-test"); }
  void TearDown() override {
    node_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartNode(const NodeProcess::Options& options = {},
                 const std::vector<TestToken>& tokens = {}) {
    std::string error;
    node_ = NodeProcess::Start(dir_, options, &error, tokens);
    ASSERT_NE(node_, nullptr) << error;
  }

  std::string dir_;
  std::unique_ptr<NodeProcess> node_;
};

void ExpectSameBytes(const Fetched& f, const Prompt& p, size_t blocks, bool swa) {
  ASSERT_TRUE(f.outcome.status.ok()) << f.outcome.status.ToString();
  ASSERT_EQ(f.outcome.blocks_ready, blocks);
  for (size_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(f.blocks[b], p.blocks[b].bytes) << "block " << b;
  }
  ASSERT_EQ(f.outcome.swa_ready, swa);
  if (swa) {
    ASSERT_EQ(f.swa, p.swa.bytes);
  }
}

void RoundTrip(const NodeProcess& node, const std::string& mode, uint32_t seed) {
  auto store = Open(node, kTokenA.token, mode);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 4, seed);
  CommitAll(*store, p);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 4u);
  ASSERT_TRUE(m->swa.has_value());
  EXPECT_EQ(m->swa->boundary_blocks, 4u);
  EXPECT_NE(m->lease, 0u);
  const Fetched f = FetchAll(*store, *m);
  ExpectSameBytes(f, p, 4, true);
  // Every layer group of every block was announced, and the layer groups
  // of the whole prefix in order.
  size_t group_ready = 0;
  std::vector<uint32_t> layer_groups;
  for (const FetchEvent& e : f.events) {
    if (e.type == FetchEvent::Type::kGroupReady) ++group_ready;
    if (e.type == FetchEvent::Type::kLayerGroupDone) layer_groups.push_back(e.group);
  }
  EXPECT_EQ(group_ready, 4 * GlobalKv().groups.size());
  ASSERT_EQ(layer_groups.size(), GlobalKv().groups.size());
  for (size_t g = 0; g < layer_groups.size(); ++g) EXPECT_EQ(layer_groups[g], g);
  // The SWA state once, and early: a worker needs it, with layer group 0,
  // before it runs layer 0. (Its read is issued first; the order reads
  // complete in is the transport's, so only "before the last group".)
  const auto is = [](FetchEvent::Type t) {
    return [t](const FetchEvent& e) { return e.type == t; };
  };
  EXPECT_EQ(std::count_if(f.events.begin(), f.events.end(), is(FetchEvent::Type::kSwaReady)), 1);
  const auto swa_at =
      std::find_if(f.events.begin(), f.events.end(), is(FetchEvent::Type::kSwaReady));
  const auto last_group =
      std::find_if(f.events.rbegin(), f.events.rend(), is(FetchEvent::Type::kLayerGroupDone));
  ASSERT_NE(last_group, f.events.rend());
  EXPECT_LT(swa_at - f.events.begin(), f.events.rend() - last_group - 1);
  EXPECT_TRUE(store->Abort(m->lease).ok());
  EXPECT_EQ(NodeStats(node).read_leases(), 0u);
}

// A TCP relay to a port on loopback that holds every new connection for
// `delay` before passing bytes: a node whose handshake takes that long (a
// loaded host, a long round trip with TLS).
class SlowRelay {
 public:
  SlowRelay(int target_port, std::chrono::milliseconds delay)
      : target_port_(target_port), delay_(delay) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~SlowRelay() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  void Accept() {
    while (!stop_) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      pumps_.emplace_back([this, client] { Pump(client); });
    }
  }
  void Pump(int client) {
    std::this_thread::sleep_for(delay_);
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      char buf[16384];
      while (!stop_ && poll(fds, 2, 100) >= 0) {
        bool closed = false;
        for (int i = 0; i < 2; ++i) {
          if (fds[i].revents == 0) continue;
          const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
          if (n <= 0 || write(fds[1 - i].fd, buf, static_cast<size_t>(n)) != n) closed = true;
        }
        if (closed) break;
      }
    }
    close(server);
    close(client);
  }

  int target_port_;
  std::chrono::milliseconds delay_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // touched by the acceptor only, joined after it
};

TEST_F(NodeTest, SlowHandshakeStillConnects) {
  StartNode();
  // gRPC takes its "min reconnect backoff" as a connection attempt's
  // deadline: with it at 100 ms this node could never be reached.
  SlowRelay relay(node_->grpc_port(), std::chrono::milliseconds(400));
  ASSERT_GT(relay.port(), 0);
  ClientOptions options;
  options.token = kTokenA.token;
  auto store = OpenStore("strata://127.0.0.1:" + std::to_string(relay.port()), options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Prompt p = MakePrompt(**store, 3, 17);
  CommitAll(**store, p);
  auto m = MatchPrompt(**store, p, false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 3u);
}

TEST_F(NodeTest, RoundTripActiveMessages) {
  StartNode();
  RoundTrip(*node_, "am", 1);
}

TEST_F(NodeTest, RoundTripRma) {
  StartNode({.port = 0, .settings = {"data_plane_mode=rma"}},
            {kTokenA, kTokenReadA, kTokenAdminA, kTokenOperator});
  RoundTrip(*node_, "rma", 2);
}

// The local addresses of the TCP sockets process `pid` listens on, as
// /proc/net/tcp{,6} writes them (hex address:port).
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& fd : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.contains(inode)) out.push_back(local);  // 0A: LISTEN
    }
  }
  return out;
}

// Issue #38: a node told to listen on 127.0.0.1 opens no socket elsewhere,
// its data plane's UCX tcp transport included.
TEST_F(NodeTest, ListensOnlyOnTheConfiguredAddress) {
  if (std::getenv("UCX_NET_DEVICES") != nullptr) {
    GTEST_SKIP() << "UCX_NET_DEVICES is set: the environment chooses the node's devices";
  }
  StartNode();
  const std::vector<std::string> listening = ListeningAddresses(node_->pid());
  // gRPC, HTTP and at least one UCX tcp socket (on lo).
  EXPECT_GE(listening.size(), 3u);
  for (const std::string& local : listening) {
    // 127.0.0.1, or the same as an IPv4-mapped IPv6 address (gRPC's).
    EXPECT_TRUE(local.starts_with("0100007F:") ||
                local.starts_with("0000000000000000FFFF00000100007F:"))
        << "the node listens on " << local;
  }
  RoundTrip(*node_, "am", 5);
}

// `rma` trusts every client with the whole arena: refused at start-up when
// the tokens file names tenants that must not see each other.
TEST_F(NodeTest, RmaIsRefusedWhenSeveralTenantsShareTheNode) {
  std::string error;
  EXPECT_EQ(NodeProcess::Start(dir_, {.port = 0, .settings = {"data_plane_mode=rma"}}, &error),
            nullptr);
  EXPECT_NE(error.find("data_plane_mode rma lets every client read the whole arena"),
            std::string::npos)
      << error;
}

// Issue #39: two nodes on one port split clients between two stores (gRPC
// sets SO_REUSEPORT). The front door and the HTTP endpoint bind without
// it: the second node fails at start-up, saying the port is in use, and
// the first keeps serving.
TEST_F(NodeTest, ASecondNodeOnATakenPortDoesNotStart) {
  StartNode();
  std::string error;
  EXPECT_EQ(NodeProcess::Start(dir_, {.port = node_->grpc_port(), .settings = {}}, &error),
            nullptr);
  EXPECT_NE(error.find("in use"), std::string::npos) << error;
  // And the HTTP port alone, with a free gRPC port.
  EXPECT_EQ(
      NodeProcess::Start(
          dir_,
          {.port = 0, .settings = {"http_listen=127.0.0.1:" + std::to_string(node_->http_port())}},
          &error),
      nullptr);
  EXPECT_NE(error.find("in use"), std::string::npos) << error;
  RoundTrip(*node_, "am", 7);
}

// Issue #38: RMA exposes the node's memory to whoever reaches its UCX
// worker, so `auto` serves active messages only, whatever the tenants;
// RMA is the operator's explicit choice, for one tenant.
TEST_F(NodeTest, AutoServesActiveMessagesOnlyAndRmaIsOptIn) {
  for (const std::vector<TestToken>& tokens :
       {std::vector<TestToken>{},
        std::vector<TestToken>{kTokenA, kTokenReadA, kTokenAdminA, kTokenOperator}}) {
    StartNode({}, tokens);  // two tenants, then one
    ClientOptions rma;
    rma.token = kTokenA.token;
    rma.data_plane_mode = "rma";
    const Status refused = OpenStore(node_->uri(), rma).status();
    EXPECT_NE(refused.message().find("active-message reads only"), std::string::npos)
        << refused.ToString();
    // Not a node that is down (a cluster client would pass over it as one).
    EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
    RoundTrip(*node_, "auto", 3);  // active messages
    node_.reset();
  }
  StartNode({.port = 0, .settings = {"data_plane_mode=rma"}},
            {kTokenA, kTokenReadA, kTokenAdminA, kTokenOperator});
  EXPECT_NE(node_->Log().find("can read and write the node's memory"), std::string::npos);
  RoundTrip(*node_, "rma", 4);
}

TEST_F(NodeTest, ATenantsLeasesHoldAtMostHalfTheTierWhenOthersShareIt) {
  // 20 V4.1 blocks (about 4.4 MiB) are more than half of 8 MiB.
  const NodeProcess::Options small{0, {"dram_bytes=8MiB"}};
  StartNode(small);  // tenant-a and tenant-b
  EXPECT_NE(node_->Log().find("max_held_share_per_namespace auto"), std::string::npos);
  EXPECT_EQ(NodeStats(*node_, kTokenA.token).lease_held_limit_bytes(), 4u << 20);
  auto store = Open(*node_, kTokenA.token);
  const Prompt big = MakePrompt(*store, 20, 31);
  auto refused = store->Commit(TestModel(), Payloads(big, 0, big.blocks.size(), false));
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  // Half the tier is room enough for a smaller batch.
  const Prompt small_prompt = MakePrompt(*store, 10, 32);
  CommitAll(*store, small_prompt, false);
  auto m = MatchPrompt(*store, small_prompt);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const v1::StatsResponse held = NodeStats(*node_, kTokenA.token);
  EXPECT_GE(held.lease_held_bytes(), 10 * GlobalKv().PayloadBytes());
  EXPECT_EQ(held.leased_entries(), 10u);
  EXPECT_EQ(NodeStats(*node_, kTokenB.token).lease_held_bytes(), 0u);  // per namespace
  ASSERT_TRUE(store->Abort(m->lease).ok());
  EXPECT_EQ(NodeStats(*node_, kTokenA.token).lease_held_bytes(), 0u);
  store.reset();
  node_.reset();
  // With the node to itself, or with the operator's say-so, a tenant may
  // hold more.
  StartNode(small, {kTokenA, kTokenReadA, kTokenAdminA, kTokenOperator});
  store = Open(*node_, kTokenA.token);
  CommitAll(*store, MakePrompt(*store, 20, 33), false);
  store.reset();
  node_.reset();
  StartNode({0, {"dram_bytes=8MiB", "max_held_share_per_namespace=1"}});
  store = Open(*node_, kTokenA.token);
  CommitAll(*store, MakePrompt(*store, 20, 34), false);
}

TEST_F(NodeTest, RoundTripOverTcp) {
  // Both processes see UCX_TLS: the node inherits this environment.
  setenv("UCX_TLS", "tcp", 1);
  StartNode();
  RoundTrip(*node_, "auto", 3);
  unsetenv("UCX_TLS");
}

TEST_F(NodeTest, FetchWithoutMatchLeaseTakesItsOwn) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 3, 4);
  CommitAll(*store, p);
  auto m = MatchPrompt(*store, p, /*lease=*/false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->lease, 0u);
  ExpectSameBytes(FetchAll(*store, *m), p, 3, true);
  EXPECT_EQ(NodeStats(*node_).read_leases(), 0u);  // the fetch's own lease ended
}

// Fetches queued behind one to a node that hangs fail at their own
// deadline, not one timeout (and teardown) per fetch ahead of them.
TEST_F(NodeTest, FetchesQueuedBehindAHungNodeFailAtTheirOwnDeadline) {
  StartNode();
  auto store = Open(*node_, kTokenA.token, "am", Seconds(1));
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 2, 77);
  CommitAll(*store, p);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameBytes(FetchAll(*store, *m), p, 2, true);  // connected

  ASSERT_EQ(kill(node_->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(node_->pid()));
  constexpr int kFetches = 4;
  std::vector<double> seconds(kFetches, 0);
  std::vector<Status> results(kFetches);
  std::vector<std::thread> threads;
  threads.reserve(kFetches);
  for (int i = 0; i < kFetches; ++i) {
    threads.emplace_back([&, i] {
      const auto start = std::chrono::steady_clock::now();
      results[i] = FetchAll(*store, *m).outcome.status;
      seconds[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(kill(node_->pid(), SIGCONT), 0);
  for (int i = 0; i < kFetches; ++i) {
    EXPECT_EQ(results[i].code(), StatusCode::kDeadlineExceeded) << results[i].ToString();
  }
  // One fetch holds the data plane past its deadline while it tears the
  // endpoint down; every other one gives up at its own 1 s.
  std::sort(seconds.begin(), seconds.end());
  EXPECT_LT(seconds[kFetches - 2], 1.9) << "fetches waited out each other's timeouts";
}

// The GLOBAL_KV blocks of a prompt, as Reserve takes them.
std::vector<CommitBlock> BlocksOf(const Prompt& p) {
  std::vector<CommitBlock> blocks;
  for (const CommitPayload& c : Payloads(p, 0, p.blocks.size(), false)) blocks.push_back(c.block);
  return blocks;
}

// Issue #38: a tenant with its own admin token pinned half the tier and
// reserved the other half, and every other tenant's cache was evicted.
// Its pins and leases now share one cap; the other tenant keeps its cache.
TEST_F(NodeTest, ATenantsPinsAndLeasesShareOneCap) {
  StartNode({0, {"dram_bytes=8MiB"}});  // tenant-a and tenant-b: 4 MiB each
  auto theirs = Open(*node_, kTokenB.token);
  const Prompt kept = MakePrompt(*theirs, 6, 51);
  CommitAll(*theirs, kept, false);
  auto store = Open(*node_, kTokenA.token);
  const Prompt pinned = MakePrompt(*store, 9, 52);  // about 2 MiB
  CommitAll(*store, pinned, false);
  for (size_t b = 1; b <= 9; ++b) {
    v1::PinRequest pin;
    pin.mutable_entry()->set_key(
        std::string(reinterpret_cast<const char*>(pinned.keys[b].bytes.data()), 16));
    pin.mutable_entry()->set_kind(v1::GLOBAL_KV);
    pin.set_ttl_s(600);
    v1::PinResponse resp;
    ASSERT_TRUE(RawCall(*node_, kTokenAdminA.token, [&](auto ch, grpc::ClientContext* ctx) {
                  return v1::Admin::NewStub(ch)->Pin(ctx, pin, &resp);
                }).ok());
  }
  const v1::StatsResponse held = NodeStats(*node_, kTokenA.token);
  EXPECT_GE(held.lease_held_bytes(), 9 * GlobalKv().PayloadBytes());
  // Another 2 MiB would pass the 4 with the pins: refused, nothing evicted.
  const Prompt more = MakePrompt(*store, 10, 53);
  auto refused = store->Reserve(TestModel(), BlocksOf(more));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("pins"), std::string::npos)
      << refused.status().ToString();
  auto m = MatchPrompt(*theirs, kept, /*lease=*/false);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks.size(), 6u);
}

// Issue #38: a tenant committing a lot evicted the other tenant's cache as
// readily as its own. Each of two tenants is now owed half the tier; with
// that share off (=1), the other's older blocks go first.
TEST_F(NodeTest, ATenantCommittingALotEvictsItsOwnEntries) {
  for (const char* share : {"auto", "1"}) {
    SCOPED_TRACE(share);
    StartNode({0, {"dram_bytes=8MiB", std::string("committed_share_per_namespace=") + share}});
    EXPECT_EQ(node_->Log().find("committed_share_per_namespace auto") != std::string::npos,
              std::string(share) == "auto");
    auto theirs = Open(*node_, kTokenB.token);
    const Prompt kept = MakePrompt(*theirs, 6, 61);
    CommitAll(*theirs, kept, false);
    auto store = Open(*node_, kTokenA.token);
    for (uint32_t i = 0; i < 8; ++i) {  // 40 blocks, about 9 MiB
      CommitAll(*store, MakePrompt(*store, 5, 62 + i), false);
    }
    auto m = MatchPrompt(*theirs, kept, /*lease=*/false);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (std::string(share) == "auto") {
      EXPECT_EQ(m->blocks.size(), 6u);
    } else {
      EXPECT_LT(m->blocks.size(), 6u);
    }
    theirs.reset();
    store.reset();
    node_.reset();
  }
}

TEST_F(NodeTest, ReserveStagePublishAndAbortAfterPartialWrite) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 3, 5);
  const std::vector<CommitBlock> blocks = BlocksOf(p);

  // Partial write, then abort: nothing becomes visible, nothing stays held.
  auto r = store->Reserve(TestModel(), blocks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(r->write_lease, 0u);
  std::memcpy(r->blocks[0].buffer.data(), p.blocks[0].bytes.data(), p.blocks[0].bytes.size());
  ASSERT_TRUE(store->Abort(r->write_lease).ok());
  auto none = MatchPrompt(*store, p, false);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->blocks.empty());
  auto stats = NodeStats(*node_);
  EXPECT_EQ(stats.reserved_entries(), 0u);
  EXPECT_EQ(stats.write_leases(), 0u);
  EXPECT_EQ(stats.used_bytes(), 0u);

  // Reserve, write every buffer, publish with one bad checksum: the good
  // block before it is visible, the bad one and its descendant are not.
  r = store->Reserve(TestModel(), blocks);
  ASSERT_TRUE(r.ok());
  std::vector<uint64_t> checksums;
  for (size_t b = 0; b < 3; ++b) {
    std::memcpy(r->blocks[b].buffer.data(), p.blocks[b].bytes.data(), p.blocks[b].bytes.size());
    checksums.push_back(p.blocks[b].checksum);
  }
  checksums[1] ^= 1;
  auto published = store->Publish(r->write_lease, checksums);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_TRUE(published->blocks[0].ok());
  EXPECT_EQ(published->blocks[1].code(), StatusCode::kChecksumMismatch);
  EXPECT_FALSE(published->blocks[2].ok());
  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 1u);
}

// A reservation neither published nor aborted: the node drops it at its
// lease's expiry, and the client reclaims its staging buffers one lease TTL
// later (at the next Reserve), so a caller that forgets cannot grow the
// client without bound. Until then the buffers stay the caller's.
TEST_F(NodeTest, AbandonedReservationsAreReclaimed) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 3, 6);
  const std::vector<CommitBlock> blocks = BlocksOf(p);
  auto abandoned =
      store->Reserve(TestModel(), std::span(blocks).subspan(0, 1), 200 * kNanosPerMilli);
  ASSERT_TRUE(abandoned.ok()) << abandoned.status().ToString();
  auto kept = store->Reserve(TestModel(), std::span(blocks).subspan(1, 1), Seconds(30));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto later = store->Reserve(TestModel(), std::span(blocks).subspan(2, 1), Seconds(30));
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  ASSERT_NE(later->write_lease, 0u);
  const uint64_t sum = p.blocks[0].checksum;
  auto gone = store->Publish(abandoned->write_lease, std::span(&sum, 1));
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
  EXPECT_NE(gone.status().message().find("no reservation"), std::string::npos);
  // The live reservation kept its buffers.
  std::memcpy(kept->blocks[0].buffer.data(), p.blocks[1].bytes.data(), p.blocks[1].bytes.size());
  EXPECT_TRUE(store->Abort(kept->write_lease).ok());
  EXPECT_TRUE(store->Abort(later->write_lease).ok());
}

TEST_F(NodeTest, LeasesRenewAndExpireAcrossTheWire) {
  StartNode({.port = 0, .settings = {"read_lease_ttl=1s"}});
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 2, 6);
  CommitAll(*store, p, false);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok());
  ASSERT_NE(m->lease, 0u);
  EXPECT_EQ(NodeStats(*node_).read_leases(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_TRUE(store->RenewLease(m->lease, Seconds(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  // Still live thanks to the renewal.
  ExpectSameBytes(FetchAll(*store, *m), p, 2, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const Status renew = store->RenewLease(m->lease, Seconds(1));
  EXPECT_TRUE(renew.code() == StatusCode::kLeaseExpired || renew.code() == StatusCode::kNotFound)
      << renew.ToString();
  const Fetched late = FetchAll(*store, *m);
  EXPECT_FALSE(late.outcome.status.ok());
  EXPECT_EQ(late.outcome.blocks_ready, 0u);
  EXPECT_EQ(NodeStats(*node_).read_leases(), 0u);
}

// A node in this process, for its test hooks, with kTokenA as its one
// (writing) tenant.
Result<std::unique_ptr<Node>> StartInProcessNode(const std::string& dir,
                                                 Nanos shutdown_grace = Seconds(10)) {
  NodeConfig c;
  c.listen = "127.0.0.1:0";
  c.http_listen = "";
  c.dram_bytes = 64ull << 20;
  c.shutdown_grace = shutdown_grace;
  c.tokens_file = dir + "/tokens";
  std::ofstream(c.tokens_file) << HashToken(kTokenA.token) << " " << kTokenA.ns << " write\n";
  return Node::Start(c);
}
std::string TargetOf(const Node& node) { return "127.0.0.1:" + std::to_string(node.grpc_port()); }

// A client whose call ends (here: its deadline passes) before the node's
// answer leaves never learns the lease the node granted it. The node ends
// that lease at once instead of letting it pin the entries until its TTL:
// a read lease from Match and a write lease (with its reservations) from
// the Reserve of a commit. In-process node: the hook holds the handler
// between the grant and its answer until the client has given up.
TEST(NodeInProcessTest, ALeaseGrantedToAClientThatGaveUpEndsAtOnce) {
  const std::string dir = TempDir("node-gave-up");
  auto node = StartInProcessNode(dir);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const std::string uri = "strata://" + TargetOf(**node);
  ClientOptions patient;
  patient.token = kTokenA.token;
  auto store = OpenStore(uri, patient);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Prompt stored = MakePrompt(**store, 2, 71);
  CommitAll(**store, stored, /*with_swa=*/false);
  const Prompt fresh = MakePrompt(**store, 2, 72);

  ClientOptions hasty = patient;
  hasty.timeout = Seconds(2);  // the hook holds each call past it
  auto impatient = OpenStore(uri, hasty);
  ASSERT_TRUE(impatient.ok()) << impatient.status().ToString();
  std::atomic<bool> armed{false};
  std::atomic<int> held{0};
  std::promise<void> gave_up;
  std::shared_future<void> client_gone = gave_up.get_future().share();
  std::atomic<bool> node_saw_it{false};
  (*node)->SetAfterLeaseGrantHookForTesting([&](const std::function<bool()>& caller_left) {
    if (!armed.exchange(false)) return;
    ++held;
    (void)client_gone.wait_for(std::chrono::seconds(30));
    // gRPC tells the server a moment after the client gave up.
    for (int i = 0; i < 1000 && !caller_left(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    node_saw_it = caller_left();
  });
  auto leases_end = [&](uint64_t StoreStats::*leases) {
    for (int i = 0; i < 500 && (*node)->store().Stats().*leases != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return (*node)->store().Stats().*leases;
  };

  armed = true;
  auto m = MatchPrompt(**impatient, stored);  // a read lease for 2 blocks
  EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded) << m.status().ToString();
  ASSERT_EQ(held.load(), 1) << "the hook did not hold the match";
  EXPECT_EQ((*node)->store().Stats().read_leases, 1u) << "the lease was granted";
  gave_up.set_value();
  EXPECT_EQ(leases_end(&StoreStats::read_leases), 0u) << "the match's lease outlived its caller";
  EXPECT_TRUE(node_saw_it.exchange(false));

  std::promise<void> gave_up_again;
  client_gone = gave_up_again.get_future().share();
  armed = true;
  auto payloads = Payloads(fresh, 0, 2, /*with_swa=*/false);
  auto r = (*impatient)->Commit(TestModel(), payloads);
  EXPECT_FALSE(r.ok() && r->published == 2) << "the commit got through the held reserve";
  ASSERT_EQ(held.load(), 2) << "the hook did not hold the reserve";
  EXPECT_EQ((*node)->store().Stats().write_leases, 1u) << "the reservation was granted";
  gave_up_again.set_value();
  EXPECT_EQ(leases_end(&StoreStats::write_leases), 0u) << "the reservation outlived its caller";
  EXPECT_TRUE(node_saw_it.load());

  // Nothing was lost: the stored prompt is whole and the fresh one commits.
  (*node)->SetAfterLeaseGrantHookForTesting(nullptr);
  auto again = MatchPrompt(**store, stored);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->blocks.size(), 2u);
  ExpectSameBytes(FetchAll(**store, *again), stored, 2, /*swa=*/false);
  CommitAll(**store, fresh, /*with_swa=*/false);
  store->reset();
  impatient->reset();
  node->reset();
  std::filesystem::remove_all(dir);
}

// A Reserve that passed its draining check just before a stop began may
// still be granted: the stop waits for it, and for its writes and Publish,
// before it drains the data plane, so that commit is kept. The hook holds
// the Reserve between its check and its grant until the stop has begun.
TEST(NodeInProcessTest, AStopWaitsForAReserveBetweenItsDrainingCheckAndItsGrant) {
  const std::string dir = TempDir("node-stop-reserve");
  auto node = StartInProcessNode(dir, Seconds(60));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const std::string target = TargetOf(**node);
  ClientOptions o;
  o.token = kTokenA.token;
  o.timeout = Seconds(60);
  auto store = OpenStore("strata://" + target, o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Prompt p = MakePrompt(**store, 3, 81);
  std::promise<void> held, go;
  std::shared_future<void> released = go.get_future().share();
  std::atomic<bool> armed{true};
  (*node)->SetBeforeReserveHookForTesting([&] {
    if (!armed.exchange(false)) return;
    held.set_value();
    (void)released.wait_for(std::chrono::seconds(60));
  });
  auto commit = std::async(std::launch::async,
                           [&] { return (*store)->Commit(TestModel(), Payloads(p, 0, 3, false)); });
  // Let go on every way out, so a failed assertion does not leave the
  // commit held for a minute (it goes before the future, which waits for it).
  absl::Cleanup release = [&go] { go.set_value(); };
  ASSERT_EQ(held.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the hook did not hold the reserve";
  std::thread stop([&] { (*node)->Shutdown(); });
  bool draining = false;
  for (int i = 0; i < 3000 && !draining; ++i) {
    draining = NodeStats(target, kTokenA.token).draining();
    if (!draining) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(draining) << "the stop did not begin";
  std::move(release).Invoke();
  const Result<PublishResult> committed = commit.get();
  stop.join();
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(committed->published, 3u);
  const StoreStats st = (*node)->store().Stats();
  EXPECT_EQ(st.global_kv_entries, 3u);
  EXPECT_EQ(st.write_leases, 0u);
  store->reset();
  node->reset();
  std::filesystem::remove_all(dir);
}

TEST_F(NodeTest, LeasesOfAKilledClientExpire) {
  // The client is a child process, forked before this process touches
  // gRPC or UCX: it waits for the node's address, takes a read lease and a
  // write lease, says so, and is killed with both held.
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(go[1]);
    close(ready[0]);
    int port = 0;
    if (read(go[0], &port, sizeof(port)) != sizeof(port)) _exit(1);
    ClientOptions options;
    options.token = kTokenA.token;
    auto store = OpenStore("strata://127.0.0.1:" + std::to_string(port), options);
    char ok = 'n';
    if (store.ok()) {
      const std::vector<uint32_t> tokens = Tokens(2 * 256, 7);
      MatchRequest req;
      req.model_id = TestModel();
      req.tokens = tokens;
      req.take_lease = true;
      auto m = (*store)->Match(req);
      CommitBlock fresh{m.ok() ? m->prefix_key : ChainKey{},
                        StateKind::kGlobalKv,
                        kV41GlobalKvLayoutId,
                        MakeGlobalKvLayout(1).PayloadBytes(),
                        {}};
      fresh.key.bytes[0] ^= 0x5a;  // a block nobody committed
      auto r = (*store)->Reserve(TestModel(), std::span<const CommitBlock>(&fresh, 1), 0);
      if (m.ok() && m->lease != 0 && r.ok() && r->write_lease != 0) ok = 'y';
    }
    (void)!write(ready[1], &ok, 1);
    pause();
    _exit(0);
  }
  close(go[0]);
  close(ready[1]);
  // TTLs long enough that a loaded machine (ctest -j) still sees both
  // leases held before the kill.
  StartNode({.port = 0, .settings = {"read_lease_ttl=3s", "write_lease_ttl=3s"}});
  {
    auto store = Open(*node_, kTokenA.token);
    CommitAll(*store, MakePrompt(*store, 2, 7), false);
  }
  const int port = node_->grpc_port();
  ASSERT_EQ(write(go[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  close(go[1]);
  EXPECT_EQ(ok, 'y');
  auto stats = NodeStats(*node_);
  EXPECT_EQ(stats.read_leases(), 1u);
  EXPECT_EQ(stats.write_leases(), 1u);
  EXPECT_EQ(stats.reserved_entries(), 1u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Within a TTL plus a maintenance pass both are gone, and the space of
  // the reservation is back.
  for (int i = 0; i < 100; ++i) {
    stats = NodeStats(*node_);
    if (stats.read_leases() == 0 && stats.write_leases() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(stats.read_leases(), 0u);
  EXPECT_EQ(stats.write_leases(), 0u);
  EXPECT_EQ(stats.reserved_entries(), 0u);
  EXPECT_EQ(stats.global_kv_entries(), 2u);
}

TEST_F(NodeTest, SigtermDuringTransfersThenRestart) {
  const int port = FreePort();
  StartNode({.port = port, .settings = {}});
  auto writer = Open(*node_, kTokenA.token, "auto", Seconds(3));
  auto reader = Open(*node_, kTokenA.token, "auto", Seconds(3));
  const Prompt stored = MakePrompt(*writer, 4, 9);
  CommitAll(*writer, stored);

  // Readers and writers run while the node is told to stop. Every fetch
  // that reports bytes ready must have exactly the committed bytes.
  std::atomic<bool> stop{false};
  std::atomic<int> good_fetches{0}, failed_calls{0}, wrong_bytes{0};
  std::thread read_loop([&] {
    while (!stop.load()) {
      auto m = MatchPrompt(*reader, stored);
      if (!m.ok()) {
        ++failed_calls;
        continue;
      }
      const Fetched f = FetchAll(*reader, *m);
      for (uint32_t b = 0; b < f.outcome.blocks_ready; ++b) {
        if (f.blocks[b] != stored.blocks[b].bytes) ++wrong_bytes;
      }
      if (f.outcome.status.ok()) ++good_fetches;
      if (m->lease != 0) (void)reader->Abort(m->lease);
    }
  });
  std::thread write_loop([&] {
    for (uint32_t seed = 100; !stop.load(); ++seed) {
      Prompt p;
      p.tokens = Tokens(2 * 256, seed);
      p.keys = {stored.keys[0]};
      for (size_t b = 0; b < 2; ++b) {
        p.keys.push_back(ChainKeys::Next(
            p.keys.back(), std::span<const uint32_t>(p.tokens).subspan(b * 256, 256)));
        p.blocks.push_back(MakePayload(GlobalKv(), seed * 10 + b));
      }
      auto payloads = Payloads(p, 0, 2, false);
      if (!writer->Commit(TestModel(), payloads).ok()) ++failed_calls;
    }
  });
  while (good_fetches.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(node_->Terminate(), 0) << node_->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  read_loop.join();
  write_loop.join();
  EXPECT_EQ(wrong_bytes.load(), 0);
  EXPECT_GT(failed_calls.load(), 0);
  const std::string log = node_->Log();
  EXPECT_NE(log.find("event=node_stopped"), std::string::npos) << log;

  // While it is down, calls fail with UNAVAILABLE (or run out their deadline).
  auto down = MatchPrompt(*reader, stored);
  ASSERT_FALSE(down.ok());
  EXPECT_TRUE(down.status().code() == StatusCode::kUnavailable ||
              down.status().code() == StatusCode::kDeadlineExceeded)
      << down.status().ToString();

  // Restarted on the same port, the same clients carry on: the store is
  // empty (DRAM only) and takes new commits, and fetches verify.
  StartNode({.port = port, .settings = {}});
  Status last;
  bool recovered = false;
  for (int i = 0; i < 150 && !recovered; ++i) {  // sanitizer builds are slow
    auto m = MatchPrompt(*reader, stored, false);
    recovered = m.ok() && m->blocks.empty();
    if (!recovered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(recovered) << node_->Log();
  CommitAll(*writer, stored);
  auto m = MatchPrompt(*reader, stored);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameBytes(FetchAll(*reader, *m), stored, 4, true);
}

// Polls the node's log for `text` for up to 30 s.
bool LogShows(const NodeProcess& node, const std::string& text) {
  for (int i = 0; i < 300; ++i) {
    if (node.Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// SIGTERM while a commit is under way: the reservation's writes still land
// and its Publish is still served, so the commit is kept; new reservations
// are refused and reads go on meanwhile. The node stops as soon as no write
// is left, long before this test's grace of a minute.
TEST_F(NodeTest, SigtermLetsACommitUnderWayFinish) {
  StartNode({.port = 0, .settings = {"shutdown_grace=60s"}});
  auto store = Open(*node_, kTokenA.token);
  const Prompt stored = MakePrompt(*store, 2, 31);
  CommitAll(*store, stored);
  const Prompt p = MakePrompt(*store, 3, 32);
  auto r = store->Reserve(TestModel(), BlocksOf(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<uint64_t> checksums;
  for (size_t b = 0; b < 3; ++b) {
    std::memcpy(r->blocks[b].buffer.data(), p.blocks[b].bytes.data(), p.blocks[b].bytes.size());
    checksums.push_back(p.blocks[b].checksum);
  }

  ASSERT_EQ(kill(node_->pid(), SIGTERM), 0);
  ASSERT_TRUE(LogShows(*node_, "event=node_waiting_for_writes write_leases=1")) << node_->Log();
  auto m = MatchPrompt(*store, stored);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameBytes(FetchAll(*store, *m), stored, 2, true);
  ASSERT_TRUE(store->Abort(m->lease).ok());
  const Prompt refused = MakePrompt(*store, 1, 33);
  auto late = store->Reserve(TestModel(), BlocksOf(refused));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable) << late.status().ToString();

  auto published = store->Publish(r->write_lease, checksums);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  for (const Status& b : published->blocks) EXPECT_TRUE(b.ok()) << b.ToString();
  EXPECT_EQ(node_->Terminate(std::chrono::seconds(30)), 0) << node_->Log();
  EXPECT_NE(node_->Log().find("released_write_leases=0"), std::string::npos) << node_->Log();
  std::cerr << node_->Log();
}

// Issue #39: a client found its node again 5-14 s after a restart,
// growing with the outage, while a fresh client connected in 0.1 s. After
// outages of several lengths, with the client calling all along as a
// worker would, a full round trip (commit, match, verified fetch) now
// succeeds about a second after the node is back.
// An unleased match of `tokens` without SWA state.
Result<MatchResult> MatchTokens(Store& store, const std::vector<uint32_t>& tokens) {
  MatchRequest req;
  req.model_id = TestModel();
  req.tokens = tokens;
  req.want_swa = false;
  return store.Match(req);
}

TEST_F(NodeTest, AClientFindsARestartedNodeWithinAboutASecond) {
  const int port = FreePort();
  StartNode({.port = port, .settings = {}});
  auto store = Open(*node_, kTokenA.token, "auto", Seconds(2));
  ASSERT_NE(store, nullptr);
  uint32_t seed = 90;
  for (const auto outage : {std::chrono::milliseconds(500), std::chrono::milliseconds(2000),
                            std::chrono::milliseconds(6000)}) {
    ASSERT_EQ(node_->Terminate(), 0) << node_->Log();
    const auto back_at = std::chrono::steady_clock::now() + outage;
    while (std::chrono::steady_clock::now() < back_at) {
      EXPECT_FALSE(MatchTokens(*store, Tokens(256, seed)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    StartNode({.port = port, .settings = {}});
    const auto up = std::chrono::steady_clock::now();
    bool round_trip = false;
    Status last;
    while (!round_trip && std::chrono::steady_clock::now() - up < std::chrono::seconds(30)) {
      auto probe = MatchTokens(*store, Tokens(2 * 256, ++seed));
      if (!probe.ok()) {
        last = probe.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      Prompt p = MakePrompt(*store, 2, ++seed);
      auto committed = store->Commit(TestModel(), Payloads(p, 0, 2, false));
      auto m = committed.ok() ? MatchPrompt(*store, p) : committed.status();
      if (!m.ok()) {
        last = m.status();
        continue;
      }
      const Fetched f = FetchAll(*store, *m);
      round_trip = f.outcome.status.ok() && f.outcome.blocks_ready == 2;
      if (!round_trip) last = f.outcome.status;
      if (m->lease != 0) (void)store->Abort(m->lease);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - up).count();
    std::printf("outage %lld ms: a round trip %.2f s after the node was back\n",
                static_cast<long long>(outage.count()), seconds);
    ASSERT_TRUE(round_trip) << last.ToString();
    // About a second (0.05-1.5 s measured), with room for sanitizer builds
    // on a busy machine; before the fix it was 4-9 s.
    EXPECT_LT(seconds, 4.0) << "outage " << outage.count() << " ms";
  }
}

// OpenStore waits for a node that is slow to shake hands (here stopped for
// 3 s; a node busy after a flood under a sanitizer took over 2 s) up to its
// timeout: one failed 2 s connection attempt used to fail it. A node that
// is not there still fails it, with UNAVAILABLE.
TEST_F(NodeTest, OpenStoreWaitsForASlowNodeUpToItsTimeout) {
  StartNode();
  ASSERT_EQ(kill(node_->pid(), SIGSTOP), 0);
  std::thread resume([pid = node_->pid()] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    kill(pid, SIGCONT);
  });
  const auto start = std::chrono::steady_clock::now();
  auto store = Open(*node_, kTokenA.token, "auto", Seconds(15));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  resume.join();
  ASSERT_NE(store, nullptr);
  EXPECT_GT(waited, 2.5);
  RoundTrip(*node_, "auto", 3);

  ClientOptions options;
  options.token = kTokenA.token;
  options.timeout = Seconds(1);
  const auto refused = OpenStore("strata://127.0.0.1:" + std::to_string(FreePort()), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
}

// A reservation nobody finishes holds a stop up for the grace, no longer.
TEST_F(NodeTest, SigtermWaitsForAnAbandonedReservationOnlyForTheGrace) {
  StartNode();  // shutdown_grace=2s
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 1, 34);
  auto r = store->Reserve(TestModel(), BlocksOf(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(node_->Terminate(std::chrono::seconds(30)), 0) << node_->Log();
  const std::string log = node_->Log();
  EXPECT_NE(log.find("event=node_writes_unfinished write_leases=1"), std::string::npos) << log;
  EXPECT_NE(log.find("released_write_leases=1"), std::string::npos) << log;
}

// Issue #38: Stats with a tenant's token told node-wide counters (lookups,
// hits, bytes sent, entries and bytes of other tenants, evictions). A
// tenant now sees its own figures only; the operator sees the node.
TEST_F(NodeTest, ATenantsStatsAreItsOwn) {
  StartNode();
  auto a = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*a, 3, 61);
  CommitAll(*a, p, /*with_swa=*/true);
  const uint64_t a_lookups_before = NodeStats(*node_, kTokenA.token).match_requests();
  auto m = MatchPrompt(*a, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameBytes(FetchAll(*a, *m), p, 3, true);

  // Tenant B looks the same prompt up (a miss: the keys are A's) and sees
  // its own lookup, none of A's.
  auto b_store = Open(*node_, kTokenB.token);
  auto miss = MatchPrompt(*b_store, p, false);
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_TRUE(miss->blocks.empty());
  const v1::StatsResponse b = NodeStats(*node_, kTokenB.token);
  EXPECT_EQ(b.scope(), "namespace");
  EXPECT_EQ(b.global_kv_entries() + b.swa_entries() + b.used_bytes(), 0u);
  EXPECT_EQ(b.match_requests(), 1u);
  EXPECT_EQ(b.match_tokens(), 3u * 256);
  EXPECT_EQ(b.hit_tokens() + b.hit_bytes(), 0u);
  EXPECT_EQ(b.read_leases() + b.write_leases() + b.reserved_entries() + b.payload_bytes(), 0u);
  EXPECT_EQ(b.data_plane_bytes_sent() + b.data_plane_bytes_received(), 0u);
  EXPECT_EQ(b.namespaces_size() + b.data_plane_transports_size(), 0);
  for (const auto& [reason, n] : b.evictions()) EXPECT_EQ(n, 0u) << reason;

  const v1::StatsResponse own = NodeStats(*node_, kTokenA.token);
  EXPECT_EQ(own.scope(), "namespace");
  EXPECT_EQ(own.global_kv_entries(), 3u);
  EXPECT_EQ(own.swa_entries(), 1u);
  EXPECT_GT(own.used_bytes(), 0u);
  EXPECT_EQ(own.match_requests() - a_lookups_before, 1u);
  EXPECT_EQ(own.hit_tokens(), 3u * 256);
  EXPECT_EQ(own.leased_entries(), 4u);         // the match's lease: 3 blocks and the SWA state
  EXPECT_EQ(own.data_plane_bytes_sent(), 0u);  // node-wide, not told

  const v1::StatsResponse node = NodeStats(*node_, kTokenOperator.token);
  EXPECT_EQ(node.scope(), "node");
  EXPECT_EQ(node.global_kv_entries(), 3u);
  EXPECT_EQ(node.read_leases(), 1u);
  EXPECT_GT(node.data_plane_bytes_sent(), 0u);
  ASSERT_TRUE(a->Abort(m->lease).ok());
}

TEST_F(NodeTest, TenantsAreIsolated) {
  StartNode();
  auto a = Open(*node_, kTokenA.token);
  auto b = Open(*node_, kTokenB.token);
  const Prompt p = MakePrompt(*a, 2, 10);
  CommitAll(*a, p);

  // Same tokens, other namespace: other keys, no hit.
  auto mb = MatchPrompt(*b, p);
  ASSERT_TRUE(mb.ok());
  EXPECT_TRUE(mb->blocks.empty());
  // Even with A's keys in hand, B finds nothing.
  MatchKeysRequest by_keys;
  by_keys.model_id = TestModel();
  by_keys.root = p.keys[0];
  std::vector<ChainKey> keys(p.keys.begin() + 1, p.keys.end());
  by_keys.keys = keys;
  by_keys.take_lease = true;
  auto stolen = b->MatchKeys(by_keys);
  ASSERT_TRUE(stolen.ok());
  EXPECT_TRUE(stolen->blocks.empty());

  // B cannot use A's lease to fetch: the node checks the lease's owner.
  auto ma = MatchPrompt(*a, p);
  ASSERT_TRUE(ma.ok());
  ASSERT_EQ(ma->blocks.size(), 2u);
  auto bstore_am = Open(*node_, kTokenB.token, "am");
  const Fetched f = FetchAll(*bstore_am, *ma);
  EXPECT_FALSE(f.outcome.status.ok());
  EXPECT_EQ(f.outcome.blocks_ready, 0u);
  EXPECT_FALSE(bstore_am->RenewLease(ma->lease, 0).ok());
  EXPECT_TRUE(bstore_am->Abort(ma->lease).ok());   // a no-op for B
  EXPECT_EQ(NodeStats(*node_).read_leases(), 1u);  // A's lease still stands

  // Admin calls act in the token's namespace only.
  v1::InspectRequest inspect;
  *inspect.mutable_entry() = [&] {
    v1::EntryRef r;
    r.set_key(std::string(reinterpret_cast<const char*>(p.keys[1].bytes.data()), 16));
    r.set_kind(v1::GLOBAL_KV);
    return r;
  }();
  auto call_inspect = [&](const char* token, const std::string& ns) {
    v1::InspectRequest req = inspect;
    req.set_namespace_(ns);
    v1::EntryInfo info;
    return RawCall(*node_, token, [&](auto ch, grpc::ClientContext* ctx) {
      return v1::Admin::NewStub(ch)->Inspect(ctx, req, &info);
    });
  };
  EXPECT_TRUE(call_inspect(kTokenAdminA.token, "").ok());
  EXPECT_EQ(call_inspect(kTokenAdminB.token, "").code(), StatusCode::kNotFound);
  EXPECT_EQ(call_inspect(kTokenAdminB.token, "tenant-a").code(), StatusCode::kPermissionDenied);
  // A name too long to echo back is refused as such (1 MiB: it would not fit
  // in the reply's trailers).
  EXPECT_EQ(call_inspect(kTokenAdminB.token, std::string(1 << 20, 'n')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(call_inspect(kTokenA.token, "").code(), StatusCode::kPermissionDenied);  // not admin
  EXPECT_TRUE(call_inspect(kTokenOperator.token, "tenant-a").ok());
  EXPECT_EQ(call_inspect(kTokenOperator.token, "").code(), StatusCode::kInvalidArgument);

  // Evicting from B's namespace leaves A's entries alone.
  v1::EvictRequest evict;
  evict.mutable_filter();
  v1::EvictResponse evicted;
  ASSERT_TRUE(RawCall(*node_, kTokenAdminB.token, [&](auto ch, grpc::ClientContext* ctx) {
                return v1::Admin::NewStub(ch)->Evict(ctx, evict, &evicted);
              }).ok());
  EXPECT_EQ(evicted.evicted(), 0u);
  auto still = MatchPrompt(*a, p, false);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->blocks.size(), 2u);
}

TEST_F(NodeTest, CredentialsAndRoles) {
  StartNode();
  // No token, a wrong token: UNAUTHENTICATED, from OpenStore and raw calls.
  ClientOptions none;
  none.token = "not-a-token";
  auto bad = OpenStore(node_->uri(), none);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnauthenticated);
  v1::StatsResponse stats;
  auto stats_call = [&](auto ch, grpc::ClientContext* ctx) {
    return v1::CacheStore::NewStub(ch)->Stats(ctx, v1::StatsRequest(), &stats);
  };
  EXPECT_EQ(RawCall(*node_, nullptr, stats_call).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(RawCall(*node_, "", stats_call).code(), StatusCode::kUnauthenticated);

  // A read token matches and fetches but cannot write.
  auto writer = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*writer, 2, 11);
  CommitAll(*writer, p, false);
  auto reader = Open(*node_, kTokenReadA.token);
  auto m = MatchPrompt(*reader, p);
  ASSERT_TRUE(m.ok());
  ExpectSameBytes(FetchAll(*reader, *m), p, 2, false);
  const Prompt q = MakePrompt(*writer, 1, 12);
  auto payloads = Payloads(q, 0, 1, false);
  auto denied = reader->Commit(TestModel(), payloads);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied);

  // The operator token is for admin calls only.
  ClientOptions op;
  op.token = kTokenOperator.token;
  auto op_store = OpenStore(node_->uri(), op);
  ASSERT_FALSE(op_store.ok());
  EXPECT_EQ(op_store.status().code(), StatusCode::kPermissionDenied);
}

TEST_F(NodeTest, OversizedAndMalformedRequestsAreRejected) {
  StartNode();
  auto match = [&](const v1::MatchRequest& req) {
    v1::MatchResponse resp;
    return RawCall(*node_, kTokenA.token, [&](auto ch, grpc::ClientContext* ctx) {
      return v1::CacheStore::NewStub(ch)->Match(ctx, req, &resp);
    });
  };
  v1::MatchRequest req;
  req.set_model_id(std::string(16, 'm'));
  req.set_root_key(std::string(16, 'r'));
  req.set_block_tokens(256);
  req.set_keys(std::string(16 * 4097, 'k'));
  EXPECT_EQ(match(req).code(), StatusCode::kInvalidArgument);
  req.set_keys("short");
  EXPECT_EQ(match(req).code(), StatusCode::kInvalidArgument);
  req.clear_keys();
  req.set_block_tokens(0);
  EXPECT_EQ(match(req).code(), StatusCode::kInvalidArgument);
  req.set_block_tokens(256);
  req.set_lease_ttl_ms(3'600'000);
  EXPECT_EQ(match(req).code(), StatusCode::kInvalidArgument);
  req.set_lease_ttl_ms(0);
  req.set_model_id("");
  EXPECT_EQ(match(req).code(), StatusCode::kInvalidArgument);

  v1::ReserveRequest reserve;
  reserve.set_model_id(std::string(16, 'm'));
  v1::CommitBlock* b = reserve.add_blocks();
  b->set_key(std::string(16, 'k'));
  b->set_kind(v1::GLOBAL_KV);
  b->set_layout_id(kV41GlobalKvLayoutId);
  b->set_payload_bytes(1ull << 40);  // far beyond one entry's limit
  v1::ReserveResponse reserved;
  EXPECT_EQ(RawCall(*node_, kTokenA.token,
                    [&](auto ch, grpc::ClientContext* ctx) {
                      return v1::CacheStore::NewStub(ch)->Reserve(ctx, reserve, &reserved);
                    })
                .code(),
            StatusCode::kInvalidArgument);
  b->set_payload_bytes(GlobalKv().PayloadBytes());
  b->set_kind(static_cast<v1::StateKind>(77));
  EXPECT_EQ(RawCall(*node_, kTokenA.token,
                    [&](auto ch, grpc::ClientContext* ctx) {
                      return v1::CacheStore::NewStub(ch)->Reserve(ctx, reserve, &reserved);
                    })
                .code(),
            StatusCode::kInvalidArgument);
  // A request over gRPC's size limit never reaches a handler.
  v1::PublishRequest huge;
  for (int i = 0; i < 600'000; ++i) huge.add_checksums(i);
  v1::PublishResponse published;
  EXPECT_FALSE(RawCall(*node_, kTokenA.token, [&](auto ch, grpc::ClientContext* ctx) {
                 return v1::CacheStore::NewStub(ch)->Publish(ctx, huge, &published);
               }).ok());
  // The node is fine afterwards.
  EXPECT_EQ(NodeStats(*node_).global_kv_entries(), 0u);
}

TEST_F(NodeTest, AdminListEvictPinAndDrain) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 3, 13);
  const Prompt q = MakePrompt(*store, 2, 14);
  CommitAll(*store, p);
  CommitAll(*store, q, false);
  auto admin = [&](const char* token, auto fn) {
    return RawCall(*node_, token, [&](auto ch, grpc::ClientContext* ctx) {
      return fn(v1::Admin::NewStub(ch).get(), ctx);
    });
  };
  // List in pages of two: 6 entries (5 blocks + 1 SWA state), no repeats.
  std::set<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    v1::ListEntriesRequest req;
    req.set_page_size(2);
    req.set_page_token(token);
    v1::ListEntriesResponse resp;
    ASSERT_TRUE(admin(kTokenAdminA.token, [&](auto* stub, grpc::ClientContext* ctx) {
                  return stub->ListEntries(ctx, req, &resp);
                }).ok());
    for (const auto& e : resp.entries()) {
      EXPECT_TRUE(seen.insert(e.key() + std::to_string(e.kind())).second);
      EXPECT_EQ(e.namespace_(), "tenant-a");
    }
    token = resp.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(pages, 3);

  // Pin block 0 of q; evicting everything keeps it (not its child).
  v1::PinRequest pin;
  pin.mutable_entry()->set_key(
      std::string(reinterpret_cast<const char*>(q.keys[1].bytes.data()), 16));
  pin.mutable_entry()->set_kind(v1::GLOBAL_KV);
  pin.set_ttl_s(60);
  v1::PinResponse pinned;
  ASSERT_TRUE(admin(kTokenAdminA.token, [&](auto* stub, grpc::ClientContext* ctx) {
                return stub->Pin(ctx, pin, &pinned);
              }).ok());
  // Evict by prompt prefix, dry run first: p's blocks from block 1 down.
  v1::EvictRequest by_prefix;
  for (size_t k = 1; k <= 2; ++k) {
    by_prefix.mutable_prefix()->add_keys(
        std::string(reinterpret_cast<const char*>(p.keys[k].bytes.data()), 16));
  }
  by_prefix.set_dry_run(true);
  v1::EvictResponse report;
  v1::EvictRequest garbled = by_prefix;  // a short key anywhere spoils the prompt
  garbled.mutable_prefix()->mutable_keys(0)->resize(15);
  EXPECT_EQ(admin(kTokenAdminA.token,
                  [&](auto* stub, grpc::ClientContext* ctx) {
                    return stub->Evict(ctx, garbled, &report);
                  })
                .code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(admin(kTokenAdminA.token, [&](auto* stub, grpc::ClientContext* ctx) {
                return stub->Evict(ctx, by_prefix, &report);
              }).ok());
  EXPECT_EQ(report.evicted(), 2u);  // blocks 1 and 2 of p
  auto m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 3u);  // a dry run changes nothing
  by_prefix.set_dry_run(false);
  ASSERT_TRUE(admin(kTokenAdminA.token, [&](auto* stub, grpc::ClientContext* ctx) {
                return stub->Evict(ctx, by_prefix, &report);
              }).ok());
  m = MatchPrompt(*store, p, false);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks.size(), 1u);

  // Evict the whole namespace while a lease holds p's block 0: deferred.
  auto leased = MatchPrompt(*store, p);
  ASSERT_TRUE(leased.ok());
  v1::EvictRequest all;
  all.mutable_filter();
  ASSERT_TRUE(admin(kTokenAdminA.token, [&](auto* stub, grpc::ClientContext* ctx) {
                return stub->Evict(ctx, all, &report);
              }).ok());
  EXPECT_EQ(report.deferred(), 1u);
  EXPECT_EQ(report.skipped_pinned(), 1u);
  ASSERT_TRUE(store->Abort(leased->lease).ok());
  auto mq = MatchPrompt(*store, q, false);
  ASSERT_TRUE(mq.ok());
  EXPECT_EQ(mq->blocks.size(), 1u);  // the pinned block stays, its child went

  // Drain: operator only; new writes refused, reads go on, /healthz says so.
  v1::DrainResponse drained;
  EXPECT_EQ(admin(kTokenAdminA.token,
                  [&](auto* stub, grpc::ClientContext* ctx) {
                    return stub->Drain(ctx, v1::DrainRequest(), &drained);
                  })
                .code(),
            StatusCode::kPermissionDenied);
  ASSERT_TRUE(admin(kTokenOperator.token, [&](auto* stub, grpc::ClientContext* ctx) {
                return stub->Drain(ctx, v1::DrainRequest(), &drained);
              }).ok());
  const Prompt r = MakePrompt(*store, 1, 15);
  auto payloads = Payloads(r, 0, 1, false);
  auto refused = store->Commit(TestModel(), payloads);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(MatchPrompt(*store, q, false)->blocks.size(), 1u);  // reads go on
  httplib::Client http("127.0.0.1", node_->http_port());
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_TRUE(NodeStats(*node_).draining());
}

// /healthz says ok and /metrics answers 200 on 127.0.0.1:`port`; the
// metrics text ("" when either failed).
std::string ScrapeHealthyNode(int port) {
  httplib::Client http("127.0.0.1", port);
  auto health = http.Get("/healthz");
  auto metrics = http.Get("/metrics");
  EXPECT_TRUE(health && health->status == 200);
  EXPECT_TRUE(metrics && metrics->status == 200);
  return health && health->status == 200 && metrics && metrics->status == 200 ? metrics->body
                                                                              : std::string();
}

// The value of the sample `name` (labels included) in Prometheus text; -1
// when absent.
double MetricValue(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// Issue #38, on a real node: slow-header clients and an endless head no
// longer block /metrics and /healthz or grow the node's memory.
TEST_F(NodeTest, TheHttpPortTakesSlowAndEndlessClients) {
  StartNode();
  const int port = node_->http_port();
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    const std::string partial = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    ASSERT_GT(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL), 0);
    slow.push_back(fd);
  }
  absl::Cleanup close_slow = [&] {
    for (int fd : slow) close(fd);
  };
  const uint64_t rss_before = ResidentBytes(node_->pid());
  for (int i = 0; i < 4; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    // Socket buffers take a few MB; the node itself stops at its head limit.
    EXPECT_LT(SendEndlessHead(fd, 64u << 20), 16u << 20) << "the node kept taking an endless head";
    close(fd);
  }
  EXPECT_FALSE(ScrapeHealthyNode(port).empty());
  EXPECT_LT(ResidentBytes(node_->pid()), rss_before + (8u << 20));
  // A refused POST ends its connection: its body is never a request.
  const std::string smuggled = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string reply = RawExchange(
      port, "POST /metrics HTTP/1.1\r\nContent-Length: " + std::to_string(smuggled.size()) +
                "\r\n\r\n" + smuggled);
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_EQ(reply.find("strata_"), std::string::npos) << reply;
}

// Issue #38: a flood of HTTP/2 streams opened and reset at once, from a few
// unauthenticated connections, grew the node to ~32,000 threads and 4 GB
// and made it unavailable for minutes. Bounded here to 2 flooders that
// reconnect whenever they are cut off, 4 s and 100 million streams: the node
// keeps answering an authenticated client (a new connection per call) all
// along, with its threads and memory bounded.
TEST_F(NodeTest, RapidResetFloodLeavesTheNodeServing) {
  StartNode();
  const pid_t pid = node_->pid();
  const uint64_t rss_before = ResidentBytes(pid);
  std::atomic<bool> flooding{true};
  FloodResult flood;
  std::thread attacker([&] {
    flood = RapidResetFlood(node_->grpc_port(), 2, 100'000'000, std::chrono::seconds(4));
    flooding = false;
  });
  int calls = 0, failed = 0, max_threads = 0;
  uint64_t max_rss = rss_before;
  std::string first_error;
  while (flooding.load()) {
    max_threads = std::max(max_threads, ThreadCount(pid));
    max_rss = std::max(max_rss, ResidentBytes(pid));
    v1::StatsResponse resp;
    const Status st = RawCall(*node_, kTokenA.token, [&](auto channel, grpc::ClientContext* ctx) {
      return v1::CacheStore::NewStub(channel)->Stats(ctx, v1::StatsRequest(), &resp);
    });
    ++calls;
    if (!st.ok()) {
      ++failed;
      if (first_error.empty()) first_error = st.ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  attacker.join();
  const std::string metrics = ScrapeHealthyNode(node_->http_port());
  const double relayed = MetricValue(metrics, "strata_grpc_resets_relayed_total");
  std::printf(
      "flood: %llu streams sent on %llu connections, %.0f resets relayed to gRPC; %d "
      "authenticated calls, %d failed; node threads <= %d, RSS %llu -> <= %llu MiB\n",
      static_cast<unsigned long long>(flood.streams),
      static_cast<unsigned long long>(flood.connections), relayed, calls, failed, max_threads,
      static_cast<unsigned long long>(rss_before >> 20),
      static_cast<unsigned long long>(max_rss >> 20));
  EXPECT_GT(MetricValue(metrics, "strata_grpc_connections_closed_total{reason=\"reset_flood\"}"),
            0);
  EXPECT_EQ(flood.connections_made, 2);
  EXPECT_GT(flood.streams, 1000u) << "the flood never got going";
  EXPECT_GT(calls, 0);
  EXPECT_EQ(failed, 0) << first_error;
  EXPECT_LT(max_threads, 600);  // the gRPC server's 512, and the node's own
  // The node itself is a child process built like this test.
  const uint64_t memory_room = (kUnderAsan ? 768u : 256u) << 20;  // ASan's quarantine holds 256 MiB
  EXPECT_LT(max_rss, rss_before + memory_room);
  // And afterwards, as before.
  auto store = Open(*node_, kTokenA.token);
  ASSERT_NE(store, nullptr);
  RoundTrip(*node_, "am", 6);
}

TEST_F(NodeTest, MetricsAndHealth) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  const Prompt p = MakePrompt(*store, 2, 16);
  CommitAll(*store, p, false);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok());
  ExpectSameBytes(FetchAll(*store, *m), p, 2, false);
  const std::string body = ScrapeHealthyNode(node_->http_port());
  EXPECT_NE(body.find("strata_node_rpc_total{method=\"Match\",code=\"OK\"}"), std::string::npos)
      << body.substr(0, 2000);
  EXPECT_NE(body.find("strata_hit_tokens_total 512"), std::string::npos);
  EXPECT_NE(body.find("strata_node_rpc_seconds_bucket"), std::string::npos);
  // The data plane's own lines follow: nothing stuck in flight.
  EXPECT_NE(body.find("# TYPE strata_dataplane_requests_total counter\n"), std::string::npos);
  EXPECT_NE(body.find("\nstrata_dataplane_transfers_in_flight 0\n"), std::string::npos);
  EXPECT_NE(body.find("\nstrata_dataplane_oldest_transfer_seconds 0\n"), std::string::npos);
}

TEST_F(NodeTest, JsonLogsStayJsonAndABadLogLevelIsRefusedAloud) {
  // A start failure quotes its status text: every line must still parse.
  std::string error;
  EXPECT_EQ(NodeProcess::Start(dir_,
                               {.settings = {"log_format=json",
                                             "tokens_file=" + dir_ + "/no \"such\" dir/tokens"}},
                               &error),
            nullptr);
  std::istringstream lines(error.substr(error.find('\n') + 1));  // after "exited at start:"
  int parsed = 0;
  bool saw_failure = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    google::protobuf::Value v;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &v).ok()) << line;
    ++parsed;
    const std::string& msg = v.struct_value().fields().at("msg").string_value();
    saw_failure |=
        msg.find("cannot read tokens file " + dir_ + "/no \"such\" dir") != std::string::npos;
  }
  EXPECT_GT(parsed, 0) << error;
  EXPECT_TRUE(saw_failure) << error;
  // spdlog reads an unknown level as "off": refused before it silences the
  // node, and said on stderr.
  EXPECT_EQ(NodeProcess::Start(dir_, {.settings = {"log_level=INFO"}}, &error), nullptr);
  EXPECT_NE(error.find("log_level must be"), std::string::npos) << error;
}

TEST_F(NodeTest, TlsControlPlane) {
  const std::string cert = dir_ + "/cert.pem", key = dir_ + "/key.pem";
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a test certificate";
  StartNode({.port = 0, .settings = {"tls_cert_file=" + cert, "tls_key_file=" + key}});
  ClientOptions tls;
  tls.token = kTokenA.token;
  tls.tls_root_certs_file = cert;
  auto store = OpenStore(node_->uri(), tls);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Prompt p = MakePrompt(**store, 2, 18);
  CommitAll(**store, p);
  auto m = MatchPrompt(**store, p);
  ASSERT_TRUE(m.ok());
  ExpectSameBytes(FetchAll(**store, *m), p, 2, true);
  // A plaintext client cannot talk to a TLS node.
  ClientOptions plain;
  plain.token = kTokenA.token;
  plain.timeout = Seconds(2);
  auto refused = OpenStore(node_->uri(), plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  // TLS clients that vanish mid-session (killed: no close_notify) leave the
  // others' connections alone: OpenSSL's error queue is per thread, and the
  // front door serves every connection from one.
  for (int i = 0; i < 3; ++i) {
    const std::string vanish =
        "(sleep 1) | timeout -s KILL 1 openssl s_client -connect 127.0.0.1:" +
        std::to_string(node_->grpc_port()) + " -alpn h2 >/dev/null 2>&1";
    (void)std::system(vanish.c_str());
    for (int call = 0; call < 5; ++call) {
      auto again = MatchPrompt(**store, p, false);
      ASSERT_TRUE(again.ok()) << "after vanished client " << i << ": " << again.status().ToString();
    }
  }
}

// A client that breaks the protocol (DATA on stream 0) and then holds its
// connection open keeps neither the node busy nor anyone else from being
// served.
TEST_F(NodeTest, AClientHoldingABrokenConnectionCostsNothing) {
  StartNode();
  const int fd = ConnectLoopback(node_->grpc_port(), /*recv_timeout_s=*/2);
  ASSERT_GE(fd, 0);
  std::string bad = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  bad += std::string("\0\0\0\4\0\0\0\0\0", 9);           // SETTINGS
  bad += std::string("\0\0\4\0\0\0\0\0\0", 9) + "oops";  // DATA, stream 0
  ASSERT_EQ(send(fd, bad.data(), bad.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bad.size()));
  EXPECT_FALSE(ReadAll(fd).empty());  // gRPC's answer came through (within 2 s)
  // The node is idle meanwhile: a second of its CPU time is mostly sleep.
  auto cpu_ticks = [&] {
    std::ifstream in("/proc/" + std::to_string(node_->pid()) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
      if (i == 14) utime = std::stoull(f);
      if (i == 15) stime = std::stoull(f);
    }
    return utime + stime;
  };
  const uint64_t before = cpu_ticks();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(cpu_ticks() - before, static_cast<uint64_t>(sysconf(_SC_CLK_TCK) / 2));
  RoundTrip(*node_, "am", 8);
  close(fd);
}

TEST_F(NodeTest, ManyConcurrentClients) {
  StartNode();  // two tenants: active messages only
  constexpr int kClients = 8;
  constexpr int kRounds = 4;
  auto seed_store = Open(*node_, kTokenA.token);
  const Prompt shared = MakePrompt(*seed_store, 2, 17);
  CommitAll(*seed_store, shared);
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  clients.reserve(kClients);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto store =
          Open(*node_, c % 2 == 0 ? kTokenA.token : kTokenB.token, c % 4 < 2 ? "am" : "auto");
      if (store == nullptr) {
        ++failures;
        return;
      }
      for (int r = 0; r < kRounds; ++r) {
        const Prompt own = MakePrompt(*store, 2, 1000 + c * 100 + r);
        auto payloads = Payloads(own, 0, 2, true);
        auto committed = store->Commit(TestModel(), payloads);
        if (!committed.ok() || committed->published != 3) ++failures;
        for (const Prompt* p : {&own, &shared}) {
          auto m = MatchPrompt(*store, *p);
          if (!m.ok()) {
            ++failures;
            continue;
          }
          const bool mine = p == &own || c % 2 == 0;  // B cannot see A's shared prompt
          if (m->blocks.size() != (mine ? 2u : 0u)) ++failures;
          const Fetched f = FetchAll(*store, *m);
          if (!f.outcome.status.ok()) ++failures;
          for (uint32_t b = 0; b < f.outcome.blocks_ready; ++b) {
            if (f.blocks[b] != p->blocks[b].bytes) ++failures;
          }
          if (m->lease != 0 && !store->Abort(m->lease).ok()) ++failures;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto stats = NodeStats(*node_);
  EXPECT_EQ(stats.read_leases(), 0u);
  EXPECT_EQ(stats.write_leases(), 0u);
  EXPECT_EQ(stats.global_kv_entries(), 2u + kClients * kRounds * 2u);
}

TEST_F(NodeTest, SsdTierSurvivesARestartAndPromotesUnderTheLease) {
  const std::string ssd = dir_ + "/ssd";
  const NodeProcess::Options options{
      .port = FreePort(), .settings = {"ssd_dir=" + ssd, "ssd_bytes=256MiB", "ssd_sync=false"}};
  StartNode(options);
  Prompt p;
  {
    auto store = Open(*node_, kTokenA.token);
    ASSERT_NE(store, nullptr);
    p = MakePrompt(*store, 3, 31);
    CommitAll(*store, p, /*with_swa=*/false);
  }
  // SIGTERM drains the write-back queue; DRAM is gone after the restart.
  ASSERT_EQ(node_->Terminate(), 0) << node_->Log();
  StartNode(options);
  EXPECT_EQ(NodeStats(*node_).global_kv_entries(), 0u);
  auto store = Open(*node_, kTokenA.token);
  ASSERT_NE(store, nullptr);
  // Without a lease the blocks are reported on the SSD tier; the fetch
  // takes its own lease, which promotes them.
  auto peek = MatchPrompt(*store, p, /*lease=*/false);
  ASSERT_TRUE(peek.ok()) << peek.status().ToString();
  ASSERT_EQ(peek->blocks.size(), 3u);
  for (const BlockMatch& b : peek->blocks) EXPECT_EQ(b.tier, Tier::kSsd);
  ExpectSameBytes(FetchAll(*store, *peek), p, 3, false);
  EXPECT_EQ(NodeStats(*node_).global_kv_entries(), 3u);  // promoted into DRAM
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 3u);
  for (const BlockMatch& b : m->blocks) EXPECT_EQ(b.tier, Tier::kDram);
  ExpectSameBytes(FetchAll(*store, *m), p, 3, false);
  EXPECT_TRUE(store->Abort(m->lease).ok());
  EXPECT_EQ(NodeStats(*node_).read_leases(), 0u);
  // Another tenant sees none of it, on either tier.
  auto other = Open(*node_, kTokenB.token);
  ASSERT_NE(other, nullptr);
  auto miss = MatchPrompt(*other, p, /*lease=*/false);
  ASSERT_TRUE(miss.ok());
  EXPECT_TRUE(miss->blocks.empty());
}

TEST_F(NodeTest, SsdLeasedMatchPromotesSsdOnlyBlocks) {
  // A leased match right after the restart promotes before answering, so
  // every block it reports is in DRAM with a readable location.
  const std::string ssd = dir_ + "/ssd";
  const NodeProcess::Options options{
      .port = FreePort(), .settings = {"ssd_dir=" + ssd, "ssd_bytes=256MiB", "ssd_sync=false"}};
  StartNode(options);
  Prompt p;
  {
    auto store = Open(*node_, kTokenA.token, "am");
    ASSERT_NE(store, nullptr);
    p = MakePrompt(*store, 2, 32);
    CommitAll(*store, p, /*with_swa=*/false);
  }
  ASSERT_EQ(node_->Terminate(), 0) << node_->Log();
  StartNode(options);
  auto store = Open(*node_, kTokenA.token, "am");
  ASSERT_NE(store, nullptr);
  auto m = MatchPrompt(*store, p);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->blocks.size(), 2u);
  for (const BlockMatch& b : m->blocks) EXPECT_EQ(b.tier, Tier::kDram);
  ExpectSameBytes(FetchAll(*store, *m), p, 2, false);
  EXPECT_TRUE(store->Abort(m->lease).ok());
}

TEST_F(NodeTest, AClientRefusesANodesInconsistentAnswersAndKeepsNothingOfThem) {
  StartNode();
  TamperingProxy proxy(node_->target());
  ASSERT_FALSE(proxy.target().empty());
  ClientOptions options;
  options.token = kTokenA.token;
  auto opened = OpenStore("strata://" + proxy.target(), options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const Prompt p = MakePrompt(store, 3, 61);
  CommitAll(store, p);

  // A match answer whose arrays disagree is refused, and the read lease
  // the node granted with it is released, not left pinning until its TTL.
  proxy.TamperMatch(
      [](v1::MatchResponse* r) { r->mutable_blocks()->mutable_locations()->RemoveLast(); });
  auto garbled = MatchPrompt(store, p);
  EXPECT_FALSE(garbled.ok());
  proxy.TamperMatch(nullptr);
  uint64_t leases = 1;
  for (int i = 0; i < 200 && leases != 0; ++i) {
    leases = NodeStats(*node_).read_leases();
    if (leases != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(leases, 0u);

  // A block answered RESERVED without a write lease has no reservation to
  // stage under: refused, never a buffer that is freed as it is handed out,
  // nor a commit reported done whose bytes were never sent.
  proxy.TamperReserve([](v1::ReserveResponse* r) { r->set_write_lease_id(0); });
  const Prompt q = MakePrompt(store, 2, 62);
  std::vector<CommitBlock> blocks;
  for (const CommitPayload& c : Payloads(q, 0, 2, false)) blocks.push_back(c.block);
  auto reserved = store.Reserve(TestModel(), blocks, 0);
  EXPECT_EQ(reserved.status().code(), StatusCode::kInternal) << reserved.status().ToString();
  // (Other blocks: q's are in flight under the reservation the node made.)
  const Prompt r = MakePrompt(store, 2, 63);
  auto committed = store.Commit(TestModel(), Payloads(r, 0, 2, false));
  EXPECT_EQ(committed.status().code(), StatusCode::kInternal) << committed.status().ToString();
}

// A node whose data plane speaks another message version (another Strata
// release) is refused at once with a clear error, not after a timeout of
// messages it drops; a node of this release announces this version.
TEST_F(NodeTest, AClientRefusesANodeWithAnotherDataPlaneVersionAtOnce) {
  StartNode();
  v1::HelloResponse hello;
  ASSERT_TRUE(RawCall(*node_, kTokenA.token, [&](auto channel, grpc::ClientContext* ctx) {
                return v1::CacheStore::NewStub(channel)->Hello(ctx, v1::HelloRequest(), &hello);
              }).ok());
  EXPECT_EQ(hello.data_plane_wire_version(), dataplane::kWireVersion);

  TamperingProxy proxy(node_->target());
  ASSERT_FALSE(proxy.target().empty());
  proxy.TamperHello(
      [](v1::HelloResponse* r) { r->set_data_plane_wire_version(dataplane::kWireVersion + 1); });
  ClientOptions options;
  options.token = kTokenA.token;
  options.timeout = Seconds(60);  // a refusal must not wait for it
  const auto started = std::chrono::steady_clock::now();
  auto opened = OpenStore("strata://" + proxy.target(), options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("data-plane wire version " +
                                           std::to_string(dataplane::kWireVersion + 1)),
            std::string::npos)
      << opened.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

TEST_F(NodeTest, AClientWhoseTokenMovesToAnotherNamespaceWritesNothingThere) {
  const int port = FreePort();
  StartNode({.port = port, .settings = {}});
  auto store = Open(*node_, kTokenA.token);
  ASSERT_NE(store, nullptr);
  CommitAll(*store, MakePrompt(*store, 2, 63));
  EXPECT_EQ(node_->Terminate(), 0) << node_->Log();
  // Restarted with the same token in tenant-b: the client's keys were
  // derived under tenant-a, so it refuses the new node's data plane on
  // every try, not only the first.
  StartNode({.port = port, .settings = {}}, {{kTokenA.token, "tenant-b", "write"}});
  const Prompt p = MakePrompt(*store, 2, 64);
  bool reconnected = false;  // the control channel finds the new node first
  for (int i = 0; i < 100 && !reconnected; ++i) {
    reconnected = MatchPrompt(*store, p, /*lease=*/false).ok();
    if (!reconnected) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(reconnected);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto committed = store->Commit(TestModel(), Payloads(p, 0, 2, false));
    EXPECT_EQ(committed.status().code(), StatusCode::kInternal)
        << attempt << ": " << committed.status().ToString();
  }
  EXPECT_EQ(NodeStats(*node_, kTokenA.token).global_kv_entries(), 0u);  // tenant-b's, now
}

TEST_F(NodeTest, ReleasedLeasesRideOnTheNextMatchOrFlushSoon) {
  StartNode();
  auto store = Open(*node_, kTokenA.token);
  ASSERT_NE(store, nullptr);
  const Prompt p = MakePrompt(*store, 2, 33);
  CommitAll(*store, p);
  // The node ends the leases a match names before its lookup.
  auto first = MatchPrompt(*store, p);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(NodeStats(*node_).read_leases(), 1u);
  const auto raw_match = [&](const v1::MatchRequest& m) {
    return RawCall(*node_, kTokenA.token,
                   [&](auto ch, grpc::ClientContext* ctx) {
                     v1::MatchResponse resp;
                     return v1::CacheStore::NewStub(ch)->Match(ctx, m, &resp);
                   })
        .code();
  };
  v1::MatchRequest req = wire::EncodeMatchRequest(MatchKeysRequest{
      .model_id = TestModel(), .root = p.keys[0], .keys = {}, .take_lease = false});
  req.add_release_leases(first->lease);
  req.add_release_leases(424242);  // unknown: ignored
  ASSERT_EQ(raw_match(req), StatusCode::kOk);
  EXPECT_EQ(NodeStats(*node_).read_leases(), 0u);
  // A malformed match ends nothing, not even the leases it names.
  auto held = MatchPrompt(*store, p);
  ASSERT_TRUE(held.ok());
  v1::MatchRequest garbled_keys = req;
  garbled_keys.set_keys("not a multiple of 16 bytes");
  v1::MatchRequest no_block_tokens = req;  // refused by the store's checks too
  no_block_tokens.set_block_tokens(0);
  for (v1::MatchRequest garbled : {garbled_keys, no_block_tokens}) {
    garbled.clear_release_leases();
    garbled.add_release_leases(held->lease);
    EXPECT_EQ(raw_match(garbled), StatusCode::kInvalidArgument);
    EXPECT_EQ(NodeStats(*node_).read_leases(), 1u);
  }
  ASSERT_TRUE(store->Abort(held->lease).ok());
  for (int i = 0; i <= 64; ++i) req.add_release_leases(i);
  EXPECT_EQ(raw_match(req), StatusCode::kInvalidArgument);

  // Through the client: Release returns at once, and the lease ends soon
  // after even when no match follows to carry it.
  auto second = MatchPrompt(*store, p);
  ASSERT_TRUE(second.ok());
  ExpectSameBytes(FetchAll(*store, *second), p, 2, true);
  store->Release(second->lease);
  uint64_t live = 1;
  for (int i = 0; i < 200 && live != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    live = NodeStats(*node_).read_leases();
  }
  EXPECT_EQ(live, 0u);
  // Released and then matched again at once: never more than the new lease.
  for (int i = 0; i < 20; ++i) {
    auto m = MatchPrompt(*store, p);
    ASSERT_TRUE(m.ok());
    store->Release(m->lease);
  }
  store.reset();  // the flusher sends what is left before the client goes
  EXPECT_EQ(NodeStats(*node_).read_leases(), 0u);
}

}  // namespace
}  // namespace strata::testing

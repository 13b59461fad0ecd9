#include "node/node.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "cluster/node_registration.h"
#include "dataplane/data_plane.h"
#include "node/grpc_front_door.h"
#include "node/node_service.h"
#include "strata/http_endpoint.h"
#include "util/file_util.h"

namespace strata {
namespace {

// gRPC's own limit on a request; the store's limits (keys per call) are far
// below it, so this only stops abuse before a message is even parsed.
constexpr int kMaxRequestBytes = 4 << 20;
// Threads the gRPC server may run calls on, and streams one connection may
// have open: far above what clients use, far below what exhausts the node.
constexpr int kMaxGrpcThreads = 512;
constexpr int kMaxStreamsPerConnection = 256;

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Prometheus text, one unlabelled family (HELP, TYPE, value) per Add.
struct PrometheusText {
  template <typename Value>
  void Add(const char* name, const char* type, const char* help, Value value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << ' ' << value << '\n';
  }
  std::ostringstream out;
};

// The data plane's active-message traffic in Prometheus text, rendered after
// the store's metrics on /metrics. RMA reads bypass the node: not counted.
std::string DataPlaneMetricsText(const dataplane::DataPlaneServer::Stats& d) {
  PrometheusText t;
  t.Add("strata_dataplane_bytes_sent_total", "counter", "Bytes of read replies completed.",
        d.bytes_sent);
  t.Add("strata_dataplane_bytes_received_total", "counter", "Bytes of writes landed.",
        d.bytes_received);
  t.Add("strata_dataplane_requests_total", "counter", "Active-message requests seen.", d.requests);
  t.Add("strata_dataplane_rejected_total", "counter", "Requests answered with an error.",
        d.rejected);
  t.Add("strata_dataplane_transfers_in_flight", "gauge",
        "Replies and writes UCX has not finished; each pins its entry.", d.in_flight);
  t.Add("strata_dataplane_oldest_transfer_seconds", "gauge",
        "Age of the oldest transfer in flight (a stalled peer shows here), 0 if none.",
        d.oldest_in_flight_seconds);
  t.Add("strata_dataplane_transfers_abandoned", "gauge",
        "Transfers given up after stalled_transfer_timeout that UCX has not finished (a "
        "stalled peer); each still pins its entry.",
        d.abandoned);
  t.Add("strata_dataplane_transfers_released_peer_exited_total", "counter",
        "Transfers let go (entries unpinned) because the client process on this host they went "
        "to exited mid-read.",
        d.released_peer_exited);
  return t.out.str();
}

// What the gRPC front door let through and turned away, after the store's
// metrics on /metrics: a flood shows here before anywhere else.
std::string FrontDoorMetricsText(const GrpcFrontDoor::Stats& f) {
  PrometheusText t;
  t.Add("strata_grpc_connections_open", "gauge", "Control-plane connections open.",
        f.connections_open);
  t.Add("strata_grpc_connections_accepted_total", "counter", "Control-plane connections taken.",
        f.connections_accepted);
  t.out << "# HELP strata_grpc_connections_closed_total Control-plane connections the node "
           "closed or refused, by reason.\n# TYPE strata_grpc_connections_closed_total counter\n";
  for (const auto& [reason, value] :
       {std::pair<const char*, uint64_t>{"max_connections", f.refused_full},
        {"reset_flood", f.closed_reset_flood},
        {"handshake", f.closed_handshake},
        {"idle", f.closed_idle}}) {
    t.out << "strata_grpc_connections_closed_total{reason=\"" << reason << "\"} " << value << '\n';
  }
  t.Add("strata_grpc_throttled_total", "counter",
        "Times a connection opening streams too fast was read more slowly.", f.throttled);
  t.Add("strata_grpc_streams_relayed_total", "counter", "New streams passed to the gRPC server.",
        f.streams_relayed);
  t.Add("strata_grpc_resets_relayed_total", "counter",
        "Stream resets from clients passed to the gRPC server.", f.resets_relayed);
  return t.out.str();
}

// Registers the node in etcd (cluster.etcd_endpoints set); the record
// follows the draining flag.
Result<std::unique_ptr<cluster::NodeRegistration>> StartRegistration(const NodeConfig& config,
                                                                     NodeState& state,
                                                                     int grpc_port) {
  cluster::NodeRegistrationOptions o;
  o.etcd_endpoints = {config.cluster.etcd_endpoints};
  o.cluster = config.cluster.name;
  o.lease_ttl =
      std::chrono::seconds(std::max<Nanos>(1, config.cluster.lease_ttl / kNanosPerSecond));
  o.record.info.node_id = state.node_id;
  o.record.info.address = config.cluster.advertise;
  if (o.record.info.address.empty()) {
    // The listen host with the bound port; a wildcard host means "this host".
    std::string host = config.listen.substr(0, config.listen.rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "[::]") host = HostName();
    o.record.info.address = host + ":" + std::to_string(grpc_port);
  }
  o.record.data_plane_host = HostName();
  o.record.capacity_bytes = config.dram_bytes;
  o.draining = [s = &state] { return s->draining.load(); };
  return cluster::NodeRegistration::Start(std::move(o));
}

// The gRPC server, listening only on a Unix socket that the front door
// relays each client connection to. Its threads and streams are bounded, so
// that what gets past the front door still cannot grow the node without
// limit.
std::unique_ptr<grpc::Server> BuildGrpcServer(NodeState& state, CacheStoreService& store,
                                              AdminService& admin, const std::string& socket_path) {
  grpc::ServerBuilder builder;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
  counters.push_back(std::make_unique<CallCounterFactory>(state));
  builder.experimental().SetInterceptorCreators(std::move(counters));
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(&store);
  builder.RegisterService(&admin);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  grpc::ResourceQuota quota("strata-node-grpc");
  quota.SetMaxThreads(kMaxGrpcThreads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  return builder.BuildAndStart();
}

// A directory only this user can enter, for the gRPC server's socket:
// nobody else can reach the server past the front door.
Result<std::string> MakePrivateDirectory() {
  std::error_code ec;
  std::string base = std::filesystem::temp_directory_path(ec).string();
  if (ec) base = "/tmp";
  std::string path = base + "/strata-node-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    return Unavailable("cannot make a private directory under " + base + ": " +
                       std::strerror(errno));
  }
  return path;
}

// Polls `done` until it holds or the deadline passes; returns its last answer.
template <typename Fn>
bool WaitUntil(Fn&& done, Nanos deadline) {
  while (!done()) {
    if (SteadyClock().Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The data plane's mode: RMA needs UCP_FEATURE_RMA, and with it UCX serves
// a peer's get or put at whatever address of the node's process the peer
// names (software RMA on tcp and shared memory; docs/security.md): whoever
// reaches the node's UCX worker could read and write all of its memory. So
// `auto` means active messages, and RMA is the operator's explicit choice,
// for one tenant on a host and network it trusts entirely.
Result<dataplane::Mode> ChooseDataPlaneMode(const NodeConfig& config, NodeState& st) {
  Result<dataplane::Mode> mode = dataplane::ParseMode(config.data_plane_mode);
  if (!mode.ok()) return mode.status();
  st.data_plane_mode = config.data_plane_mode;
  if (*mode == dataplane::Mode::kAuto) {
    *mode = dataplane::Mode::kActiveMessage;
    st.data_plane_mode = "am";
  }
  if (*mode == dataplane::Mode::kRma && st.tokens.tenant_namespaces() > 1) {
    return InvalidArgument(
        "data_plane_mode rma lets every client read the whole arena, and the tokens file names " +
        std::to_string(st.tokens.tenant_namespaces()) +
        " tenant namespaces: use am (or auto) for tenants that must not see each other "
        "(docs/security.md)");
  }
  if (*mode == dataplane::Mode::kRma) {
    spdlog::warn(
        "data plane: data_plane_mode rma: any process that reaches this node's UCX worker can "
        "read and write the node's memory, not only the arena (docs/security.md); use it only "
        "where every client host and process is trusted");
  }
  return mode;
}

// Transfers are checked against the leases the store granted.
dataplane::Access TransferAccess(NodeState* state) {
  dataplane::Access access;
  access.authorize_read = [state](uint64_t session, uint64_t lease, uint64_t offset,
                                  uint64_t length) {
    return state->AuthorizeTransfer(session, lease, offset, length, /*write=*/false);
  };
  access.authorize_write = [state](uint64_t session, uint64_t lease, uint64_t offset,
                                   uint64_t length) {
    return state->AuthorizeTransfer(session, lease, offset, length, /*write=*/true);
  };
  access.on_write_done = [](uint64_t, uint64_t, uint64_t, uint64_t) {};
  return access;
}

// The SSD tier's settings (ssd_dir set), or a warning that the other ssd_*
// settings go unused.
void SetSsdOptions(const NodeConfig& config, CacheStoreOptions& opts) {
  if (!config.ssd_dir.empty()) {
    SsdTierOptions ssd;
    ssd.dir = config.ssd_dir;
    ssd.index_dir = config.ssd_index_dir;
    ssd.capacity_bytes = config.ssd_bytes;
    ssd.data_files = config.ssd_data_files;
    ssd.sync = config.ssd_sync;
    ssd.ttl = config.global_kv_ttl;
    ssd.high_watermark = config.high_watermark;
    ssd.low_watermark = config.low_watermark;
    ssd.eviction_policy = config.ssd_eviction_policy;
    opts.ssd = std::move(ssd);
    opts.ssd_admission = config.ssd_admission == "hit_once"
                             ? CacheStoreOptions::SsdAdmission::kHitOnce
                             : CacheStoreOptions::SsdAdmission::kAllGlobalKv;
  }
  if (const NodeConfig defaults;
      config.ssd_dir.empty() &&
      (!config.ssd_index_dir.empty() || config.ssd_bytes != defaults.ssd_bytes ||
       config.ssd_data_files != defaults.ssd_data_files ||
       config.ssd_admission != defaults.ssd_admission ||
       config.ssd_eviction_policy != defaults.ssd_eviction_policy)) {
    // Settings for a tier that is off: say so, rather than ignore them.
    spdlog::warn("event=ssd_tier_off reason=\"ssd_dir is empty; other ssd_* settings ignored\"");
  }
}

// The store's options; `region`: the arena UCX allocated, if it did.
CacheStoreOptions StoreOptions(const NodeConfig& config, const TokenTable& tokens,
                               std::span<std::byte> region) {
  CacheStoreOptions opts;
  opts.dram.capacity_bytes = config.dram_bytes;
  opts.dram.external_region = region;
  opts.high_watermark = config.high_watermark;
  opts.low_watermark = config.low_watermark;
  opts.global_kv_ttl = config.global_kv_ttl;
  opts.swa_ttl = config.swa_ttl;
  opts.default_read_lease_ttl = config.read_lease_ttl;
  opts.default_write_lease_ttl = config.write_lease_ttl;
  opts.max_lease_life = config.max_lease_life;
  opts.max_leased_entries_per_namespace = config.max_leased_entries_per_namespace;
  opts.max_held_share_per_namespace = config.max_held_share_per_namespace.value_or(
      tokens.tenant_namespaces() > 1 ? kMultiTenantHeldShare : 1.0);
  if (!config.max_held_share_per_namespace.has_value() && tokens.tenant_namespaces() > 1) {
    spdlog::info(
        "leases: {} tenant namespaces: each may hold at most {:.0f}% of the DRAM tier in leases "
        "(max_held_share_per_namespace auto)",
        tokens.tenant_namespaces(), kMultiTenantHeldShare * 100);
  }
  const size_t tenants = std::max<size_t>(1, tokens.tenant_namespaces());
  opts.committed_share_per_namespace =
      config.committed_share_per_namespace.value_or(1.0 / static_cast<double>(tenants));
  if (!config.committed_share_per_namespace.has_value() && tenants > 1) {
    spdlog::info(
        "eviction: {} tenant namespaces: each is owed {:.0f}% of the DRAM tier; past it a tenant "
        "evicts its own entries first (committed_share_per_namespace auto)",
        tenants, opts.committed_share_per_namespace * 100);
  }
  opts.eviction_policy = config.eviction_policy;
  opts.extra_layouts = config.extra_layouts;
  SetSsdOptions(config, opts);
  return opts;
}

// The front door's TLS key pair, when the control plane speaks TLS.
Result<std::optional<FrontDoorTls>> LoadTls(const NodeConfig& config) {
  std::optional<FrontDoorTls> tls;
  if (!config.tls_cert_file.empty()) {
    Result<std::string> cert = ReadFileToString(config.tls_cert_file);
    if (!cert.ok()) return cert.status();
    Result<std::string> key = ReadFileToString(config.tls_key_file);
    if (!key.ok()) return key.status();
    tls = FrontDoorTls{std::move(cert).value(), std::move(key).value()};
  }
  return tls;
}

// How long a stopping node's gRPC server may take to write out replies its
// calls have finished.
constexpr Nanos kReplyFlush = 50 * kNanosPerMilli;

}  // namespace

struct Node::Impl {
  // Also the teardown of a Start that failed half way.
  ~Impl() {
    registration.reset();
    http.reset();
    front_door.reset();  // relays connections to the server: goes first
    server.reset();
    if (!private_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(private_dir, ec);
    }
    admin_service.reset();
    store_service.reset();
    // Whoever owns the arena goes last. The store ends every lease and
    // drains its SSD write-back, reading the arena; the data plane's
    // transfers read and write it until the data plane is gone. A
    // data-plane callback in flight keeps its own reference to the store
    // until it returns.
    if (data_plane_owns_region) {
      state.SetStore(nullptr);
      state.data_plane = nullptr;
      data_plane.reset();
    } else {
      state.data_plane = nullptr;
      data_plane.reset();
      state.SetStore(nullptr);
    }
  }

  // Start's steps, in order; a step that fails stops what the ones before
  // it started serving (the rest is ~Impl's).
  Status StartOwnRegionDataPlane(dataplane::Mode mode, const dataplane::Access& access,
                                 const dataplane::ServerOptions& dp_options);
  Status OpenStore(const dataplane::Access& access, const dataplane::ServerOptions& dp_options);
  Status StartControlPlane();
  Status StartHttp();
  Status Register();

  NodeConfig config;
  NodeState state;
  std::unique_ptr<dataplane::DataPlaneServer> data_plane;
  bool data_plane_owns_region = false;  // all modes but active messages only
  std::unique_ptr<CacheStoreService> store_service;
  std::unique_ptr<AdminService> admin_service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcFrontDoor> front_door;
  std::string private_dir;  // the gRPC server's socket; removed at the end
  int grpc_port = 0;
  std::unique_ptr<HttpEndpoint> http;
  std::unique_ptr<cluster::NodeRegistration> registration;  // with cluster.etcd_endpoints

  std::mutex mu;
  std::condition_variable cv;
  bool shutting_down = false;
  bool shut_down = false;
};

Node::Node(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Node>> Node::Start(NodeConfig config) {
  STRATA_RETURN_IF_ERROR(ValidateNodeConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  NodeState& st = impl->state;
  std::random_device rd;
  st.instance_id = (uint64_t{rd()} << 32) ^ rd();

  Result<TokenTable> tokens = TokenTable::Load(config.tokens_file);
  if (!tokens.ok()) return tokens.status();
  st.tokens = std::move(tokens).value();

  // Data plane first: unless only active messages are served, UCX allocates
  // the arena itself (a shared-memory segment when shm transports are on),
  // so clients on this host read it with real RMA; UCX 1.13 only emulates
  // RMA over shared memory for memory it did not allocate. Either way the
  // arena is registered once, here.
  Result<dataplane::Mode> mode = ChooseDataPlaneMode(config, st);
  if (!mode.ok()) return mode.status();
  st.rdma_devices = dataplane::DiscoverRdmaDevices();
  const dataplane::Access access = TransferAccess(&st);
  dataplane::ServerOptions dp_options;
  dp_options.mode = *mode;
  dp_options.listen_host = config.listen.substr(0, config.listen.rfind(':'));
  STRATA_RETURN_IF_ERROR(impl->StartOwnRegionDataPlane(*mode, access, dp_options));
  STRATA_RETURN_IF_ERROR(impl->OpenStore(access, dp_options));

  STRATA_RETURN_IF_ERROR(impl->StartControlPlane());
  STRATA_RETURN_IF_ERROR(impl->StartHttp());
  STRATA_RETURN_IF_ERROR(impl->Register());
  spdlog::info(
      "event=node_started node_id={} grpc_port={} http_port={} dram_bytes={} tokens={} "
      "data_plane_mode={} rdma_devices={} tls={}",
      st.node_id, impl->grpc_port, impl->http ? impl->http->port() : 0, config.dram_bytes,
      st.tokens.size(), st.data_plane_mode, st.rdma_devices.size(), !config.tls_cert_file.empty());
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

// Unless only active messages are served, UCX allocates the arena.
Status Node::Impl::StartOwnRegionDataPlane(dataplane::Mode mode, const dataplane::Access& access,
                                           const dataplane::ServerOptions& dp_options) {
  if (mode == dataplane::Mode::kActiveMessage) return Status::Ok();
  auto dp = dataplane::DataPlaneServer::StartWithOwnRegion(config.dram_bytes, access, dp_options);
  if (!dp.ok()) return Unavailable("data plane: " + dp.status().message());
  data_plane = std::move(dp).value();
  data_plane_owns_region = true;
  return Status::Ok();
}

// The store, in the arena UCX allocated if it did; then, for active
// messages only, the data plane over the store's own mapping.
Status Node::Impl::OpenStore(const dataplane::Access& access,
                             const dataplane::ServerOptions& dp_options) {
  const std::span<std::byte> region =
      data_plane != nullptr ? data_plane->region() : std::span<std::byte>();
  Result<std::unique_ptr<CacheStore>> store =
      CacheStore::Open(StoreOptions(config, state.tokens, region));
  if (!store.ok()) return store.status();
  state.SetStore(std::move(store).value());
  state.metrics = &state.store->metrics();
  if (data_plane == nullptr) {
    // Active messages only: the arena is the store's own mapping.
    auto dp = dataplane::DataPlaneServer::Start(state.store->ArenaRegion(), access, dp_options);
    if (!dp.ok()) return Unavailable("data plane: " + dp.status().message());
    data_plane = std::move(dp).value();
  }
  state.data_plane = data_plane.get();
  return Status::Ok();
}

// Control plane: gRPC behind the front door, which terminates TLS too.
Status Node::Impl::StartControlPlane() {
  Result<std::optional<FrontDoorTls>> tls = LoadTls(config);
  if (!tls.ok()) return tls.status();
  store_service = std::make_unique<CacheStoreService>(state);
  admin_service = std::make_unique<AdminService>(state);
  // The id is set before the server starts, so no call ever reads it half
  // written; with port 0 it needs the port picked, and nobody can call a
  // port that has not been reported yet.
  const std::string listen_port = config.listen.substr(config.listen.rfind(':') + 1);
  const bool fixed_port = !listen_port.empty() && listen_port != "0" &&
                          listen_port.find_first_not_of("0123456789") == std::string::npos;
  if (!config.node_id.empty()) {
    state.node_id = config.node_id;
  } else if (fixed_port) {
    state.node_id = HostName() + ":" + listen_port;
  }
  Result<std::string> dir = MakePrivateDirectory();
  if (!dir.ok()) return dir.status();
  private_dir = *dir;
  const std::string socket_path = private_dir + "/grpc.sock";
  server = BuildGrpcServer(state, *store_service, *admin_service, socket_path);
  if (server == nullptr) return Internal("the gRPC server did not start on " + socket_path);
  Result<std::unique_ptr<GrpcFrontDoor>> door =
      GrpcFrontDoor::Start(config.listen, socket_path, std::move(tls).value());
  if (!door.ok()) {
    return Status(door.status().code(), "cannot serve gRPC: " + door.status().message());
  }
  front_door = std::move(door).value();
  grpc_port = front_door->port();
  if (state.node_id.empty()) state.node_id = HostName() + ":" + std::to_string(grpc_port);
  return Status::Ok();
}

// /metrics and /healthz (http_listen set).
Status Node::Impl::StartHttp() {
  if (config.http_listen.empty()) return Status::Ok();
  NodeState* s = &state;
  Result<std::unique_ptr<HttpEndpoint>> endpoint = HttpEndpoint::Start(
      config.http_listen,
      [s, door = front_door.get()] {
        std::string text = s->metrics->RenderPrometheus();
        if (s->data_plane != nullptr) text += DataPlaneMetricsText(s->data_plane->stats());
        return text + FrontDoorMetricsText(door->stats());
      },
      [s] { return !s->draining.load(); });
  if (!endpoint.ok()) {
    front_door->Stop();
    server->Shutdown();
    return endpoint.status();
  }
  http = std::move(endpoint).value();
  return Status::Ok();
}

// The node's record in etcd (cluster.etcd_endpoints set).
Status Node::Impl::Register() {
  if (config.cluster.etcd_endpoints.empty()) return Status::Ok();
  Result<std::unique_ptr<cluster::NodeRegistration>> reg =
      StartRegistration(config, state, grpc_port);
  if (!reg.ok()) {
    if (http != nullptr) http->Stop();
    front_door->Stop();
    server->Shutdown();
    return reg.status();
  }
  registration = std::move(reg).value();
  return Status::Ok();
}

Node::~Node() { Shutdown(); }  // then ~Impl, in the order it needs

void Node::Shutdown() {
  Impl& n = *impl_;
  {
    std::unique_lock lock(n.mu);
    if (n.shutting_down) {
      n.cv.wait(lock, [&] { return n.shut_down; });
      return;
    }
    n.shutting_down = true;
  }
  const auto started = std::chrono::steady_clock::now();
  spdlog::info("event=node_stopping node_id={} grace_ms={}", n.state.node_id,
               n.config.shutdown_grace / kNanosPerMilli);
  n.state.draining.store(true);
  // Leave the cluster first: clients stop routing here while in-flight work
  // finishes, instead of finding out when the lease runs out.
  if (n.registration != nullptr) {
    if (Status st = n.registration->Deregister(); !st.ok()) {
      spdlog::warn("event=etcd_deregister_failed error=\"{}\"", st.ToString());
    }
  }
  // One deadline for every wait below: a stop takes at most shutdown_grace.
  const Nanos deadline = SteadyClock().Now() + n.config.shutdown_grace;
  // Writes already reserved get to finish: draining refuses new
  // reservations, but their transfers land and Publish, Abort and
  // RenewLease are still served, so a commit under way when SIGTERM came is
  // kept rather than lost. Reads go on meanwhile.
  // A Reserve past its draining check may still grant one: it is waited
  // for too (NodeState::reserves_admitting).
  CacheStore& store = *n.state.store;
  auto writes_done = [&] {
    return n.state.reserves_admitting.load() == 0 && store.Stats().write_leases == 0;
  };
  if (!writes_done()) {
    spdlog::info("event=node_waiting_for_writes write_leases={}", store.Stats().write_leases);
    if (!WaitUntil(writes_done, deadline)) {
      spdlog::warn("event=node_writes_unfinished write_leases={}", store.Stats().write_leases);
    }
  }
  // Then the data plane takes nothing new and lands what is in flight.
  if (n.data_plane != nullptr) {
    if (Status st = n.data_plane->Drain(deadline); !st.ok()) {
      spdlog::warn("event=data_plane_drain_incomplete error=\"{}\"", st.ToString());
    }
  }
  // Then calls in flight finish within what is left of the grace, replies
  // sent (a Publish that released the last write lease has yet to answer).
  // gRPC's own graceful shutdown would also wait for every client to close
  // its connection, seconds after its last call; so it gets a moment to
  // flush what its transports hold, then cancels whatever call came in
  // meanwhile.
  if (!WaitUntil([&] { return n.state.calls_in_flight.load() == 0; }, deadline)) {
    spdlog::warn("event=calls_cancelled in_flight={}", n.state.calls_in_flight.load());
  }
  // No new connections; those open carry gRPC's GOAWAY and last replies
  // out, for a moment, before they close.
  n.front_door->StopAccepting();
  const Nanos flush_for = std::clamp<Nanos>(deadline - SteadyClock().Now(), 0, kReplyFlush);
  n.server->Shutdown(std::chrono::system_clock::now() + std::chrono::nanoseconds(flush_for));
  n.front_door->Stop(SteadyClock().Now() + 500 * kNanosPerMilli);
  if (n.http != nullptr) n.http->Stop();
  const StoreStats stats = n.state.store->Stats();
  spdlog::info(
      "event=node_stopped node_id={} released_read_leases={} released_write_leases={} "
      "elapsed_ms={}",
      n.state.node_id, stats.read_leases, stats.write_leases,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                            started)
          .count());
  {
    std::lock_guard lock(n.mu);
    n.shut_down = true;
  }
  n.cv.notify_all();
}

void Node::Wait() {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->shut_down; });
}

const std::string& Node::node_id() const { return impl_->state.node_id; }
int Node::grpc_port() const { return impl_->grpc_port; }
int Node::http_port() const { return impl_->http ? impl_->http->port() : 0; }
CacheStore& Node::store() { return *impl_->state.store; }
void Node::SetAfterLeaseGrantHookForTesting(
    std::function<void(const std::function<bool()>& caller_left)> hook) {
  impl_->state.after_lease_grant = std::move(hook);
}
void Node::SetBeforeReserveHookForTesting(std::function<void()> hook) {
  impl_->state.before_reserve = std::move(hook);
}

}  // namespace strata

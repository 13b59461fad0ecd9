// strata-node: a CacheStore served over the wire (DESIGN §3, §7, §10).
// gRPC carries the control plane, UCX the bytes, HTTP /metrics and /healthz
// the observability. `strata-node` (cachestore/src/node/node_main.cc) is a
// thin command line around this class.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/cache_store.h"
#include "strata/clock.h"
#include "strata/status.h"

namespace strata {

// The default share of the DRAM tier one tenant's leases may hold on a
// node with several tenant namespaces.
inline constexpr double kMultiTenantHeldShare = 0.5;

struct NodeConfig {
  std::string node_id;                      // default: hostname:port
  std::string listen = "127.0.0.1:7070";    // gRPC control plane; port 0 picks one
  std::string http_listen = "127.0.0.1:0";  // /metrics and /healthz; empty disables
  uint64_t dram_bytes = 1ull << 30;
  double high_watermark = 0.95;
  double low_watermark = 0.85;
  Nanos global_kv_ttl = Hours(72);
  Nanos swa_ttl = Minutes(10);
  Nanos read_lease_ttl = Seconds(10);
  Nanos write_lease_ttl = Seconds(30);
  Nanos max_lease_life = Hours(1);  // CacheStoreOptions::max_lease_life
  // CacheStoreOptions::max_leased_entries_per_namespace.
  uint64_t max_leased_entries_per_namespace = uint64_t{1} << 20;
  // CacheStoreOptions::max_held_share_per_namespace; unset ("auto"): 1 with
  // one tenant namespace in the tokens file, kMultiTenantHeldShare with
  // more, so no tenant can leave the others no room to commit.
  std::optional<double> max_held_share_per_namespace;
  // CacheStoreOptions::committed_share_per_namespace; unset ("auto"): 1
  // (off) with one tenant namespace in the tokens file, 1/N with N, so a
  // tenant committing a lot evicts its own entries, not the others'.
  std::optional<double> committed_share_per_namespace;
  std::string eviction_policy = "lru";
  // Layouts besides the built-in V4.1 ones (a model with another shape, or
  // the trace replay's). YAML: a list of specs or one string; --set:
  // extra_layouts="<spec>;<spec>", replacing the list (layout.h:
  // ParseLayoutSpec).
  std::vector<Layout> extra_layouts;
  // SSD tier (DESIGN §4): off while ssd_dir is empty. Remote matches promote
  // SSD-only blocks into DRAM under the caller's lease, so clients only ever
  // read DRAM.
  std::string ssd_dir;
  std::string ssd_index_dir;  // default <ssd_dir>/index
  uint64_t ssd_bytes = 64ull << 30;
  uint32_t ssd_data_files = 1;
  bool ssd_sync = true;                     // fdatasync data before its index entry
  std::string ssd_admission = "all";        // all (every GLOBAL_KV commit) or hit_once
  std::string ssd_eviction_policy = "lru";  // lru or deadline
  // Bearer tokens: one "sha256:<hex of the token> <namespace> <role>" per
  // line (role: read, write or admin; namespace "*" is the operator, admin
  // calls only). Required: a node never serves unauthenticated callers.
  std::string tokens_file;
  std::string tls_cert_file;  // both set: the control plane speaks TLS only
  std::string tls_key_file;
  // auto, rma or am (see data_plane.h); auto is am when the tokens file
  // holds more than one tenant namespace (an RMA key reads the whole arena).
  std::string data_plane_mode = "auto";
  Nanos shutdown_grace = Seconds(10);  // in-flight work gets this long on SIGTERM
  std::string log_format = "text";     // text or json
  std::string log_level = "info";
  // Cluster membership (DESIGN §6): the node registers itself in etcd under
  // /strata/<name>/nodes/<node_id> with a lease. Off while etcd_endpoints is
  // empty (one machine, static membership). YAML: a `cluster:` mapping;
  // --set cluster.<key>=value.
  struct Cluster {
    std::string etcd_endpoints;  // "http://10.0.0.1:2379,http://10.0.0.2:2379"
    std::string name = "strata";
    std::string advertise;         // host:port clients dial; default: listen host, bound port
    Nanos lease_ttl = Seconds(5);  // a dead node leaves routing within this
  } cluster;
};

// Reads a YAML config (deploy/strata-node.yaml documents every key).
// Unknown keys are an error, so a typo never silently falls back to a default.
Result<NodeConfig> LoadNodeConfig(const std::string& path);
// Applies "key=value" overrides with the same names as the YAML keys.
Status ApplyNodeConfigOverride(NodeConfig* config, const std::string& assignment);
Status ValidateNodeConfig(const NodeConfig& config);

class Node {
 public:
  static Result<std::unique_ptr<Node>> Start(NodeConfig config);
  // Shuts down (if not done yet) and frees everything.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Graceful stop: refuse new calls, let in-flight RPCs and transfers finish
  // within the grace period, then end every lease and reservation. Safe to
  // call more than once and from any thread.
  void Shutdown();
  // Blocks until Shutdown() has finished.
  void Wait();

  const std::string& node_id() const;
  int grpc_port() const;
  int http_port() const;  // 0 when HTTP is off
  CacheStore& store();
  // Test hook: runs in the Match and Reserve handlers after the store
  // granted the call's lease, with a test of whether the caller has gone.
  // Set it before the calls it is meant for.
  void SetAfterLeaseGrantHookForTesting(
      std::function<void(const std::function<bool()>& caller_left)> hook);
  // Test hook: runs in the Reserve handler after its draining check, before
  // the store grants the reservation. Set it before the calls it is meant for.
  void SetBeforeReserveHookForTesting(std::function<void()> hook);

 private:
  struct Impl;
  explicit Node(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata

// Cluster membership (DESIGN §6): which nodes are live, and where to reach
// them. Placement and the cluster client read it; it is fed either by a
// static list (one machine, no etcd: the default) or by an etcd watch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

struct NodeInfo {
  std::string node_id;    // unique in the cluster; the placement hash input
  std::string address;    // gRPC control plane, "host:port"
  bool draining = false;  // takes no new writes; reads go on until it leaves

  bool operator==(const NodeInfo&) const = default;
};

// Cluster-wide settings, read from etcd (or given statically).
struct ClusterSettings {
  uint32_t replication_factor = 1;
  uint32_t block_tokens = 0;  // 0: not set cluster-wide

  bool operator==(const ClusterSettings&) const = default;
};

class Membership {
 public:
  using Listener = std::function<void(const std::vector<NodeInfo>&)>;

  virtual ~Membership() = default;
  // The current live nodes, sorted by node_id.
  virtual std::vector<NodeInfo> Nodes() const = 0;
  virtual ClusterSettings Settings() const = 0;
  // Called (from a membership thread) with the full new list after every
  // change, of the list or of the settings (a listener may call Settings());
  // returns a handle id for Unsubscribe. Never called after
  // Unsubscribe returns.
  virtual uint64_t Subscribe(Listener listener) = 0;
  virtual void Unsubscribe(uint64_t id) = 0;
};

// A fixed list: one machine, tests, or a deployment without etcd.
std::unique_ptr<Membership> MakeStaticMembership(std::vector<NodeInfo> nodes,
                                                 ClusterSettings settings = {});

// Membership from etcd (DESIGN §6): lists and watches
// /strata/<cluster>/nodes/ and reads /strata/<cluster>/settings/
// {replication_factor,block_tokens}. A node whose etcd lease expires leaves
// the list within its TTL. Survives etcd restarts (re-lists and re-watches).
// Implemented in src/cluster/etcd_membership.cc; usage notes in
// src/cluster/etcd_membership.h.
struct EtcdMembershipOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", ...; tried in order
  std::string cluster = "strata";      // the <cluster> in the key prefix
  uint32_t call_timeout_ms = 2000;     // deadline of every etcd call
};

// Fails (UNAVAILABLE) when no endpoint answers the first listing, so a
// caller learns at once that etcd is unreachable; later outages are ridden
// out (the last known list stays until etcd answers again).
Result<std::unique_ptr<Membership>> OpenEtcdMembership(const EtcdMembershipOptions& options);

// The nodes a cluster store URI names (client.h): strata+etcd://h:2379[,...]
// /<cluster> opens an etcd membership; strata://h1:p1[,h2:p2...] a static
// list.
Result<std::unique_ptr<Membership>> OpenMembershipFromUri(std::string_view uri);

}  // namespace strata

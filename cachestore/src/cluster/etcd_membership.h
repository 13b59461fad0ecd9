// Membership from etcd (DESIGN §6). Usage:
//
//   strata::EtcdMembershipOptions o;
//   o.endpoints = {"http://127.0.0.1:2379"};
//   o.cluster = "prod";
//   auto m = strata::OpenEtcdMembership(o);   // UNAVAILABLE if etcd is down
//   (*m)->Nodes();       // live nodes, sorted by node_id
//   (*m)->Settings();    // replication factor, block tokens
//   (*m)->Subscribe([](const std::vector<strata::NodeInfo>& nodes) { ... });
//
// What etcd holds, under /strata/<cluster>/:
//   nodes/<node_id>              a NodeRecord as protobuf JSON
//                                (proto/strata/v1/cluster.proto), attached
//                                to the node's lease: it disappears when the
//                                node stops keeping the lease alive
//   settings/replication_factor  decimal, >= 1 (default 1)
//   settings/block_tokens        decimal, > 0 (unset: 0, not set cluster-wide)
// Settings are plain keys without a lease; the operator writes them with
// `etcdctl put` (deploy/README.md). A value that does not parse is ignored
// (logged), keeping the default, never taking the cluster down.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/membership.h"
#include "strata/status.h"

namespace strata::cluster {

// One node's registration value.
struct NodeRecord {
  NodeInfo info;
  std::string data_plane_host;  // where its UCX data plane runs
  uint64_t capacity_bytes = 0;  // DRAM tier
};

// A cluster name or node id is one etcd key segment: non-empty, no '/',
// printable ASCII, at most 200 bytes.
Status ValidateKeySegment(std::string_view what, std::string_view segment);

std::string ClusterPrefix(std::string_view cluster);  // "/strata/<cluster>/"
std::string NodesPrefix(std::string_view cluster);    // ".../nodes/"
std::string NodeKey(std::string_view cluster, std::string_view node_id);
std::string SettingKey(std::string_view cluster, std::string_view name);
inline constexpr std::string_view kReplicationFactorSetting = "replication_factor";
inline constexpr std::string_view kBlockTokensSetting = "block_tokens";

std::string EncodeNodeRecord(const NodeRecord& record);
// INVALID_ARGUMENT for bytes that are not a NodeRecord.
Result<NodeRecord> DecodeNodeRecord(std::string_view json);

}  // namespace strata::cluster

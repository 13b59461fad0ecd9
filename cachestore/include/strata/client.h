// Opening a Store by URI (DESIGN §3): the one entry point for workers and
// tools, so the same code runs against an in-process store or a node.
//
//   inproc://            a private in-process CacheStore (or the one in
//                        ClientOptions::inproc_store, shared with its owner)
//   strata://host:port   a strata-node: gRPC control plane at host:port,
//                        bulk bytes over UCX
//   strata://h1:p1,h2:p2,...
//                        a static cluster of nodes (DESIGN §6): blocks
//                        placed by rendezvous hashing over the nodes, each
//                        written to `replication_factor` of them
//   strata+etcd://h1:2379[,h2:2379]/<cluster>
//                        a cluster whose live nodes etcd lists (DESIGN §6);
//                        placed and replicated as above, R from etcd (and
//                        followed when it changes there) unless
//                        `replication_factor` is set
#pragma once

#include <memory>
#include <string_view>

#include "strata/client_options.h"
#include "strata/store.h"

namespace strata {

Result<std::unique_ptr<Store>> OpenStore(std::string_view uri, const ClientOptions& options = {});

}  // namespace strata

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
#include <string>
#include <string_view>

#include "strata/cache_store.h"
#include "strata/store.h"

namespace strata {

struct ClientOptions {
  // strata://: the bearer token (the node maps it to a namespace and role);
  // empty: the STRATA_TOKEN environment variable.
  std::string token;
  // strata://: PEM root certificates; set, the control plane uses TLS.
  std::string tls_root_certs_file;
  // strata://: deadline of every call (control plane and data plane).
  // OpenStore waits this long for the node to answer (one still starting,
  // or busy); a node that is down fails it with UNAVAILABLE.
  Nanos timeout = Seconds(10);
  // strata://: data-plane mode, "auto", "rma" or "am" (active messages).
  std::string data_plane_mode = "auto";
  // A cluster: how many nodes each block is written to (capped at the
  // number of nodes); 0 takes the cluster's setting (1 for a static list).
  uint32_t replication_factor = 0;
  // Threads that share one large verified copy out of a node's mapped arena
  // (shared memory), the caller included; 0 = min(2, hardware threads).
  uint32_t copy_threads = 0;

  // inproc://: attach to this store; when null a private store with
  // `inproc_dram_bytes` of DRAM is created and owned by the Store.
  std::shared_ptr<CacheStore> inproc_store;
  uint64_t inproc_dram_bytes = 1ull << 30;
  Principal inproc_caller{"default", Role::kWrite};
};

Result<std::unique_ptr<Store>> OpenStore(std::string_view uri, const ClientOptions& options = {});

}  // namespace strata

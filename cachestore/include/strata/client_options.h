// What a store client is opened with (strata/client.h's OpenStore): the
// token, deadlines, data-plane mode and, for inproc://, the store to attach.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "strata/clock.h"
#include "strata/store_types.h"

namespace strata {

class CacheStore;

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

}  // namespace strata

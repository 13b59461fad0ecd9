// strata://host:port: the Store interface over a node (DESIGN §3, §7).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/client_options.h"
#include "strata/store.h"

namespace strata {

Result<std::unique_ptr<Store>> OpenRemoteStore(const std::string& target,
                                               const ClientOptions& options);

// A RemoteStore with what the cluster client needs beyond Store: the
// namespace the node maps our token to (it feeds key[0], so the cluster
// derives chain keys once for all nodes).
class NodeClient : public Store {
 public:
  virtual const std::string& caller_namespace() const = 0;

  // Reserve without client-side staging (every ReservedBlock::buffer is
  // empty): the caller keeps the bytes and hands them to PublishFrom. The
  // cluster store stages once for all replicas; a staging buffer here would
  // only be copied into, and could be reclaimed under it (store.h).
  virtual Result<Reservation> ReserveUnstaged(const ModelId& model,
                                              std::span<const CommitBlock> blocks,
                                              Nanos write_lease_ttl) = 0;
  // Publish with each reserved block's bytes from payloads[i] (i: the block's
  // position in the reservation; exactly its payload_bytes). Works for a
  // staged reservation too, ignoring its buffers.
  virtual Result<PublishResult> PublishFrom(LeaseId write_lease,
                                            std::span<const std::span<const std::byte>> payloads,
                                            std::span<const uint64_t> checksums) = 0;
};

// A client-side match: checks the prompt, derives its chain keys for
// namespace `ns` (into *keys, which the returned request points at), and
// copies the match options. What RemoteStore and the cluster store send.
Result<MatchKeysRequest> DeriveMatchKeys(const std::string& ns, const MatchRequest& req,
                                         std::vector<ChainKey>* keys);

// Connects to the node at `target` (Hello, then the data plane).
// `wait_for_node`: the Hello waits through failed connection attempts until
// options.timeout (what OpenStore does: a node still starting, or too busy
// to shake hands within one 2 s attempt, is not down); otherwise the first
// failed attempt fails the connect (the cluster client, which skips a node
// that does not answer and probes it again later).
Result<std::unique_ptr<NodeClient>> ConnectNode(const std::string& target,
                                                const ClientOptions& options,
                                                bool wait_for_node = false);

}  // namespace strata

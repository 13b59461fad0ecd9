// strata://host:port: the Store interface over a node (DESIGN §3, §7).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/client.h"

namespace strata {

Result<std::unique_ptr<Store>> OpenRemoteStore(const std::string& target,
                                               const ClientOptions& options);

// A RemoteStore with what the cluster client needs beyond Store: the
// namespace the node maps our token to (it feeds key[0], so the cluster
// derives chain keys once for all nodes).
class NodeClient : public Store {
 public:
  virtual const std::string& caller_namespace() const = 0;
};

// A client-side match: checks the prompt, derives its chain keys for
// namespace `ns` (into *keys, which the returned request points at), and
// copies the match options. What RemoteStore and the cluster store send.
Result<MatchKeysRequest> DeriveMatchKeys(const std::string& ns, const MatchRequest& req,
                                         std::vector<ChainKey>* keys);

Result<std::unique_ptr<NodeClient>> ConnectNode(const std::string& target,
                                                const ClientOptions& options);

}  // namespace strata

// Parsing a node list and opening a cluster store.
#include "cluster/cluster_store_impl.h"

namespace strata {

Result<std::vector<NodeInfo>> ParseNodeList(std::string_view list) {
  std::vector<NodeInfo> nodes;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string address(list.substr(start, comma - start));
    const size_t colon = address.rfind(':');
    if (address.empty() || colon == std::string::npos || colon == 0 ||
        colon + 1 == address.size() || address.find('/') != std::string::npos ||
        address.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return InvalidArgument("expected host:port in node list '" + std::string(list) + "', got '" +
                             address + "'");
    }
    for (const NodeInfo& n : nodes) {
      if (n.address == address) return InvalidArgument("node " + address + " is listed twice");
    }
    nodes.push_back({address, address, false});
    start = comma + 1;
  }
  return nodes;
}

Result<std::unique_ptr<Store>> OpenClusterStore(std::shared_ptr<Membership> membership,
                                                const ClientOptions& options) {
  if (membership == nullptr) return InvalidArgument("no membership");
  if (options.timeout <= 0) return InvalidArgument("timeout must be positive");
  if (options.replication_factor > kMaxReplication) {
    return InvalidArgument("replication factor above " + std::to_string(kMaxReplication));
  }
  auto store =
      std::make_unique<ClusterStore>(std::move(membership), options, options.replication_factor,
                                     std::max<Nanos>(options.timeout / 3, 1));
  STRATA_RETURN_IF_ERROR(store->Connect());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace strata

#include <string>

#include "cluster/cluster_store.h"
#include "remote/remote_store.h"
#include "strata/client.h"

#include "strata/cache_store.h"

namespace strata {

Result<std::unique_ptr<Membership>> OpenMembershipFromUri(std::string_view uri) {
  constexpr std::string_view kEtcd = "strata+etcd://";
  constexpr std::string_view kStrata = "strata://";
  if (uri.starts_with(kStrata)) {
    Result<std::vector<NodeInfo>> nodes = ParseNodeList(uri.substr(kStrata.size()));
    if (!nodes.ok()) return nodes.status();
    return MakeStaticMembership(std::move(nodes).value());
  }
  if (!uri.starts_with(kEtcd)) {
    return InvalidArgument(
        "expected strata://h1:p1[,h2:p2...] or strata+etcd://host:port/<cluster>, got '" +
        std::string(uri) + "'");
  }
  // strata+etcd://h1:2379[,h2:2379]/<cluster>: nodes as etcd lists them.
  const std::string_view rest = uri.substr(kEtcd.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) {
    return InvalidArgument("expected strata+etcd://host:port[,host:port]/<cluster>, got '" +
                           std::string(uri) + "'");
  }
  Result<std::vector<NodeInfo>> endpoints = ParseNodeList(rest.substr(0, slash));
  if (!endpoints.ok()) return endpoints.status();
  EtcdMembershipOptions etcd;
  for (const NodeInfo& e : *endpoints) etcd.endpoints.push_back("http://" + e.address);
  etcd.cluster = std::string(rest.substr(slash + 1));
  return OpenEtcdMembership(etcd);
}

Result<std::unique_ptr<Store>> OpenStore(std::string_view uri, const ClientOptions& options) {
  constexpr std::string_view kInproc = "inproc://";
  if (uri.starts_with(kInproc)) {
    if (uri.size() != kInproc.size()) {
      return InvalidArgument("inproc:// takes no address, got '" + std::string(uri) + "'");
    }
    std::shared_ptr<CacheStore> store = options.inproc_store;
    if (!store) {
      CacheStoreOptions store_options;
      store_options.dram.capacity_bytes = options.inproc_dram_bytes;
      auto opened = CacheStore::Open(std::move(store_options));
      if (!opened.ok()) return opened.status();
      store = std::move(opened).value();
    }
    return OpenInProcessStore(std::move(store), options.inproc_caller);
  }
  if (uri.starts_with("strata+etcd://")) {
    Result<std::unique_ptr<Membership>> membership = OpenMembershipFromUri(uri);
    if (!membership.ok()) return membership.status();
    return OpenClusterStore(std::move(membership).value(), options);
  }
  constexpr std::string_view kStrata = "strata://";
  if (uri.starts_with(kStrata)) {
    const std::string target(uri.substr(kStrata.size()));
    if (target.find(',') != std::string::npos) {
      // A static cluster: one node list, nothing to watch.
      Result<std::unique_ptr<Membership>> membership = OpenMembershipFromUri(uri);
      if (!membership.ok()) return membership.status();
      return OpenClusterStore(std::move(membership).value(), options);
    }
    if (target.empty() || target.find('/') != std::string::npos ||
        target.find(':') == std::string::npos) {
      return InvalidArgument("expected strata://host:port, got '" + std::string(uri) + "'");
    }
    return OpenRemoteStore(target, options);
  }
  return InvalidArgument("unknown store URI '" + std::string(uri) +
                         "': expected inproc://, strata://host:port, strata://h1:p1,h2:p2,... or "
                         "strata+etcd://host:port/<cluster>");
}

}  // namespace strata

#include <string>

#include "remote_store.h"
#include "strata/client.h"

namespace strata {

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
  constexpr std::string_view kStrata = "strata://";
  if (uri.starts_with(kStrata)) {
    const std::string target(uri.substr(kStrata.size()));
    if (target.empty() || target.find('/') != std::string::npos ||
        target.find(':') == std::string::npos) {
      return InvalidArgument("expected strata://host:port, got '" + std::string(uri) + "'");
    }
    return OpenRemoteStore(target, options);
  }
  return InvalidArgument("unknown store URI '" + std::string(uri) +
                         "': expected inproc:// or strata://host:port");
}

}  // namespace strata

// RDMA device discovery (DESIGN §7): libibverbs lists the devices; the data
// path over them is UCX's business.
#include <infiniband/verbs.h>

#include "dataplane/data_plane.h"

namespace strata::dataplane {

std::vector<std::string> DiscoverRdmaDevices() {
  std::vector<std::string> names;
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) return names;  // no verbs provider / no devices
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(devices[i]);
    if (name != nullptr) names.emplace_back(name);
  }
  ibv_free_device_list(devices);
  return names;
}

}  // namespace strata::dataplane

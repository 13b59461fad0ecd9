// Which UCX network devices a node's data plane may use, given the host its
// control plane listens on: a node told to listen on 127.0.0.1 must not
// open a UCX tcp socket on every interface.
#pragma once

#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::dataplane::internal {

// UCX_NET_DEVICES for a node listening on `host` (an address or a name, as
// in `listen`, with or without [] around an IPv6 address):
//  - a wildcard ("", "0.0.0.0", "::") or an explicit UCX_NET_DEVICES in the
//    environment (the operator's choice) -> {} (UCX's own setting);
//  - otherwise the interfaces that carry one of the host's addresses, plus
//    every port of every RDMA device (verbs transports open no socket; they
//    are reached through the address exchanged over the control plane).
// INVALID_ARGUMENT when the host does not resolve or no interface has it.
Result<std::vector<std::string>> NetDevicesForListenHost(std::string host);

}  // namespace strata::dataplane::internal

// strata://host:port: the Store interface over a node (DESIGN §3, §7).
#pragma once

#include <memory>
#include <string>

#include "strata/client.h"

namespace strata {

Result<std::unique_ptr<Store>> OpenRemoteStore(const std::string& target,
                                               const ClientOptions& options);

}  // namespace strata

// Carrying a strata::Status across gRPC. The gRPC code is the nearest
// standard one (so generic tools read it right); the exact StatusCode rides
// in error_details, so LEASE_EXPIRED or CHECKSUM_MISMATCH survive the trip.
#pragma once

#include <grpcpp/support/status.h>

#include "strata/status.h"

namespace strata {

grpc::Status ToGrpc(const Status& status);
Status FromGrpc(const grpc::Status& status);

}  // namespace strata

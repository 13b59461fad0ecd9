#include "rpc/grpc_status.h"

#include <string>

namespace strata {
namespace {

grpc::StatusCode GrpcCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kLeaseExpired:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kChecksumMismatch:
      return grpc::StatusCode::DATA_LOSS;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::UNKNOWN;
}

// For statuses made by gRPC itself (no details): transport failures.
StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::DATA_LOSS:
      return StatusCode::kChecksumMismatch;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kResourceExhausted;
    case grpc::StatusCode::PERMISSION_DENIED:
      return StatusCode::kPermissionDenied;
    case grpc::StatusCode::UNAUTHENTICATED:
      return StatusCode::kUnauthenticated;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::ALREADY_EXISTS:
      return StatusCode::kAlreadyExists;
    default:
      return StatusCode::kInternal;
  }
}

}  // namespace

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return {GrpcCode(status.code()), status.message(),
          std::to_string(static_cast<int>(status.code()))};
}

Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return Status::Ok();
  const std::string& details = status.error_details();
  int code = -1;
  if (!details.empty() && details.size() <= 2 &&
      details.find_first_not_of("0123456789") == std::string::npos) {
    code = std::stoi(details);
  }
  if (code > 0 && code <= static_cast<int>(StatusCode::kInternal)) {
    return {static_cast<StatusCode>(code), status.error_message()};
  }
  return {FromGrpcCode(status.error_code()), status.error_message()};
}

}  // namespace strata

#include "strata/status.h"

#include "strata/clock.h"

namespace strata {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kLeaseExpired:
      return "LEASE_EXPIRED";
    case StatusCode::kChecksumMismatch:
      return "CHECKSUM_MISMATCH";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  std::string s(StatusCodeName(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

SteadyClock* SteadyClock::Default() {
  static SteadyClock clock;
  return &clock;
}

}  // namespace strata

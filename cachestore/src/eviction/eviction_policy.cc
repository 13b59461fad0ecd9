#include "eviction/eviction_policy.h"

namespace strata {

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           uint64_t capacity_bytes) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "aslru") return MakeAdaptiveSlruPolicy(capacity_bytes);
  if (name == "deadline") return MakeReuseDeadlinePolicy(capacity_bytes);
  return InvalidArgument("unknown eviction policy '" + std::string(name) +
                         "' (known: lru, aslru, deadline)");
}

}  // namespace strata

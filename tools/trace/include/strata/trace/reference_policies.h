// Reference lines for trace replay, computed straight from the trace (no
// store): prefix-safe LRU, and the offline optimum (Belady's MIN on block
// ids). Both follow the trace README: a request's hit is the leading run of
// its hash_ids present in the cache, every block of the request is inserted
// after its lookup, and LRU touches a request's blocks root-last.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/trace/trace.h"

namespace strata::trace {

struct HitStats {
  uint64_t hit_tokens = 0;
  uint64_t input_tokens = 0;
  double ratio() const {
    return input_tokens == 0 ? 0
                             : static_cast<double>(hit_tokens) / static_cast<double>(input_tokens);
  }
};

HitStats SimulateLru(const std::vector<TraceRequest>& requests, uint64_t capacity_blocks);
HitStats SimulateBelady(const std::vector<TraceRequest>& requests, uint64_t capacity_blocks);

}  // namespace strata::trace

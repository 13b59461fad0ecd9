// Request traces in the Mooncake format (one JSON object per line):
//   {"timestamp": 0, "input_length": 6758, "output_length": 500,
//    "hash_ids": [0, 1, 2, ...]}
// Each hash id names one 512-token block of the prompt; equal ids at the
// same position mean a shared prefix, and an id determines its whole prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::trace {

constexpr uint32_t kTraceBlockTokens = 512;

struct TraceRequest {
  int64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

// Parses one line; INVALID_ARGUMENT names what is wrong. hash_ids must hold
// one id per block of input_length (ceil(input_length / 512)), at most
// kMaxBlocksPerCall; each known field appears once.
Status ParseTraceLine(std::string_view line, TraceRequest* out);
std::string FormatTraceLine(const TraceRequest& request);

// Reads a whole file; errors name the line. Blank lines are skipped.
Result<std::vector<TraceRequest>> ReadTrace(const std::string& path);
Status WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests);

// Tokens of `request` covered by its first `blocks` blocks: every block is
// 512 tokens except the last, which counts up to input_length.
uint64_t PrefixTokens(const TraceRequest& request, size_t blocks);
uint64_t InputTokens(const std::vector<TraceRequest>& requests);

}  // namespace strata::trace

// Workload files for strata-worker, and the runner that feeds them to an
// engine.
//
// Format (text, one item per line; '#' starts a comment line):
//   strata-workload 1                       first line, the format version
//   prompt <TAB> <max_new> <TAB> <text>     an independent prompt
//   turn <TAB> <conv> <TAB> <max_new> <TAB> <text>
//       the next turn of conversation <conv>: its prompt is the whole
//       conversation so far (earlier turns and the model's replies) + text
// <text> escapes: \n newline, \t tab, \\ backslash. Turns of a conversation
// run in order (each needs the previous reply); different conversations and
// prompts run concurrently, batched by the engine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"
#include "strata/worker/engine.h"

namespace strata::worker {

struct WorkloadItem {
  std::string conversation;  // empty: an independent prompt
  uint32_t max_new_tokens = 16;
  std::string text;
};

Result<std::vector<WorkloadItem>> ParseWorkload(std::string_view text);
Result<std::vector<WorkloadItem>> ReadWorkloadFile(const std::string& path);
std::string FormatWorkload(const std::vector<WorkloadItem>& items);

struct SampleWorkloadOptions {
  uint32_t conversations = 3;
  uint32_t turns = 3;
  uint32_t system_bytes = 1200;  // shared by every conversation
  uint32_t turn_bytes = 400;
  uint32_t max_new_tokens = 24;
  uint64_t seed = 7;
};
// Deterministic multi-turn sample: a shared system prompt, then turns of
// pseudo-English text.
std::vector<WorkloadItem> MakeSampleWorkload(const SampleWorkloadOptions& options);

struct WorkloadResult {
  size_t item = 0;  // index in the workload
  std::string conversation;
  uint32_t turn = 0;  // 1-based within its conversation; 0 for prompts
  std::vector<uint32_t> output;
  RequestStats stats;
};

// Every prompt the workload will send fits: a turn's prompt is its
// conversation so far (texts and the max_new_tokens replies before it, as
// the model always generates that many), at most kMaxPromptTokens, never
// empty. Checked before anything runs, so a long workload does not fail
// halfway and lose what it measured.
Status CheckWorkload(const std::vector<WorkloadItem>& items);

// Runs every item through the engine (after CheckWorkload); results in
// workload order.
Result<std::vector<WorkloadResult>> RunWorkload(Engine& engine,
                                                const std::vector<WorkloadItem>& items);

// The same through a serving worker's HTTP API (`strata-worker serve` at
// host:port): conversations side by side, turns in order, each turn's
// session_id its conversation. The stats come from each answer's usage
// (ttft_s: the worker's own measure).
Result<std::vector<WorkloadResult>> RunWorkloadOverHttp(const std::string& host, int port,
                                                        const std::vector<WorkloadItem>& items);

}  // namespace strata::worker

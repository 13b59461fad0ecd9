// The subcommands of strata-admin and what they share. Each Add*Commands
// registers its subcommands on the app; the one parsed sets `*run`, which
// main calls with the connected Context.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "admin_client.h"
#include "json.h"
#include "strata/chain_key.h"
#include "strata/membership.h"
#include "strata/store_types.h"
#include "strata/v1/cache.pb.h"

namespace strata::admin {

struct Context {
  std::unique_ptr<Membership> membership;
  std::vector<NodeInfo> nodes;                       // membership.Nodes() at start
  std::vector<std::unique_ptr<NodeClient>> clients;  // one per node, same order
  bool json = false;

  // Prints the failure (stderr; with --json also an object on stdout) and
  // returns its exit code.
  int Fail(const Status& status) const;
  // The client of the node named by id or address; NOT_FOUND otherwise.
  Result<NodeClient*> FindNode(const std::string& node_ref);
  bool many() const { return clients.size() > 1; }
};

// {"error":{"code","exit_code","message"}} on stdout, as --json promises.
void PrintJsonError(const std::string& code, ExitCode exit_code, const std::string& message);

// A node a command over several nodes could not act on; the others go on.
struct NodeFailure {
  size_t node;  // index into Context::clients
  Status status;
};
// Says each failure on stderr and, with --json, as an "errors" array in
// *out; returns the exit code: 0 if none failed, else the first one's.
int ReportNodeFailures(const Context& ctx, const std::vector<NodeFailure>& failed, Json* out);

using Runner = std::function<int(Context&)>;

void AddNodeCommands(CLI::App& app, Runner* run);   // nodes, stats, top, drain
void AddEntryCommands(CLI::App& app, Runner* run);  // ls, inspect, pin, unpin, evict
void AddPrefixCommand(CLI::App& app, Runner* run);  // prefix

// ---- shared helpers -----------------------------------------------------------

// Refuses nan and inf; CLI::Range lets nan through (it compares false).
CLI::Validator Finite();

// "global" / "swa" (also GLOBAL_KV / SWA_STATE).
Result<v1::StateKind> ParseKind(const std::string& text);
std::string KindName(v1::StateKind kind);
std::string TierName(v1::Tier tier);
// 32 hex digits, as ls prints keys.
Result<std::string> ParseKeyHex(const std::string& hex);
std::string Hex(const std::string& bytes);
std::string Hex64(uint64_t v);
// "90", "90s", "15m", "2h", "3d" -> seconds.
Result<uint64_t> ParseDuration(const std::string& text);
// Every field of an entry.
Json EntryJson(const v1::EntryInfo& e);

}  // namespace strata::admin

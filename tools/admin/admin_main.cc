// strata-admin: the operator's CLI for strata-node (DESIGN §1, §11).
// Tables by default, --json on every subcommand; the exit codes are in
// --help and tools/README.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include "admin_client.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace strata::admin;
  CLI::App app{"strata-admin: inspect, pin, evict and drain Strata cache nodes"};
  app.footer(
      std::string("\nCredentials: --token, --token-file or STRATA_TOKEN.\n"
                  "Target: --store or STRATA_STORE (strata://host:port[,host:port...]).\n\n") +
      kExitCodeHelp);
  // Options of the app are accepted after the subcommand too.
  app.fallthrough();
  app.require_subcommand(1);

  std::string store = "strata://127.0.0.1:7070";
  std::string token, token_file, tls_ca;
  double timeout_s = 5;
  bool json = false;
  app.add_option("--store", store, "Node(s): strata://host:port, comma-separated for several")
      ->envname("STRATA_STORE");
  app.add_option("--token", token, "Bearer token (default: STRATA_TOKEN)");
  app.add_option("--token-file", token_file, "File whose first line is the bearer token");
  app.add_option("--timeout", timeout_s, "Deadline of every call, seconds")
      ->check(Finite())
      ->check(CLI::Range(0.001, 3600.0));
  app.add_option("--tls-ca", tls_ca, "PEM root certificates: talk TLS to the nodes");
  app.add_flag("--json", json, "JSON instead of tables");

  Runner run;
  AddNodeCommands(app, &run);
  AddEntryCommands(app, &run);
  AddPrefixCommand(app, &run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);
    // A script asking for --json reads stdout: the refusal goes there too.
    // The flag may stand after the word the parse stopped at.
    const bool wants_json = json || std::any_of(argv + 1, argv + argc, [](const char* a) {
                              return std::string_view(a) == "--json";
                            });
    if (wants_json) PrintJsonError("USAGE", ExitCode::kUsage, e.what());
    return static_cast<int>(ExitCode::kUsage);
  }

  Context ctx;
  ctx.json = json;
  strata::Result<std::string> bearer = ResolveToken(token, token_file);
  if (!bearer.ok()) return ctx.Fail(bearer.status());
  strata::Result<std::unique_ptr<strata::Membership>> membership = OpenMembership(store);
  if (!membership.ok()) return ctx.Fail(membership.status());
  ctx.membership = std::move(membership).value();
  ctx.nodes = ctx.membership->Nodes();
  ConnectOptions options;
  options.token = *bearer;
  options.timeout = std::chrono::milliseconds(std::llround(timeout_s * 1000));
  options.tls_root_certs_file = tls_ca;
  for (const strata::NodeInfo& node : ctx.nodes) {
    strata::Result<std::unique_ptr<NodeClient>> client = NodeClient::Connect(node, options);
    if (!client.ok()) return ctx.Fail(client.status());
    ctx.clients.push_back(std::move(client).value());
  }
  return run(ctx);
}

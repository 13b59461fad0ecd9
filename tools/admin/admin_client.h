// strata-admin's side of the control plane: which nodes to ask, the
// credentials, one gRPC client per node, and how failures become the
// tool's documented exit codes and messages that name the node.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/membership.h"
#include "strata/status.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::admin {

// Documented in `strata-admin --help` and tools/README.md.
enum class ExitCode : int {
  kOk = 0,
  kUsage = 1,
  kUnreachable = 2,       // node unreachable, or no answer within the deadline
  kUnauthenticated = 3,   // no token, or the node rejected it
  kPermissionDenied = 4,  // the token's role or namespace does not allow it
  kNotFound = 5,          // no such key, entry or node
  kInvalidArgument = 6,   // the node (or this tool) refused an argument
  kOther = 7,
};
ExitCode ExitCodeFor(StatusCode code);
extern const char* const kExitCodeHelp;

// The nodes named by --store / STRATA_STORE: "strata://host:port" or
// "host:port", several separated by commas. A static list today; an etcd
// membership plugs in here and the commands stay as they are.
Result<std::unique_ptr<Membership>> OpenMembership(std::string_view store_spec);

// The bearer token: --token, else the file of --token-file (first line),
// else STRATA_TOKEN. UNAUTHENTICATED when there is none.
Result<std::string> ResolveToken(const std::string& token_flag, const std::string& token_file);

struct ConnectOptions {
  std::string token;
  std::chrono::milliseconds timeout{5000};
  std::string tls_root_certs_file;  // set: TLS with these roots
};

// One node's control plane. Every call has the deadline of ConnectOptions;
// a failure comes back with a message naming the node and the problem.
class NodeClient {
 public:
  static Result<std::unique_ptr<NodeClient>> Connect(const NodeInfo& node,
                                                     const ConnectOptions& options);

  const std::string& address() const { return address_; }

  Result<v1::StatsResponse> Stats();
  Result<v1::HelloResponse> Hello();
  Result<v1::EntryInfo> Inspect(const v1::InspectRequest& req);
  Status Pin(const v1::PinRequest& req);
  Result<v1::ListEntriesResponse> ListEntries(const v1::ListEntriesRequest& req);
  Result<v1::EvictResponse> Evict(const v1::EvictRequest& req);
  Result<v1::DrainResponse> Drain();
  Result<v1::PrefixResponse> Prefix(const v1::PrefixRequest& req);

 private:
  NodeClient(std::string address, const std::shared_ptr<grpc::Channel>& channel,
             const ConnectOptions& options);
  template <typename Fn>
  Status Call(Fn&& fn);

  std::string address_;
  std::unique_ptr<v1::CacheStore::Stub> store_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::string bearer_;
  std::chrono::milliseconds timeout_;
};

// "5s", "1.5s", "250ms": a deadline as people write it.
std::string FormatDeadline(std::chrono::milliseconds timeout);

}  // namespace strata::admin

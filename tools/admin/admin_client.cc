#include "admin_client.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "rpc/grpc_status.h"

namespace strata::admin {

const char* const kExitCodeHelp =
    "Exit codes:\n"
    "  0  ok\n"
    "  1  usage: bad command line\n"
    "  2  node unreachable (or no answer within --timeout)\n"
    "  3  token missing or rejected (unauthenticated)\n"
    "  4  permission denied: the token's role or namespace does not allow it\n"
    "  5  not found: no such key, entry or node\n"
    "  6  invalid argument: refused by the node or this tool\n"
    "  7  any other failure\n";

ExitCode ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return ExitCode::kOk;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return ExitCode::kUnreachable;
    case StatusCode::kUnauthenticated:
      return ExitCode::kUnauthenticated;
    case StatusCode::kPermissionDenied:
      return ExitCode::kPermissionDenied;
    case StatusCode::kNotFound:
      return ExitCode::kNotFound;
    case StatusCode::kInvalidArgument:
      return ExitCode::kInvalidArgument;
    default:
      return ExitCode::kOther;
  }
}

Result<std::unique_ptr<Membership>> OpenMembership(std::string_view spec) {
  // A cluster in etcd: every node it lists.
  if (spec.starts_with("strata+etcd://")) return OpenMembershipFromUri(spec);
  // strata://a:1, strata://b:2 (spaces and each item's scheme optional):
  // the client's own node list, which refuses a node listed twice.
  std::string list;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.starts_with("strata://")) item.remove_prefix(9);
    list += (start == 0 ? "" : ",") + std::string(item);
    start = end + 1;
  }
  Result<std::unique_ptr<Membership>> m = OpenMembershipFromUri("strata://" + list);
  if (!m.ok()) return InvalidArgument("--store: " + m.status().message());
  return m;
}

Result<std::string> ResolveToken(const std::string& token_flag, const std::string& token_file) {
  if (!token_flag.empty()) return token_flag;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) return InvalidArgument("--token-file: cannot read " + token_file);
    std::string line;
    std::getline(in, line);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) return Unauthenticated("--token-file " + token_file + " holds no token");
    return line;
  }
  if (const char* env = std::getenv("STRATA_TOKEN"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  return Unauthenticated("no token: pass --token, --token-file or set STRATA_TOKEN");
}

std::string FormatDeadline(std::chrono::milliseconds timeout) {
  const auto ms = timeout.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  if (ms > 1000) {
    std::ostringstream s;
    s << static_cast<double>(ms) / 1000 << "s";
    return s.str();
  }
  return std::to_string(ms) + "ms";
}

Result<std::unique_ptr<NodeClient>> NodeClient::Connect(const NodeInfo& node,
                                                        const ConnectOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs_file.empty()) {
    std::ifstream in(options.tls_root_certs_file);
    if (!in) return InvalidArgument("--tls-ca: cannot read " + options.tls_root_certs_file);
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    creds = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(node.address, creds);
  return std::unique_ptr<NodeClient>(new NodeClient(node.address, channel, options));
}

NodeClient::NodeClient(std::string address, const std::shared_ptr<grpc::Channel>& channel,
                       const ConnectOptions& options)
    : address_(std::move(address)),
      store_(v1::CacheStore::NewStub(channel)),
      admin_(v1::Admin::NewStub(channel)),
      bearer_("Bearer " + options.token),
      timeout_(options.timeout) {}

template <typename Fn>
Status NodeClient::Call(Fn&& fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  ctx.AddMetadata("authorization", bearer_);
  const grpc::Status g = fn(&ctx);
  if (g.ok()) return Status::Ok();
  const Status st = FromGrpc(g);
  // The node puts its exact code in the details; none means gRPC itself
  // failed: the node was never reached.
  const bool from_node = !g.error_details().empty();
  const std::string node = "node " + address_;
  switch (st.code()) {
    case StatusCode::kUnavailable:
      if (!from_node) {
        return Unavailable(node + " unreachable (deadline " + FormatDeadline(timeout_) +
                           "): " + st.message());
      }
      return Unavailable(node + " unavailable: " + st.message());
    case StatusCode::kDeadlineExceeded:
      return DeadlineExceeded(node + " unreachable (deadline " + FormatDeadline(timeout_) + ")" +
                              (from_node ? ": " + st.message() : ""));
    case StatusCode::kUnauthenticated:
      return Unauthenticated(node + " rejected the token: " + st.message());
    case StatusCode::kPermissionDenied:
      return PermissionDenied("permission denied by " + node + ": " + st.message());
    case StatusCode::kNotFound:
      return NotFound("not found on " + node + ": " + st.message());
    case StatusCode::kInvalidArgument:
      return InvalidArgument(node + " refused the request: " + st.message());
    default:
      return {st.code(), node + ": " + st.ToString()};
  }
}

Result<v1::StatsResponse> NodeClient::Stats() {
  v1::StatsResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return store_->Stats(c, v1::StatsRequest(), &resp); }));
  return resp;
}

Result<v1::HelloResponse> NodeClient::Hello() {
  v1::HelloResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return store_->Hello(c, v1::HelloRequest(), &resp); }));
  return resp;
}

Result<v1::EntryInfo> NodeClient::Inspect(const v1::InspectRequest& req) {
  v1::EntryInfo resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Inspect(c, req, &resp); }));
  return resp;
}

Status NodeClient::Pin(const v1::PinRequest& req) {
  v1::PinResponse resp;
  return Call([&](grpc::ClientContext* c) { return admin_->Pin(c, req, &resp); });
}

Result<v1::ListEntriesResponse> NodeClient::ListEntries(const v1::ListEntriesRequest& req) {
  v1::ListEntriesResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->ListEntries(c, req, &resp); }));
  return resp;
}

Result<v1::EvictResponse> NodeClient::Evict(const v1::EvictRequest& req) {
  v1::EvictResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Evict(c, req, &resp); }));
  return resp;
}

Result<v1::DrainResponse> NodeClient::Drain() {
  v1::DrainResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Drain(c, v1::DrainRequest(), &resp); }));
  return resp;
}

Result<v1::PrefixResponse> NodeClient::Prefix(const v1::PrefixRequest& req) {
  v1::PrefixResponse resp;
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Prefix(c, req, &resp); }));
  return resp;
}

}  // namespace strata::admin

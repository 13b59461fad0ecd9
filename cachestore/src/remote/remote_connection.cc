// The connection to a node: Hello over gRPC (waiting for a slow node or
// not), the data plane endpoint, reconnecting after a node restart.
#include "remote/remote_store_impl.h"

namespace strata {

Status RemoteStore::Connect(bool wait_for_node) {
  DataPlaneTurn turn(*this, std::numeric_limits<Nanos>::max());
  return ConnectLocked(wait_for_node);
}

Status RemoteStore::ConnectLocked(bool wait_for_node) {
  v1::HelloRequest req;
  v1::HelloResponse resp;
  auto say_hello = [&](grpc::ClientContext* c) { return stub_->Hello(c, req, &resp); };
  Status hello = Call(say_hello, /*idempotent=*/true, wait_for_node);
  if (hello.code() == StatusCode::kDeadlineExceeded && wait_for_node) {
    // Waited out the timeout without an answer. One more Hello that does
    // not wait says why (a refused connection, a name that does not
    // resolve, a TLS failure), or finds the node just up.
    hello = Call(say_hello, /*idempotent=*/false);
    if (hello.code() == StatusCode::kDeadlineExceeded) {
      hello = Unavailable("the node did not answer within the timeout");
    }
  }
  STRATA_RETURN_IF_ERROR(hello);
  dataplane::ServerInfo info;
  info.worker_address = resp.ucx_worker_address();
  info.packed_rkey = resp.ucx_rkey();
  info.region_base = resp.region_base();
  info.session = resp.session_id();
  info.host_id = resp.host_id();
  info.region_bytes = resp.region_bytes();
  info.wire_version = resp.data_plane_wire_version();
  dataplane::ClientOptions dp_options;
  dp_options.mode = mode_;
  dp_options.timeout = options_.timeout;
  // Keys were derived under the first namespace: a node that now maps
  // the token elsewhere gets no data plane from this client, ever.
  if (!ns_.empty() && ns_ != resp.namespace_()) {
    return Internal("the node now maps this token to namespace '" + resp.namespace_() + "', not '" +
                    ns_ + "'");
  }
  auto dp = dataplane::DataPlaneClient::Connect(info, dp_options);
  if (!dp.ok()) {
    // A mode the node does not allow is the caller's to fix, not a node
    // that is down (the cluster client would skip it as one).
    const StatusCode code = dp.status().code();
    return Status(code == StatusCode::kPermissionDenied || code == StatusCode::kInvalidArgument
                      ? code
                      : StatusCode::kUnavailable,
                  "data plane to node " + resp.node_id() + ": " + dp.status().message());
  }
  dp_ = std::move(dp).value();
  dp_instance_ = resp.instance_id();
  seen_instance_.store(resp.instance_id());
  region_bytes_ = resp.region_bytes();
  if (ns_.empty()) ns_ = resp.namespace_();  // set by Connect, before the store is shared
  return Status::Ok();
}

Result<dataplane::DataPlaneClient*> RemoteStore::DataPlaneLocked() {
  if (dp_ == nullptr || dp_instance_ != seen_instance_.load()) {
    dp_.reset();
    STRATA_RETURN_IF_ERROR(ConnectLocked());
  }
  return dp_.get();
}

void RemoteStore::MaybeDropLocked(const Status& st) {
  if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kUnauthenticated ||
      st.code() == StatusCode::kDeadlineExceeded) {
    dp_.reset();
  }
}

}  // namespace strata

// Match over the control plane, opening a remote store, deriving chain keys
// on the client.
#include "remote/remote_store_impl.h"
#include "util/mutex.h"

namespace strata {

Result<MatchResult> RemoteStore::Match(const MatchRequest& req) {
  std::vector<ChainKey> keys;
  Result<MatchKeysRequest> by_keys = DeriveMatchKeys(ns_, req, &keys);
  if (!by_keys.ok()) return by_keys.status();
  return MatchKeys(*by_keys);
}

Result<MatchResult> RemoteStore::MatchKeys(const MatchKeysRequest& req) {
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, req.keys.size()));
  v1::MatchRequest wire_req = wire::EncodeMatchRequest(req);
  {
    // Queued releases ride along (lost if the call fails: they expire).
    MutexLock lock(release_mu_);
    const size_t n = std::min(releases_.size(), kMaxReleasesPerMatch);
    for (size_t i = releases_.size() - n; i < releases_.size(); ++i) {
      wire_req.add_release_leases(releases_[i]);
    }
    releases_.resize(releases_.size() - n);
  }
  v1::MatchResponse resp;
  // The lease runs from before the request left, so our idea of its
  // expiry is never later than the node's.
  const Nanos sent = SteadyClock().Now();
  // Without a lease a match changes nothing: safe to retry.
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return stub_->Match(c, wire_req, &resp); },
           /*idempotent=*/!req.take_lease));
  Result<MatchResult> result = wire::DecodeMatchResponse(resp);
  if (!result.ok()) {
    // The node granted a lease with an answer we cannot use: end it now
    // rather than leave its entries pinned for its TTL.
    if (resp.lease_id() != 0) Release(resp.lease_id());
    return result.status();
  }
  result->model_id = req.model_id;
  result->block_tokens = req.block_tokens;
  result->prompt_blocks = static_cast<uint32_t>(req.keys.size());
  seen_instance_.store(resp.instance_id());
  if (result->lease != 0) {
    result->lease_expiry = sent + Nanos{resp.lease_ttl_ms()} * kNanosPerMilli;
    MutexLock lock(leases_mu_);
    if (lease_expiry_.size() >= kMaxTrackedLeases) {
      // Leases never released end on the node by themselves; forget them.
      std::erase_if(lease_expiry_, [&](const auto& kv) { return kv.second <= sent; });
    }
    lease_expiry_[result->lease] = result->lease_expiry;
  }
  return result;
}

Result<MatchKeysRequest> DeriveMatchKeys(const std::string& ns, const MatchRequest& req,
                                         std::vector<ChainKey>* keys) {
  if (req.tokens.size() > kMaxPromptTokens) {
    return InvalidArgument("prompt of " + std::to_string(req.tokens.size()) +
                           " tokens exceeds the limit of " + std::to_string(kMaxPromptTokens));
  }
  // The key count is checked once the keys exist (MatchKeys).
  STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, 0));
  const ChainRoot root{ns, req.model_id, req.extra};
  STRATA_RETURN_IF_ERROR(ValidateChainInputs(root, req.mm));
  Result<std::vector<ChainKey>> derived =
      ChainKeys::ForPrompt(root, req.tokens, req.block_tokens, req.mm);
  if (!derived.ok()) return derived.status();
  *keys = std::move(derived).value();
  MatchKeysRequest by_keys;
  by_keys.model_id = req.model_id;
  by_keys.root = ChainKeys::Root(root);
  by_keys.keys = *keys;
  by_keys.block_tokens = req.block_tokens;
  by_keys.want_swa = req.want_swa;
  by_keys.take_lease = req.take_lease;
  by_keys.lease_ttl = req.lease_ttl;
  return by_keys;
}

Result<std::unique_ptr<Store>> OpenRemoteStore(const std::string& target,
                                               const ClientOptions& options) {
  Result<std::unique_ptr<NodeClient>> node = ConnectNode(target, options, /*wait_for_node=*/true);
  if (!node.ok()) return node.status();
  return std::unique_ptr<Store>(std::move(node).value());
}

Result<std::unique_ptr<NodeClient>> ConnectNode(const std::string& target,
                                                const ClientOptions& options, bool wait_for_node) {
  ClientOptions opts = options;
  if (opts.token.empty()) {
    if (const char* env = std::getenv("STRATA_TOKEN"); env != nullptr) opts.token = env;
  }
  if (opts.token.empty()) {
    return Unauthenticated("no token: set ClientOptions::token or STRATA_TOKEN");
  }
  if (opts.timeout <= 0) return InvalidArgument("timeout must be positive");
  Result<dataplane::Mode> mode = dataplane::ParseMode(opts.data_plane_mode);
  if (!mode.ok()) return mode.status();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!opts.tls_root_certs_file.empty()) {
    Result<std::string> roots = ReadFileToString(opts.tls_root_certs_file);
    if (!roots.ok()) return roots.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *roots;
    creds = grpc::SslCredentials(ssl);
  }
  // A restarted node is found again within about a second:
  //  - gRPC's default reconnect backoff grows to two minutes while a node
  //    is down; here it stays under 1 s;
  //  - gRPC gives each connection attempt (TCP, TLS, HTTP/2 settings) the
  //    larger of the current backoff and the "min reconnect backoff". At
  //    100 ms a node slower than that to shake hands (busy, or far away
  //    with TLS) failed every attempt; at 5 s an attempt begun while the
  //    node was going down held the channel for those 5 s, and the client
  //    found the node back 4-9 s after it was (issue #39). 2 s;
  //  - the DNS resolver re-resolves a failing target at most every 30 s by
  //    default, and each re-resolution starts the channel over: 200 ms.
  constexpr int kConnectAttemptMs = 2000;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectAttemptMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
  auto store =
      std::make_unique<RemoteStore>(grpc::CreateCustomChannel(target, creds, args), opts, *mode);
  STRATA_RETURN_IF_ERROR(store->Connect(wait_for_node));
  return std::unique_ptr<NodeClient>(std::move(store));
}

}  // namespace strata

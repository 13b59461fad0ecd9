#include "node/node_service.h"

#include <chrono>
#include <cstring>
#include <random>

#include "dataplane/data_plane.h"
#include "rpc/grpc_status.h"
#include "rpc/wire.h"

namespace strata {
namespace {

// Limits not covered by wire.h's decoders (documented in cache.proto).
constexpr uint32_t kDefaultPageSize = 100;

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs one handler: authenticate, act, count. `fn(principal)` returns the
// call's Status.
template <typename Fn>
grpc::Status Serve(NodeState& s, const char* method, const grpc::ServerContext& ctx, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  Result<Principal> principal = s.Authenticate(ctx);
  const Status st = principal.ok() ? fn(*principal) : principal.status();
  s.CountRpc(method, st, Since(start));
  return ToGrpc(st);
}

// Lives as long as its call: gRPC deletes a call's interceptors with it.
class CallCounter final : public grpc::experimental::Interceptor {
 public:
  explicit CallCounter(std::atomic<int>& calls) : calls_(calls) { calls_.fetch_add(1); }
  ~CallCounter() override { calls_.fetch_sub(1); }
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  std::atomic<int>& calls_;
};

// The store contract is per tenant: the operator token has no data of its own.
Status DataCaller(const Principal& p) {
  if (p.ns == kOperatorNamespace) {
    return PermissionDenied("operator tokens are for admin calls; use a namespace token");
  }
  return Status::Ok();
}

// The principal an admin call acts as: the caller's own namespace, or, for
// an operator token, the one the request names.
Result<Principal> AdminTarget(const Principal& caller, const std::string& requested) {
  if (caller.role != Role::kAdmin) return PermissionDenied("admin calls need the admin role");
  if (caller.ns == kOperatorNamespace) {
    if (requested.empty()) return InvalidArgument("operator tokens must name a namespace");
    if (Status st = ValidateNamespace(requested); !st.ok()) return st;
    return Principal{requested, Role::kAdmin};
  }
  if (!requested.empty() && requested != caller.ns) {
    // Checked first: an oversized name echoed into the error would not fit
    // in the reply's trailers.
    if (Status st = ValidateNamespace(requested); !st.ok()) return st;
    return PermissionDenied("token of namespace '" + caller.ns + "' may not act on namespace '" +
                            requested + "'");
  }
  return caller;
}

// A lease's remaining time for the client; 0 once past (a slow match or
// reserve can outlast a short lease), never a wrapped-around month.
uint32_t TtlMs(Nanos ttl) {
  return static_cast<uint32_t>(std::max<Nanos>(ttl, 0) / kNanosPerMilli);
}

// The store's own lookup counters (cache_store.cc registers them; the same
// name and labels return the same counter).
uint64_t StoreCounter(CacheStore& store, const char* name) {
  return store.metrics().GetCounter(name, "")->Value();
}

uint64_t UptimeMs(const NodeState& s) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - s.started)
                                   .count());
}

void SetEvictions(const std::array<uint64_t, static_cast<size_t>(EvictReason::kCount)>& by_reason,
                  v1::StatsResponse* resp) {
  for (size_t i = 0; i < by_reason.size(); ++i) {
    (*resp->mutable_evictions())[std::string(EvictReasonName(static_cast<EvictReason>(i)))] =
        by_reason[i];
  }
}

// The operator's view: the whole node, every namespace.
void AddNodeStats(const NodeState& s, CacheStore& store, v1::StatsResponse* resp) {
  const StoreStats st = store.Stats();
  resp->set_used_bytes(st.used_bytes);
  resp->set_payload_bytes(st.payload_bytes);
  resp->set_global_kv_entries(st.global_kv_entries);
  resp->set_swa_entries(st.swa_entries);
  resp->set_reserved_entries(st.reserved_entries);
  resp->set_read_leases(st.read_leases);
  resp->set_write_leases(st.write_leases);
  SetEvictions(st.evictions, resp);
  for (const std::string& d : s.rdma_devices) resp->add_rdma_devices(d);
  if (s.data_plane != nullptr) {
    const auto dp = s.data_plane->stats();
    resp->set_data_plane_bytes_sent(dp.bytes_sent);
    resp->set_data_plane_bytes_received(dp.bytes_received);
    for (const std::string& t : dp.transports) resp->add_data_plane_transports(t);
  }
  for (const std::string& ns : store.Namespaces()) resp->add_namespaces(ns);
  resp->set_match_requests(StoreCounter(store, "strata_match_requests_total"));
  resp->set_match_tokens(StoreCounter(store, "strata_match_prompt_tokens_total"));
  resp->set_hit_tokens(StoreCounter(store, "strata_hit_tokens_total"));
  resp->set_hit_bytes(StoreCounter(store, "strata_hit_bytes_total"));
  resp->set_checksum_failures(StoreCounter(store, "strata_checksum_failures_total"));
  resp->set_ssd_enabled(st.ssd_enabled);
  if (st.ssd_enabled) {
    resp->set_ssd_capacity_bytes(st.ssd.capacity_bytes);
    resp->set_ssd_used_bytes(st.ssd.used_bytes);
    resp->set_ssd_entries(st.ssd.entries);
    resp->set_ssd_checksum_failures(st.ssd.checksum_failures);
    (*resp->mutable_ssd_evictions())["watermark"] = st.ssd.evictions;
    (*resp->mutable_ssd_evictions())["ttl"] = st.ssd.ttl_expired;
  }
}

// A tenant's view: its own namespace's figures and nothing node-wide (what
// other tenants store, look up or hold is theirs; issue #38).
void AddTenantStats(CacheStore& store, const Principal& p, v1::StatsResponse* resp) {
  const NamespaceStats ns = store.NamespaceUsage(p);
  resp->set_used_bytes(ns.used_bytes);
  resp->set_global_kv_entries(ns.global_kv_entries);
  resp->set_swa_entries(ns.swa_entries);
  SetEvictions(ns.evictions, resp);
  resp->set_match_requests(ns.match_requests);
  resp->set_match_tokens(ns.match_tokens);
  resp->set_hit_tokens(ns.hit_tokens);
  resp->set_hit_bytes(ns.hit_bytes);
  resp->set_lease_held_bytes(ns.lease.held_bytes);
  resp->set_lease_held_limit_bytes(ns.lease.limit_bytes);
  resp->set_leased_entries(ns.lease.leased_entries);
  resp->set_leased_entries_limit(ns.lease.leased_entries_limit);
}

}  // namespace

// ---- sessions -----------------------------------------------------------------

uint64_t SessionTable::Open(const Principal& principal) {
  // Unguessable: with a guessed session id and a (sequential) lease id one
  // could otherwise read another tenant's leased bytes.
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  std::lock_guard lock(mu_);
  std::deque<uint64_t>& tenant = by_tenant_[principal.ns];
  if (sessions_.emplace(id, principal).second) tenant.push_back(id);
  if (tenant.size() > per_tenant_) DropOldestLocked(tenant);
  while (sessions_.size() > capacity_) {
    auto most = by_tenant_.begin();
    for (auto it = by_tenant_.begin(); it != by_tenant_.end(); ++it) {
      if (it->second.size() > most->second.size()) most = it;
    }
    DropOldestLocked(most->second);
  }
  return id;
}

void SessionTable::DropOldestLocked(std::deque<uint64_t>& tenant) {
  sessions_.erase(tenant.front());
  tenant.pop_front();
}

std::optional<Principal> SessionTable::Find(uint64_t session) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

size_t SessionTable::size() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

// ---- shared state -------------------------------------------------------------

Result<Principal> NodeState::Authenticate(const grpc::ServerContext& ctx) const {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return Unauthenticated("missing 'authorization: Bearer' credentials");
  return tokens.Authenticate(std::string_view(it->second.data(), it->second.size()));
}

Result<dataplane::TransferHold> NodeState::AuthorizeTransfer(uint64_t session, uint64_t lease,
                                                             uint64_t offset, uint64_t length,
                                                             bool write) const {
  std::optional<Principal> p = sessions.Find(session);
  if (!p.has_value()) return Unauthenticated("unknown data-plane session; say Hello again");
  // Draining refuses new reservations (Reserve), not the writes of those
  // granted before: those land, and their Publish keeps them.
  const std::shared_ptr<CacheStore> s = StoreRef();
  if (s == nullptr) return Unavailable("node is stopping");
  Result<RangePin> pin = s->PinLeasedRange(*p, lease, offset, length, write);
  if (!pin.ok()) return pin.status();
  // A transfer still in flight when the node lets go of its store (shutdown)
  // has nothing left to release.
  return dataplane::TransferHold([store = std::weak_ptr<CacheStore>(s), pin = *pin] {
    if (const std::shared_ptr<CacheStore> live = store.lock()) live->ReleaseRangePin(pin);
  });
}

void NodeState::CountRpc(const char* method, const Status& status, double seconds) {
  metrics
      ->GetCounter("strata_node_rpc_total", "Control-plane calls by method and result code",
                   {{"method", method}, {"code", std::string(StatusCodeName(status.code()))}})
      ->Increment();
  metrics
      ->GetHistogram("strata_node_rpc_seconds", "Control-plane call latency",
                     MetricsRegistry::ExponentialBuckets(1e-5, 2, 20), {{"method", method}})
      ->Observe(seconds);
}

// ---- the store contract -------------------------------------------------------

namespace {

// Leases a client released (Store::Release), carried by a match or an
// abort. Gone already, or never the caller's: nothing to report.
Status EndReleasedLeases(const NodeState& s, const Principal& p,
                         const google::protobuf::RepeatedField<uint64_t>& leases) {
  if (leases.size() > static_cast<int>(kMaxReleasesPerMatch)) {
    return InvalidArgument("more than " + std::to_string(kMaxReleasesPerMatch) +
                           " released leases in one call");
  }
  for (const uint64_t lease : leases) (void)s.store->Abort(p, lease);
  return Status::Ok();
}

// Whether the client has gone: its call was cancelled (by it, by its
// deadline, by a broken connection), or its deadline passed, which it sees
// first (gRPC tells the server a moment later).
bool CallerLeft(const grpc::ServerContext& ctx) {
  return ctx.IsCancelled() || std::chrono::system_clock::now() > ctx.deadline();
}

// A lease granted to a client whose call has already ended would pin what
// it covers until its TTL, since no one learns its id: it ends here
// instead. A client that goes after this check, while the answer is on its
// way, still leaves its lease to the TTL; the check catches the common
// case, a slow handler outlasting the client's deadline.
Status EndLeaseIfCallerLeft(const NodeState& s, const Principal& p, const grpc::ServerContext& ctx,
                            uint64_t lease) {
  if (s.after_lease_grant) s.after_lease_grant([&ctx] { return CallerLeft(ctx); });
  if (lease == 0 || !CallerLeft(ctx)) return Status::Ok();
  (void)s.store->Abort(p, lease);
  return DeadlineExceeded("the call ended (deadline or cancel) before its answer left; lease " +
                          std::to_string(lease) + " was ended");
}

}  // namespace

grpc::Status CacheStoreService::Hello(grpc::ServerContext* ctx, const v1::HelloRequest*,
                                      v1::HelloResponse* resp) {
  return Serve(s_, "Hello", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    resp->set_node_id(s_.node_id);
    resp->set_namespace_(p.ns);
    resp->set_instance_id(s_.instance_id);
    resp->set_session_id(s_.sessions.Open(p));
    resp->set_region_bytes(s_.store->ArenaRegion().size());
    resp->set_data_plane_mode(s_.data_plane_mode);
    resp->set_data_plane_wire_version(dataplane::kWireVersion);
    if (s_.data_plane != nullptr) {
      resp->set_ucx_worker_address(s_.data_plane->worker_address());
      resp->set_ucx_rkey(s_.data_plane->packed_rkey());
      resp->set_region_base(s_.data_plane->region_base());
      resp->set_host_id(s_.data_plane->host_id());
    }
    for (const std::string& d : s_.rdma_devices) resp->add_rdma_devices(d);
    return Status::Ok();
  });
}

grpc::Status CacheStoreService::Match(grpc::ServerContext* ctx, const v1::MatchRequest* req,
                                      v1::MatchResponse* resp) {
  return Serve(s_, "Match", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    // Decoded first: a malformed request changes nothing, not even the
    // leases it would have released.
    wire::DecodedMatch decoded;
    STRATA_RETURN_IF_ERROR(wire::DecodeMatchRequest(*req, &decoded));
    STRATA_RETURN_IF_ERROR(EndReleasedLeases(s_, p, req->release_leases()));
    decoded.request.promote_ssd = true;  // remote clients read DRAM only
    Result<MatchResult> result = s_.store->MatchKeys(p, decoded.request);
    if (!result.ok()) return result.status();
    STRATA_RETURN_IF_ERROR(EndLeaseIfCallerLeft(s_, p, *ctx, result->lease));
    *resp = wire::EncodeMatchResult(*result);
    resp->set_instance_id(s_.instance_id);
    if (result->lease != 0) {
      resp->set_lease_ttl_ms(TtlMs(result->lease_expiry - s_.store->clock().Now()));
    }
    return Status::Ok();
  });
}

grpc::Status CacheStoreService::RenewLease(grpc::ServerContext* ctx,
                                           const v1::RenewLeaseRequest* req,
                                           v1::RenewLeaseResponse* resp) {
  return Serve(s_, "RenewLease", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    const Nanos ttl = Nanos{req->ttl_ms()} * kNanosPerMilli;
    if (ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl above 600000 ms");
    Nanos applied = 0;
    STRATA_RETURN_IF_ERROR(s_.store->RenewLease(p, req->lease_id(), ttl, &applied));
    resp->set_ttl_ms(TtlMs(applied));
    return Status::Ok();
  });
}

grpc::Status CacheStoreService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                                      v1::AbortResponse*) {
  return Serve(s_, "Abort", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    STRATA_RETURN_IF_ERROR(EndReleasedLeases(s_, p, req->release_leases()));
    return req->lease_id() == 0 ? Status::Ok() : s_.store->Abort(p, req->lease_id());
  });
}

grpc::Status CacheStoreService::Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* req,
                                        v1::ReserveResponse* resp) {
  return Serve(s_, "Reserve", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    // Counted before the check: a stop that set `draining` after it either
    // is seen here or sees this reservation (granted or refused) before it
    // counts the write leases to wait for.
    s_.reserves_admitting.fetch_add(1);
    Result<Reservation> r = [&]() -> Result<Reservation> {
      if (s_.draining.load()) return Unavailable("node " + s_.node_id + " is draining");
      if (s_.before_reserve) s_.before_reserve();
      ModelId model;
      std::vector<CommitBlock> blocks;
      Nanos ttl = 0;
      STRATA_RETURN_IF_ERROR(wire::DecodeReserveRequest(*req, &model, &blocks, &ttl));
      return s_.store->Reserve(p, model, blocks, ttl);
    }();
    s_.reserves_admitting.fetch_sub(1);
    if (!r.ok()) return r.status();
    STRATA_RETURN_IF_ERROR(EndLeaseIfCallerLeft(s_, p, *ctx, r->write_lease));
    const std::byte* base = s_.store->ArenaRegion().data();
    resp->set_write_lease_id(r->write_lease);
    resp->set_instance_id(s_.instance_id);
    if (r->write_lease != 0) resp->set_ttl_ms(TtlMs(r->expiry - s_.store->clock().Now()));
    for (const ReservedBlock& b : r->blocks) {
      v1::ReservedBlock* o = resp->add_blocks();
      switch (b.state) {
        case ReserveState::kReserved:
          o->set_state(v1::RESERVED);
          o->set_location(static_cast<uint64_t>(b.buffer.data() - base));
          break;
        case ReserveState::kAlreadyPresent:
          o->set_state(v1::ALREADY_PRESENT);
          break;
        case ReserveState::kInFlight:
          o->set_state(v1::IN_FLIGHT);
          break;
      }
    }
    return Status::Ok();
  });
}

grpc::Status CacheStoreService::Publish(grpc::ServerContext* ctx, const v1::PublishRequest* req,
                                        v1::PublishResponse* resp) {
  return Serve(s_, "Publish", *ctx, [&](const Principal& p) -> Status {
    STRATA_RETURN_IF_ERROR(DataCaller(p));
    if (req->checksums_size() > static_cast<int>(kMaxBlocksPerCall)) {
      return InvalidArgument("publish of more than " + std::to_string(kMaxBlocksPerCall) +
                             " checksums");
    }
    const std::vector<uint64_t> checksums(req->checksums().begin(), req->checksums().end());
    Result<PublishResult> r = s_.store->Publish(p, req->write_lease_id(), checksums);
    if (!r.ok()) return r.status();
    *resp = wire::EncodePublishResult(*r);
    return Status::Ok();
  });
}

grpc::Status CacheStoreService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                      v1::StatsResponse* resp) {
  return Serve(s_, "Stats", *ctx, [&](const Principal& p) -> Status {
    resp->set_node_id(s_.node_id);
    resp->set_draining(s_.draining.load());
    resp->set_capacity_bytes(s_.store->Stats().capacity_bytes);
    resp->set_uptime_ms(UptimeMs(s_));
    if (p.ns == kOperatorNamespace) {
      resp->set_scope("node");
      AddNodeStats(s_, *s_.store, resp);
    } else {
      resp->set_scope("namespace");
      AddTenantStats(*s_.store, p, resp);
    }
    return Status::Ok();
  });
}

// ---- admin --------------------------------------------------------------------

grpc::Status AdminService::Inspect(grpc::ServerContext* ctx, const v1::InspectRequest* req,
                                   v1::EntryInfo* resp) {
  return Serve(s_, "Inspect", *ctx, [&](const Principal& caller) -> Status {
    Result<Principal> p = AdminTarget(caller, req->namespace_());
    if (!p.ok()) return p.status();
    EntryCursor ref;
    STRATA_RETURN_IF_ERROR(wire::DecodeEntryRef(req->entry(), &ref));
    Result<EntryInfo> info = s_.store->Inspect(*p, ref.key, ref.kind);
    if (!info.ok()) return info.status();
    *resp = wire::EncodeEntryInfo(*info, s_.store->clock().Now());
    return Status::Ok();
  });
}

grpc::Status AdminService::Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                               v1::PinResponse*) {
  return Serve(s_, "Pin", *ctx, [&](const Principal& caller) -> Status {
    Result<Principal> p = AdminTarget(caller, req->namespace_());
    if (!p.ok()) return p.status();
    EntryCursor ref;
    STRATA_RETURN_IF_ERROR(wire::DecodeEntryRef(req->entry(), &ref));
    if (req->ttl_s() > kMaxPinTtlSeconds) return InvalidArgument("pin ttl above 30 days");
    if (req->ttl_s() == 0) return s_.store->Unpin(*p, ref.key, ref.kind);
    return s_.store->Pin(*p, ref.key, ref.kind, Seconds(req->ttl_s()));
  });
}

grpc::Status AdminService::Delete(grpc::ServerContext* ctx, const v1::DeleteRequest* req,
                                  v1::DeleteResponse* resp) {
  return Serve(s_, "Delete", *ctx, [&](const Principal& caller) -> Status {
    Result<Principal> p = AdminTarget(caller, req->namespace_());
    if (!p.ok()) return p.status();
    EvictRequest evict;
    evict.root.emplace();
    STRATA_RETURN_IF_ERROR(wire::DecodeEntryRef(req->entry(), &*evict.root));
    evict.max_listed = 0;
    Result<EvictReport> r = s_.store->Evict(*p, evict);
    if (!r.ok()) return r.status();
    resp->set_deleted(r->evicted + r->deferred);
    return Status::Ok();
  });
}

grpc::Status AdminService::ListEntries(grpc::ServerContext* ctx, const v1::ListEntriesRequest* req,
                                       v1::ListEntriesResponse* resp) {
  return Serve(s_, "ListEntries", *ctx, [&](const Principal& caller) -> Status {
    wire::DecodedFilter filter;
    STRATA_RETURN_IF_ERROR(wire::DecodeEntryFilter(req->filter(), &filter));
    Result<Principal> p = AdminTarget(caller, filter.ns);
    if (!p.ok()) return p.status();
    Result<std::optional<EntryCursor>> after = wire::DecodePageToken(req->page_token());
    if (!after.ok()) return after.status();
    const uint32_t limit = req->page_size() == 0 ? kDefaultPageSize : req->page_size();
    Result<EntryPage> page = s_.store->ListEntries(*p, filter.filter, *after, limit);
    if (!page.ok()) return page.status();
    const Nanos now = s_.store->clock().Now();
    for (const EntryInfo& e : page->entries) *resp->add_entries() = wire::EncodeEntryInfo(e, now);
    if (page->next.has_value()) resp->set_next_page_token(wire::EncodePageToken(*page->next));
    return Status::Ok();
  });
}

grpc::Status AdminService::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                                 v1::EvictResponse* resp) {
  return Serve(s_, "Evict", *ctx, [&](const Principal& caller) -> Status {
    EvictRequest evict;
    evict.dry_run = req->dry_run();
    if (req->max_listed() > kMaxBlocksPerCall) {
      return InvalidArgument("max_listed above " + std::to_string(kMaxBlocksPerCall));
    }
    evict.max_listed = req->max_listed() == 0 ? kDefaultPageSize : req->max_listed();
    std::string ns = req->namespace_();
    switch (req->target_case()) {
      case v1::EvictRequest::kEntry:
        evict.root.emplace();
        STRATA_RETURN_IF_ERROR(wire::DecodeEntryRef(req->entry(), &*evict.root));
        break;
      case v1::EvictRequest::kPrefix: {
        const auto& keys = req->prefix().keys();
        if (keys.empty() || keys.size() > static_cast<int>(kMaxBlocksPerCall)) {
          return InvalidArgument("a prompt prefix needs 1.." + std::to_string(kMaxBlocksPerCall) +
                                 " keys");
        }
        // Everything extending the prefix hangs below its last block; the
        // others are only checked, so a garbled prompt is refused whole.
        for (const std::string& key : keys) {
          if (key.size() != ChainKey().bytes.size()) {
            return InvalidArgument("prompt prefix keys must be 16 bytes");
          }
        }
        evict.root.emplace();
        v1::EntryRef last = wire::EncodeEntryRef({}, StateKind::kGlobalKv);
        last.set_key(keys[keys.size() - 1]);
        STRATA_RETURN_IF_ERROR(wire::DecodeEntryRef(last, &*evict.root));
        break;
      }
      case v1::EvictRequest::kFilter: {
        wire::DecodedFilter filter;
        STRATA_RETURN_IF_ERROR(wire::DecodeEntryFilter(req->filter(), &filter));
        if (!filter.ns.empty() && !ns.empty() && filter.ns != ns) {
          return InvalidArgument("two different namespaces in one request");
        }
        if (!filter.ns.empty()) ns = filter.ns;
        evict.filter = filter.filter;
        break;
      }
      default:
        return InvalidArgument("evict needs an entry, a prompt prefix or a filter");
    }
    Result<Principal> p = AdminTarget(caller, ns);
    if (!p.ok()) return p.status();
    Result<EvictReport> r = s_.store->Evict(*p, evict);
    if (!r.ok()) return r.status();
    resp->set_evicted(r->evicted);
    resp->set_deferred(r->deferred);
    resp->set_skipped_pinned(r->skipped_pinned);
    resp->set_bytes(r->bytes);
    const Nanos now = s_.store->clock().Now();
    for (const EntryInfo& e : r->entries) *resp->add_entries() = wire::EncodeEntryInfo(e, now);
    return Status::Ok();
  });
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest*,
                                 v1::DrainResponse* resp) {
  return Serve(s_, "Drain", *ctx, [&](const Principal& caller) -> Status {
    // Draining affects every tenant: operator tokens only.
    if (caller.ns != kOperatorNamespace) {
      return PermissionDenied("drain needs an operator token (namespace '*')");
    }
    s_.draining.store(true);
    const StoreStats st = s_.store->Stats();
    resp->set_read_leases(st.read_leases);
    resp->set_write_leases(st.write_leases);
    return Status::Ok();
  });
}

grpc::Status AdminService::Prefix(grpc::ServerContext* ctx, const v1::PrefixRequest* req,
                                  v1::PrefixResponse* resp) {
  return Serve(s_, "Prefix", *ctx, [&](const Principal& caller) -> Status {
    Result<Principal> p = AdminTarget(caller, req->namespace_());
    if (!p.ok()) return p.status();
    if (req->model_id().size() != 16) return InvalidArgument("model_id must be 16 bytes");
    if (req->keys_size() > static_cast<int>(kMaxBlocksPerCall)) {
      return InvalidArgument("prefix of more than " + std::to_string(kMaxBlocksPerCall) + " keys");
    }
    ModelId model;
    std::memcpy(model.bytes.data(), req->model_id().data(), model.bytes.size());
    resp->set_node_id(s_.node_id);
    // Inspect reads the indexes only: unlike a match it takes no lease,
    // counts no hit, promotes nothing and leaves the eviction order alone.
    bool leading = true;
    for (const std::string& raw : req->keys()) {
      ChainKey key;
      if (raw.size() != key.bytes.size()) return InvalidArgument("keys must be 16 bytes");
      std::memcpy(key.bytes.data(), raw.data(), key.bytes.size());
      v1::PrefixBlock* out = resp->add_blocks();
      out->set_key(raw);
      Result<EntryInfo> info = s_.store->Inspect(*p, key, StateKind::kGlobalKv);
      if (!info.ok() && info.status().code() != StatusCode::kNotFound) return info.status();
      const bool present = info.ok() && info->model_id == model;
      if (present) {
        const Nanos now = s_.store->clock().Now();
        out->set_present(true);
        out->set_tier(wire::EncodeEntryInfo(*info, now).tier());  // DRAM, or an SSD-only copy
        out->set_payload_bytes(info->payload_bytes);
        out->set_live_leases(info->live_leases);
        out->set_pinned(info->pinned_until > now);
        out->set_swa(s_.store->Inspect(*p, key, StateKind::kSwaState).ok());
      }
      leading = leading && present;
      if (leading) resp->set_leading_hits(resp->leading_hits() + 1);
    }
    return Status::Ok();
  });
}

grpc::experimental::Interceptor* CallCounterFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* /*info*/) {
  return new CallCounter(s_.calls_in_flight);
}

}  // namespace strata

// The gRPC services of a node: the store contract (CacheStore) and the
// operator's calls (Admin). Both authenticate every call from its bearer
// token and act only within the token's namespace.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "dataplane/data_plane.h"
#include "node/token_auth.h"
#include "strata/cache_store.h"
#include "strata/metrics.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata {

// Data-plane sessions: which principal a session id handed out by Hello
// stands for. Bounded: the oldest sessions are forgotten first (a client
// whose session went away says Hello again).
// Data-plane sessions (Hello). Bounded per tenant (namespace) and in all:
// a tenant that opens too many loses its own oldest ones, and at the global
// bound the tenant holding the most does, so no tenant's Hello loop can push
// the others' sessions out.
class SessionTable {
 public:
  explicit SessionTable(size_t per_tenant = 4096, size_t capacity = 65536)
      : per_tenant_(per_tenant), capacity_(capacity) {}
  uint64_t Open(const Principal& principal);
  std::optional<Principal> Find(uint64_t session) const;
  size_t size() const;

 private:
  void DropOldestLocked(std::deque<uint64_t>& tenant);

  mutable std::mutex mu_;
  const size_t per_tenant_;
  const size_t capacity_;
  std::unordered_map<uint64_t, Principal> sessions_;
  std::map<std::string, std::deque<uint64_t>> by_tenant_;  // oldest first
};

// What the services share; owned by the Node.
struct NodeState {
  std::string node_id;
  uint64_t instance_id = 0;  // random per process
  std::shared_ptr<CacheStore> store;
  TokenTable tokens;
  SessionTable sessions;
  std::atomic<bool> draining{false};
  // gRPC calls from their start until gRPC is done with them, replies sent
  // (CallCounterFactory): a stopping node waits for these.
  std::atomic<int> calls_in_flight{0};
  // Reserve handlers between their draining check and their grant: a
  // stopping node waits for them before it counts the writes to finish.
  std::atomic<int> reserves_admitting{0};
  dataplane::DataPlaneServer* data_plane = nullptr;  // set once at start
  std::string data_plane_mode;
  std::vector<std::string> rdma_devices;
  MetricsRegistry* metrics = nullptr;
  // Test hook: runs in Match and Reserve after the store granted the call's
  // lease, before the handler checks that the caller is still there (what
  // `caller_left` tells).
  std::function<void(const std::function<bool()>& caller_left)> after_lease_grant;
  // Test hook: runs in Reserve between its draining check and the grant.
  std::function<void()> before_reserve;
  // For the uptime in Stats: the state is made when the node starts.
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // Set once at start, cleared at the end; the data plane's thread reads
  // it through StoreRef() so a callback in flight keeps the store alive.
  void SetStore(std::shared_ptr<CacheStore> s) {
    std::lock_guard lock(store_mu);
    store = std::move(s);
  }
  std::shared_ptr<CacheStore> StoreRef() const {
    std::lock_guard lock(store_mu);
    return store;
  }
  mutable std::mutex store_mu;

  Result<Principal> Authenticate(const grpc::ServerContext& context) const;
  // Data-plane checks: the session's principal must own the lease, and the
  // lease must hold the bytes. The hold pins the entry until the transfer is
  // over (CacheStore::PinLeasedRange).
  Result<dataplane::TransferHold> AuthorizeTransfer(uint64_t session, uint64_t lease,
                                                    uint64_t offset, uint64_t length,
                                                    bool write) const;
  void CountRpc(const char* method, const Status& status, double seconds);
};

class CacheStoreService final : public v1::CacheStore::Service {
 public:
  explicit CacheStoreService(NodeState& state) : s_(state) {}
  grpc::Status Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                     v1::HelloResponse* resp) override;
  grpc::Status Match(grpc::ServerContext* ctx, const v1::MatchRequest* req,
                     v1::MatchResponse* resp) override;
  grpc::Status RenewLease(grpc::ServerContext* ctx, const v1::RenewLeaseRequest* req,
                          v1::RenewLeaseResponse* resp) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                     v1::AbortResponse* resp) override;
  grpc::Status Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* req,
                       v1::ReserveResponse* resp) override;
  grpc::Status Publish(grpc::ServerContext* ctx, const v1::PublishRequest* req,
                       v1::PublishResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;

 private:
  NodeState& s_;
};

class AdminService final : public v1::Admin::Service {
 public:
  explicit AdminService(NodeState& state) : s_(state) {}
  grpc::Status Inspect(grpc::ServerContext* ctx, const v1::InspectRequest* req,
                       v1::EntryInfo* resp) override;
  grpc::Status Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                   v1::PinResponse* resp) override;
  grpc::Status Delete(grpc::ServerContext* ctx, const v1::DeleteRequest* req,
                      v1::DeleteResponse* resp) override;
  grpc::Status ListEntries(grpc::ServerContext* ctx, const v1::ListEntriesRequest* req,
                           v1::ListEntriesResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override;
  grpc::Status Prefix(grpc::ServerContext* ctx, const v1::PrefixRequest* req,
                      v1::PrefixResponse* resp) override;

 private:
  NodeState& s_;
};

// Counts every call the gRPC server runs into NodeState::calls_in_flight,
// from its start until gRPC has sent its reply and let it go: a handler
// that has returned has not answered yet, and a stopping node that cancels
// such a call makes a kept commit look lost to its client.
class CallCounterFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(NodeState& state) : s_(state) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  NodeState& s_;
};

}  // namespace strata

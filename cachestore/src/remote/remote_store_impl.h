// RemoteStore: the client of one node, shared by the files of
// cachestore/src/remote/ that implement it (one concept each).
//
// The remote Store. Control calls go over one gRPC channel with a deadline
// each; bytes go over one UCX endpoint (data_plane.h) straight between the
// caller's buffers and the node's arena. Fetched bytes are verified here,
// against the entry checksum the node reported, before anyone is told they
// are ready: the node's answer is trusted for where bytes are, never for
// what they are.
#pragma once

#include "remote/remote_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "dataplane/data_plane.h"
#include "format/fetch_prefix.h"
#include "rpc/grpc_status.h"
#include "rpc/wire.h"
#include "strata/v1/cache.grpc.pb.h"
#include "util/copy_pool.h"
#include "util/file_util.h"
#include "util/mutex.h"

namespace strata {

inline constexpr size_t kMaxTrackedLeases = 4096;

// One fetched payload, verified piece by piece as its pieces land: the
// header against the entry checksum, then each layer group against the
// header's table.
struct PayloadCheck {
  std::span<std::byte> bytes;
  uint64_t checksum = 0;
  std::optional<PayloadHeader> header;  // once the header verified
  Status failed;                        // first failure
};

inline Status VerifyHeader(PayloadCheck& p) {
  const uint64_t n = p.bytes.size();
  Result<PayloadHeader> h = ParsePayloadHeader(p.bytes);
  if (!h.ok()) return ChecksumMismatch("payload header: " + h.status().message());
  if (h->header_bytes > n || Checksum64(p.bytes.first(h->header_bytes)) != p.checksum) {
    return ChecksumMismatch("payload header fails the entry checksum");
  }
  for (const GroupExtent& g : h->groups) {
    if (g.offset > n || g.length > n - g.offset) {
      return ChecksumMismatch("payload group outside the payload");
    }
  }
  p.header = std::move(h).value();
  return Status::Ok();
}

inline Status VerifyGroup(const PayloadCheck& p, size_t g) {
  const GroupExtent& ge = p.header->groups[g];
  if (Checksum64(p.bytes.subspan(ge.offset, ge.length)) != ge.checksum) {
    return ChecksumMismatch("layer group " + std::to_string(g) + " fails its checksum");
  }
  return Status::Ok();
}

class RemoteStore final : public NodeClient {
 public:
  RemoteStore(const std::shared_ptr<grpc::Channel>& channel, ClientOptions options,
              dataplane::Mode mode)
      : stub_(v1::CacheStore::NewStub(channel)),
        options_(std::move(options)),
        mode_(mode),
        bearer_("Bearer " + options_.token),
        copy_pool_(options_.copy_threads),
        release_flusher_([this] { FlushReleases(); }) {}

  ~RemoteStore() override {
    {
      MutexLock lock(release_mu_);
      stopping_ = true;
    }
    release_cv_.notify_all();
    release_flusher_.join();  // sends what is still queued
    // Reservations staged here and never published: tell the node.
    std::vector<LeaseId> pending;
    {
      MutexLock lock(staged_mu_);
      for (const auto& [lease, staged] : staged_) pending.push_back(lease);
    }
    for (LeaseId lease : pending) (void)Abort(lease);
  }

  // `wait_for_node`: see ConnectNode.
  Status Connect(bool wait_for_node);

  const std::string& caller_namespace() const override { return ns_; }
  Result<std::string> CallerNamespace() override { return ns_; }

  Result<MatchResult> Match(const MatchRequest& req) override;

  Result<MatchResult> MatchKeys(const MatchKeysRequest& req) override;

  FetchFuture Fetch(const FetchRequest& req) override { return FetchFuture::Ready(FetchNow(req)); }

  Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                              Nanos write_lease_ttl) override;

  Result<Reservation> ReserveUnstaged(const ModelId& model, std::span<const CommitBlock> blocks,
                                      Nanos write_lease_ttl) override;

  Result<Reservation> ReserveStaged(const ModelId& model, std::span<const CommitBlock> blocks,
                                    Nanos write_lease_ttl, bool stage);

  Result<PublishResult> Publish(LeaseId write_lease, std::span<const uint64_t> checksums) override;

  Result<PublishResult> PublishFrom(LeaseId write_lease,
                                    std::span<const std::span<const std::byte>> payloads,
                                    std::span<const uint64_t> checksums) override;

  Result<PublishResult> Commit(const ModelId& model,
                               std::span<const CommitPayload> payloads) override;

  Status RenewLease(LeaseId lease, Nanos ttl) override;

  void Release(LeaseId lease) override;

  Status Abort(LeaseId lease) override;

 private:
  struct Staged {
    std::vector<std::vector<std::byte>> buffers;  // one per op, or none if unstaged
    std::vector<dataplane::DataPlaneClient::WriteOp> ops;
    std::vector<size_t> blocks;   // each op's block in the reservation
    std::vector<uint64_t> sizes;  // and its payload bytes
    Nanos expiry = 0;             // the write lease's, on the steady clock
    Nanos ttl = 0;                // and its length
  };

  Nanos Deadline() const { return SteadyClock().Now() + options_.timeout; }

  // The data plane's turn, waited for until `deadline` at most: transfers
  // queued behind one to a node that hangs fail at their own deadline, not
  // one timeout (and teardown) per transfer ahead of them. (A turn, not a
  // std::timed_mutex: ThreadSanitizer does not see the latter's timed lock.)
  class DataPlaneTurn {
   public:
    DataPlaneTurn(RemoteStore& store, Nanos deadline) : store_(store) {
      MutexLock lock(store_.dp_mu_);
      held_ = store_.dp_turn_cv_.wait_until(
          lock.native(), std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline)),
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_.dp_mu_) { return !store_.dp_taken_; });
      if (held_) store_.dp_taken_ = true;
    }
    ~DataPlaneTurn() {
      if (!held_) return;
      {
        MutexLock lock(store_.dp_mu_);
        store_.dp_taken_ = false;
      }
      store_.dp_turn_cv_.notify_one();
    }
    DataPlaneTurn(const DataPlaneTurn&) = delete;
    DataPlaneTurn& operator=(const DataPlaneTurn&) = delete;
    bool held() const { return held_; }

   private:
    RemoteStore& store_;
    bool held_ = false;
  };
  static Status DataPlaneBusy() {
    return DeadlineExceeded("the data plane to the node stayed busy past the call's deadline");
  }

  std::optional<Staged> TakeStaged(LeaseId write_lease);

  // The release flusher: leases released and not carried by a match within
  // kReleaseDelay are ended with Abort calls, so an idle client never holds
  // blocks against eviction for a whole lease TTL.
  void FlushReleases();

  // One control-plane call with a deadline and credentials; idempotent calls
  // are retried once when the channel was unavailable (a node restart).
  // `wait_for_ready`: the call waits through failed connection attempts
  // until its deadline instead of failing with the first.
  template <typename Fn>
  Status Call(Fn&& fn, bool idempotent, bool wait_for_ready = false) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::nanoseconds(options_.timeout));
      ctx.set_wait_for_ready(wait_for_ready);
      ctx.AddMetadata("authorization", bearer_);
      Status st = FromGrpc(fn(&ctx));
      if (st.ok() || !idempotent || attempt >= 1 || st.code() != StatusCode::kUnavailable) {
        return st;
      }
    }
  }

  // Says Hello and connects the data plane; called in the data plane's turn.
  // `wait_for_node`: the Hello waits for the node up to the timeout (see
  // ConnectNode); a reconnect fails fast, and its caller falls back.
  Status ConnectLocked(bool wait_for_node = false);

  // The data plane, reconnected first if a failure dropped it.
  Result<dataplane::DataPlaneClient*> DataPlaneLocked();

  // A transfer that failed because the node went away (or forgot our
  // session) drops the endpoint; the next call says Hello again.
  void MaybeDropLocked(const Status& st);

  Status ReserveRpc(const ModelId& model, std::span<const CommitBlock> blocks, Nanos ttl,
                    v1::ReserveResponse* resp);

  // Ships the bytes, then publishes; on any failure the reservation is
  // aborted so nothing partial can ever become visible.
  Result<PublishResult> WriteAndPublish(LeaseId lease,
                                        std::span<const dataplane::DataPlaneClient::WriteOp> ops,
                                        std::span<const uint64_t> checksums);

  bool LeaseEnded(LeaseId lease);

  FetchOutcome FetchNow(const FetchRequest& req);

  // The node's arena is mapped into this process (UCX shared memory): each
  // layer group is copied and hashed in one pass, as the in-process store
  // does, layer group by layer group across blocks. Bytes that changed
  // under us (a lease that ran out) fail their checksum and are not served.
  // How many of the first n blocks of `match` the lease covers: in order,
  // the same entries, and in DRAM (only DRAM has a readable location).
  static size_t LeasedPrefix(const MatchResult& match, const MatchResult& leased, size_t n);
  static bool SwaLeased(const MatchResult& match, const MatchResult& leased);

  void FetchMapped(const std::byte* base, const MatchResult& match, const MatchResult& leased,
                   const FetchRequest& req, size_t n, bool want_swa, FetchOutcome& out);

  // Verifies the SWA state's bytes as they landed and reports it ready: a
  // worker needs it, with layer group 0, before it runs layer 0, so it is
  // read and reported before the bodies, not behind them. It is only good
  // with the prefix under it; a body that fails later, short of its
  // boundary, voids it (FinishSwa).
  static bool VerifySwa(const FetchRequest& req, PayloadCheck& p, FetchPrefix& prefix);

  // The SWA state is served when it verified and the prefix it belongs to
  // arrived whole; sets the outcome's final status.
  static void FinishSwa(const MatchResult& leased, bool want_swa, bool swa_ok, bool swa_verified,
                        FetchPrefix& prefix, FetchOutcome& out);

  // Reads under `leased` (locations) what `match` describes, layer group
  // by layer group when the payloads are laid out as the built-in layouts
  // are, verifying each piece as it lands.
  void FetchInto(const FetchRequest& req, const MatchResult& match, const MatchResult& leased,
                 size_t n, bool want_swa, Nanos deadline, FetchOutcome& out);

  // FetchInto's pieces and their verification (remote_fetch.cc).
  struct FetchIntoState;

  // FetchInto's transfer, in the data plane's turn; each piece is verified
  // as it lands. An RMA read never starts under a lease known to have ended.
  Status ReadPieces(FetchIntoState& state, Nanos deadline);

  std::unique_ptr<v1::CacheStore::Stub> stub_;
  const ClientOptions options_;
  const dataplane::Mode mode_;
  const std::string bearer_;
  CopyPool copy_pool_;  // FetchMapped's verified copies

  // The caller's namespace (it feeds key[0]); written once by Connect.
  std::string ns_;

  // The data plane: dp_taken_ (under dp_mu_) says whose turn it is
  // (DataPlaneTurn); only the turn's holder touches what follows.
  Mutex dp_mu_;
  std::condition_variable dp_turn_cv_;
  bool dp_taken_ ABSL_GUARDED_BY(dp_mu_) = false;
  std::unique_ptr<dataplane::DataPlaneClient> dp_;
  uint64_t region_bytes_ = 0;  // of the node's arena

  uint64_t dp_instance_ = 0;                // the node process dp_ talks to
  std::atomic<uint64_t> seen_instance_{0};  // the one that answered last

  Mutex staged_mu_;
  std::unordered_map<LeaseId, Staged> staged_ ABSL_GUARDED_BY(staged_mu_);

  // Read leases we hold and when they end: RMA reads bypass the node, so
  // the client refuses to read under a lease it knows has ended.
  Mutex leases_mu_;
  std::unordered_map<LeaseId, Nanos> lease_expiry_ ABSL_GUARDED_BY(leases_mu_);

  // Released read leases not yet sent (see Release and FlushReleases).
  static constexpr size_t kMaxQueuedReleases = 4096;
  Mutex release_mu_;
  std::condition_variable release_cv_;
  std::vector<LeaseId> releases_ ABSL_GUARDED_BY(release_mu_);
  bool stopping_ ABSL_GUARDED_BY(release_mu_) = false;
  std::thread release_flusher_;  // last: starts once everything above exists
};

}  // namespace strata

// The remote Store. Control calls go over one gRPC channel with a deadline
// each; bytes go over one UCX endpoint (data_plane.h) straight between the
// caller's buffers and the node's arena. Fetched bytes are verified here,
// against the entry checksum the node reported, before anyone is told they
// are ready: the node's answer is trusted for where bytes are, never for
// what they are.
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
#include "rpc/grpc_status.h"
#include "rpc/wire.h"
#include "strata/v1/cache.grpc.pb.h"
#include "util/copy_pool.h"
#include "util/file_util.h"

namespace strata {
namespace {

constexpr size_t kMaxTrackedLeases = 4096;

// One fetched payload, verified piece by piece as its pieces land: the
// header against the entry checksum, then each layer group against the
// header's table.
struct PayloadCheck {
  std::span<std::byte> bytes;
  uint64_t checksum = 0;
  std::optional<PayloadHeader> header;  // once the header verified
  Status failed;                        // first failure
};

Status VerifyHeader(PayloadCheck& p) {
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

Status VerifyGroup(const PayloadCheck& p, size_t g) {
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
      std::lock_guard lock(release_mu_);
      stopping_ = true;
    }
    release_cv_.notify_all();
    release_flusher_.join();  // sends what is still queued
    // Reservations staged here and never published: tell the node.
    std::vector<LeaseId> pending;
    {
      std::lock_guard lock(staged_mu_);
      for (const auto& [lease, staged] : staged_) pending.push_back(lease);
    }
    for (LeaseId lease : pending) (void)Abort(lease);
  }

  // `wait_for_node`: see ConnectNode.
  Status Connect(bool wait_for_node) {
    DataPlaneTurn turn(*this, std::numeric_limits<Nanos>::max());
    return ConnectLocked(wait_for_node);
  }

  const std::string& caller_namespace() const override { return ns_; }
  Result<std::string> CallerNamespace() override { return ns_; }

  Result<MatchResult> Match(const MatchRequest& req) override {
    std::vector<ChainKey> keys;
    Result<MatchKeysRequest> by_keys = DeriveMatchKeys(ns_, req, &keys);
    if (!by_keys.ok()) return by_keys.status();
    return MatchKeys(*by_keys);
  }

  Result<MatchResult> MatchKeys(const MatchKeysRequest& req) override {
    STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, req.keys.size()));
    v1::MatchRequest wire_req = wire::EncodeMatchRequest(req);
    {
      // Queued releases ride along (lost if the call fails: they expire).
      std::lock_guard lock(release_mu_);
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
      std::lock_guard lock(leases_mu_);
      if (lease_expiry_.size() >= kMaxTrackedLeases) {
        // Leases never released end on the node by themselves; forget them.
        std::erase_if(lease_expiry_, [&](const auto& kv) { return kv.second <= sent; });
      }
      lease_expiry_[result->lease] = result->lease_expiry;
    }
    return result;
  }

  FetchFuture Fetch(const FetchRequest& req) override { return FetchFuture::Ready(FetchNow(req)); }

  Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                              Nanos write_lease_ttl) override {
    return ReserveStaged(model, blocks, write_lease_ttl, /*stage=*/true);
  }

  Result<Reservation> ReserveUnstaged(const ModelId& model, std::span<const CommitBlock> blocks,
                                      Nanos write_lease_ttl) override {
    return ReserveStaged(model, blocks, write_lease_ttl, /*stage=*/false);
  }

  Result<Reservation> ReserveStaged(const ModelId& model, std::span<const CommitBlock> blocks,
                                    Nanos write_lease_ttl, bool stage) {
    v1::ReserveResponse resp;
    STRATA_RETURN_IF_ERROR(ReserveRpc(model, blocks, write_lease_ttl, &resp));
    // The caller writes into local staging; Publish ships it to the node.
    Staged staged;
    Reservation out;
    out.write_lease = resp.write_lease_id();
    out.expiry = SteadyClock().Now() + Nanos{resp.ttl_ms()} * kNanosPerMilli;
    for (int i = 0; i < resp.blocks_size(); ++i) {
      const v1::ReservedBlock& b = resp.blocks(i);
      ReservedBlock rb;
      if (b.state() == v1::RESERVED) {
        staged.ops.push_back({out.write_lease, b.location(), {}});
        staged.blocks.push_back(static_cast<size_t>(i));
        staged.sizes.push_back(blocks[static_cast<size_t>(i)].payload_bytes);
        if (stage) {
          auto& buf = staged.buffers.emplace_back(blocks[static_cast<size_t>(i)].payload_bytes);
          rb.buffer = std::span<std::byte>(buf);
        }
      } else {
        rb.state = b.state() == v1::ALREADY_PRESENT ? ReserveState::kAlreadyPresent
                                                    : ReserveState::kInFlight;
      }
      out.blocks.push_back(rb);
    }
    if (out.write_lease != 0) {
      staged.expiry = out.expiry;
      staged.ttl = Nanos{resp.ttl_ms()} * kNanosPerMilli;
      std::lock_guard lock(staged_mu_);
      // Reservations neither published nor aborted for one more lease TTL
      // past their expiry (the node dropped them then): their buffers go.
      const Nanos now = SteadyClock().Now();
      std::erase_if(staged_,
                    [&](const auto& kv) { return kv.second.expiry + kv.second.ttl <= now; });
      if (!staged_.emplace(out.write_lease, std::move(staged)).second) {
        // Never hand out a second reservation under a live one's id: its
        // buffers would be freed here while the caller writes into them.
        // (The node drops the new reservation at its expiry.)
        return Internal("the node granted write lease " + std::to_string(out.write_lease) +
                        " twice");
      }
    }
    return out;
  }

  Result<PublishResult> Publish(LeaseId write_lease, std::span<const uint64_t> checksums) override {
    std::optional<Staged> staged = TakeStaged(write_lease);
    if (!staged.has_value()) return NotFound("no reservation " + std::to_string(write_lease));
    if (staged->buffers.size() != staged->ops.size()) {
      (void)Abort(write_lease);
      return InvalidArgument("reservation " + std::to_string(write_lease) +
                             " has no staging: publish it with PublishFrom");
    }
    for (size_t i = 0; i < staged->ops.size(); ++i) {
      staged->ops[i].src = std::span<const std::byte>(staged->buffers[i]);
    }
    return WriteAndPublish(write_lease, staged->ops, checksums);
  }

  Result<PublishResult> PublishFrom(LeaseId write_lease,
                                    std::span<const std::span<const std::byte>> payloads,
                                    std::span<const uint64_t> checksums) override {
    std::optional<Staged> staged = TakeStaged(write_lease);
    if (!staged.has_value()) return NotFound("no reservation " + std::to_string(write_lease));
    for (size_t i = 0; i < staged->ops.size(); ++i) {
      const size_t b = staged->blocks[i];
      if (b >= payloads.size() || payloads[b].size() != staged->sizes[i]) {
        (void)Abort(write_lease);
        return InvalidArgument("publish of reservation " + std::to_string(write_lease) +
                               ": block " + std::to_string(b) + " needs " +
                               std::to_string(staged->sizes[i]) + " payload bytes");
      }
      staged->ops[i].src = payloads[b];
    }
    return WriteAndPublish(write_lease, staged->ops, checksums);
  }

  Result<PublishResult> Commit(const ModelId& model,
                               std::span<const CommitPayload> payloads) override {
    Result<std::vector<CommitBlock>> checked = CommitBlocksOf(payloads);
    if (!checked.ok()) return checked.status();
    const std::vector<CommitBlock>& blocks = *checked;
    v1::ReserveResponse resp;
    STRATA_RETURN_IF_ERROR(ReserveRpc(model, blocks, 0, &resp));
    if (resp.blocks_size() != static_cast<int>(payloads.size())) {
      return Internal("reserve answered for the wrong number of blocks");
    }
    if (resp.write_lease_id() == 0) {
      PublishResult nothing_to_do;
      nothing_to_do.blocks.assign(payloads.size(), Status::Ok());
      return nothing_to_do;
    }
    // Straight from the caller's bytes into the node's arena: no staging.
    std::vector<dataplane::DataPlaneClient::WriteOp> ops;
    std::vector<uint64_t> checksums(payloads.size(), 0);
    for (size_t i = 0; i < payloads.size(); ++i) {
      const v1::ReservedBlock& b = resp.blocks(static_cast<int>(i));
      if (b.state() != v1::RESERVED) continue;
      ops.push_back({resp.write_lease_id(), b.location(), payloads[i].bytes});
      checksums[i] = payloads[i].checksum;
    }
    return WriteAndPublish(resp.write_lease_id(), ops, checksums);
  }

  Status RenewLease(LeaseId lease, Nanos ttl) override {
    if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl must be in [0, 10m]");
    v1::RenewLeaseRequest req;
    req.set_lease_id(lease);
    req.set_ttl_ms(static_cast<uint32_t>(ttl / kNanosPerMilli));
    v1::RenewLeaseResponse resp;
    const Nanos sent = SteadyClock().Now();
    STRATA_RETURN_IF_ERROR(
        Call([&](grpc::ClientContext* c) { return stub_->RenewLease(c, req, &resp); },
             /*idempotent=*/true));
    const Nanos expiry = sent + Nanos{resp.ttl_ms()} * kNanosPerMilli;
    {
      std::lock_guard lock(staged_mu_);
      if (auto it = staged_.find(lease); it != staged_.end()) {
        it->second.expiry = expiry;
        it->second.ttl = Nanos{resp.ttl_ms()} * kNanosPerMilli;
      }
    }
    std::lock_guard lock(leases_mu_);
    if (auto it = lease_expiry_.find(lease); it != lease_expiry_.end()) it->second = expiry;
    return Status::Ok();
  }

  void Release(LeaseId lease) override {
    if (lease == 0) return;
    {
      // A released reservation is aborted by the node: its buffers go.
      std::lock_guard lock(staged_mu_);
      staged_.erase(lease);
    }
    {
      std::lock_guard lock(leases_mu_);
      lease_expiry_.erase(lease);
    }
    {
      std::lock_guard lock(release_mu_);
      // Past the cap the oldest are dropped: they still end at expiry.
      if (releases_.size() >= kMaxQueuedReleases) releases_.erase(releases_.begin());
      releases_.push_back(lease);
    }
    release_cv_.notify_one();
  }

  Status Abort(LeaseId lease) override {
    {
      std::lock_guard lock(staged_mu_);
      staged_.erase(lease);
    }
    {
      std::lock_guard lock(leases_mu_);
      lease_expiry_.erase(lease);
    }
    v1::AbortRequest req;
    req.set_lease_id(lease);
    v1::AbortResponse resp;
    return Call([&](grpc::ClientContext* c) { return stub_->Abort(c, req, &resp); },
                /*idempotent=*/true);
  }

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
      std::unique_lock lock(store_.dp_mu_);
      held_ = store_.dp_turn_cv_.wait_until(
          lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline)),
          [&] { return !store_.dp_taken_; });
      if (held_) store_.dp_taken_ = true;
    }
    ~DataPlaneTurn() {
      if (!held_) return;
      {
        std::lock_guard lock(store_.dp_mu_);
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

  std::optional<Staged> TakeStaged(LeaseId write_lease) {
    std::lock_guard lock(staged_mu_);
    auto it = staged_.find(write_lease);
    if (it == staged_.end()) return std::nullopt;
    std::optional<Staged> staged = std::move(it->second);
    staged_.erase(it);
    return staged;
  }

  // The release flusher: leases released and not carried by a match within
  // kReleaseDelay are ended with Abort calls, so an idle client never holds
  // blocks against eviction for a whole lease TTL.
  void FlushReleases() {
    constexpr auto kReleaseDelay = std::chrono::milliseconds(2);
    std::unique_lock lock(release_mu_);
    while (true) {
      release_cv_.wait(lock, [&] { return stopping_ || !releases_.empty(); });
      if (!stopping_) release_cv_.wait_for(lock, kReleaseDelay, [&] { return stopping_; });
      std::vector<LeaseId> batch;
      batch.swap(releases_);
      if (batch.empty() && stopping_) return;
      lock.unlock();
      // One Abort call per kMaxReleasesPerMatch leases; failures are not
      // retried (a node that is down took its leases with it, and an
      // unreachable one lets them expire).
      for (size_t i = 0; i < batch.size(); i += kMaxReleasesPerMatch) {
        v1::AbortRequest req;
        for (size_t j = i; j < std::min(batch.size(), i + kMaxReleasesPerMatch); ++j) {
          req.add_release_leases(batch[j]);
        }
        v1::AbortResponse resp;
        (void)Call([&](grpc::ClientContext* c) { return stub_->Abort(c, req, &resp); },
                   /*idempotent=*/true);
      }
      lock.lock();
    }
  }

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
  Status ConnectLocked(bool wait_for_node = false) {
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
      return Internal("the node now maps this token to namespace '" + resp.namespace_() +
                      "', not '" + ns_ + "'");
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

  // The data plane, reconnected first if a failure dropped it.
  Result<dataplane::DataPlaneClient*> DataPlaneLocked() {
    if (dp_ == nullptr || dp_instance_ != seen_instance_.load()) {
      dp_.reset();
      STRATA_RETURN_IF_ERROR(ConnectLocked());
    }
    return dp_.get();
  }

  // A transfer that failed because the node went away (or forgot our
  // session) drops the endpoint; the next call says Hello again.
  void MaybeDropLocked(const Status& st) {
    if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kUnauthenticated ||
        st.code() == StatusCode::kDeadlineExceeded) {
      dp_.reset();
    }
  }

  Status ReserveRpc(const ModelId& model, std::span<const CommitBlock> blocks, Nanos ttl,
                    v1::ReserveResponse* resp) {
    if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
      return InvalidArgument("reserve needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
    }
    const v1::ReserveRequest req = wire::EncodeReserveRequest(model, blocks, ttl);
    STRATA_RETURN_IF_ERROR(
        Call([&](grpc::ClientContext* c) { return stub_->Reserve(c, req, resp); },
             /*idempotent=*/false));
    seen_instance_.store(resp->instance_id());
    if (resp->blocks_size() != static_cast<int>(blocks.size())) {
      if (resp->write_lease_id() != 0) (void)Abort(resp->write_lease_id());
      return Internal("reserve answered for the wrong number of blocks");
    }
    for (const v1::ReservedBlock& b : resp->blocks()) {
      if (b.state() != v1::RESERVED && b.state() != v1::ALREADY_PRESENT &&
          b.state() != v1::IN_FLIGHT) {
        if (resp->write_lease_id() != 0) (void)Abort(resp->write_lease_id());
        return Internal("reserve answered an unknown block state");
      }
      // Staging and publishing hang off the write lease: without one a
      // reserved block could be neither written nor published.
      if (b.state() == v1::RESERVED && resp->write_lease_id() == 0) {
        return Internal("reserve answered a block reserved under no write lease");
      }
    }
    return Status::Ok();
  }

  // Ships the bytes, then publishes; on any failure the reservation is
  // aborted so nothing partial can ever become visible.
  Result<PublishResult> WriteAndPublish(LeaseId lease,
                                        std::span<const dataplane::DataPlaneClient::WriteOp> ops,
                                        std::span<const uint64_t> checksums) {
    Status written;
    const Nanos deadline = Deadline();
    if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
      written = DataPlaneBusy();
    } else {
      Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
      written = dp.ok() ? (*dp)->Write(ops, deadline) : dp.status();
      if (!written.ok()) MaybeDropLocked(written);
    }
    if (!written.ok()) {
      (void)Abort(lease);
      return written;
    }
    v1::PublishRequest req;
    req.set_write_lease_id(lease);
    for (uint64_t c : checksums) req.add_checksums(c);
    v1::PublishResponse resp;
    Status st = Call([&](grpc::ClientContext* c) { return stub_->Publish(c, req, &resp); },
                     /*idempotent=*/false);
    if (!st.ok()) {
      (void)Abort(lease);
      return st;
    }
    return wire::DecodePublishResponse(resp);
  }

  bool LeaseEnded(LeaseId lease) {
    std::lock_guard lock(leases_mu_);
    auto it = lease_expiry_.find(lease);
    return it != lease_expiry_.end() && SteadyClock().Now() >= it->second;
  }

  FetchOutcome FetchNow(const FetchRequest& req) {
    FetchOutcome out;
    bool want_swa = false;
    out.status = CheckFetchRequest(req, &want_swa);
    if (!out.status.ok()) return out;
    const MatchResult& match = *req.match;
    const size_t n = req.block_buffers.size();
    if (n == 0 && !want_swa) return out;
    const Nanos deadline = Deadline();  // the transfer's, from the call's start

    // Locations are only good under a lease: take one if the match did not.
    const MatchResult* leased = &match;
    std::optional<MatchResult> own;
    if (match.lease == 0) {
      std::vector<ChainKey> keys;
      for (size_t b = 0; b < n; ++b) keys.push_back(match.blocks[b].key);
      MatchKeysRequest again;
      again.model_id = match.model_id;
      again.root = match.prefix_key;
      again.keys = keys;
      again.block_tokens = match.block_tokens == 0 ? 1 : match.block_tokens;
      again.want_swa = want_swa;
      again.take_lease = true;
      Result<MatchResult> r = MatchKeys(again);
      if (!r.ok()) {
        out.status = r.status();
        return out;
      }
      own = std::move(r).value();
      leased = &*own;
    }
    bool mapped = false;
    Status connected;
    if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
      connected = DataPlaneBusy();
    } else {
      Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
      connected = dp.status();
      if (dp.ok() && (*dp)->MappedRegion() != nullptr) {
        mapped = true;
        FetchMapped((*dp)->MappedRegion(), match, *leased, req, n, want_swa, out);
      }
    }
    // No data plane: failed once, not asked for again (each try says Hello).
    if (!connected.ok()) {
      out.status = connected;
    } else if (!mapped) {
      FetchInto(req, match, *leased, n, want_swa, deadline, out);
    }
    if (own.has_value() && own->lease != 0) (void)Abort(own->lease);
    return out;
  }

  // The node's arena is mapped into this process (UCX shared memory): each
  // layer group is copied and hashed in one pass, as the in-process store
  // does, layer group by layer group across blocks. Bytes that changed
  // under us (a lease that ran out) fail their checksum and are not served.
  // How many of the first n blocks of `match` the lease covers: in order,
  // the same entries, and in DRAM (only DRAM has a readable location).
  static size_t LeasedPrefix(const MatchResult& match, const MatchResult& leased, size_t n) {
    size_t i = 0;
    while (i < n && i < leased.blocks.size() && leased.blocks[i].tier == Tier::kDram &&
           leased.blocks[i].key == match.blocks[i].key &&
           leased.blocks[i].checksum == match.blocks[i].checksum &&
           leased.blocks[i].payload_bytes == match.blocks[i].payload_bytes) {
      ++i;
    }
    return i;
  }
  static bool SwaLeased(const MatchResult& match, const MatchResult& leased) {
    return leased.swa.has_value() && leased.swa->entry.tier == Tier::kDram &&
           leased.swa->entry.key == match.swa->entry.key &&
           leased.swa->entry.checksum == match.swa->entry.checksum &&
           leased.swa->entry.payload_bytes == match.swa->entry.payload_bytes;
  }

  void FetchMapped(const std::byte* base, const MatchResult& match, const MatchResult& leased,
                   const FetchRequest& req, size_t n, bool want_swa, FetchOutcome& out) {
    Status status;
    if (LeaseEnded(leased.lease)) {
      out.status = Status(StatusCode::kLeaseExpired,
                          "lease " + std::to_string(leased.lease) + " has expired");
      return;
    }
    auto source = [&](const BlockMatch& b) -> const std::byte* {
      if (b.location > region_bytes_ || b.payload_bytes > region_bytes_ - b.location)
        return nullptr;
      return base + b.location;
    };
    size_t usable = LeasedPrefix(match, leased, n);
    if (usable < n) status = NotFound("block " + std::to_string(usable) + " is no longer stored");
    auto cut = [&](size_t b, const Status& why) {
      if (b < usable) {
        usable = b;
        status = Status(why.code(), "block " + std::to_string(b) + ": " + why.message());
      }
    };
    // Headers: each must hash to its entry checksum.
    std::vector<PayloadHeader> headers(usable);
    for (size_t b = 0; b < usable; ++b) {
      const BlockMatch& bm = leased.blocks[b];
      const std::byte* src = source(bm);
      std::byte* dst = req.block_buffers[b].data();
      if (src == nullptr || bm.payload_bytes < 32) {
        cut(b, Internal("location outside the node's arena"));
        break;
      }
      uint32_t hb = 0;
      std::memcpy(&hb, src + 20, sizeof(hb));  // header bytes H, see layout.h
      if (hb > bm.payload_bytes || CopyAndChecksum(dst, src, hb) != bm.checksum) {
        cut(b, ChecksumMismatch("header fails the entry checksum"));
        break;
      }
      Result<PayloadHeader> h = ParsePayloadHeader({dst, bm.payload_bytes});
      if (!h.ok() || h->header_bytes != hb) {
        cut(b, ChecksumMismatch("malformed header"));
        break;
      }
      headers[b] = std::move(h).value();
      out.bytes += hb;
    }
    // The SWA state before the bodies (see VerifySwa), when the prefix it
    // belongs to still stands.
    const bool swa_ok = want_swa && SwaLeased(match, leased);
    bool swa_verified = false;
    if (swa_ok && usable >= leased.swa->boundary_blocks) {
      const BlockMatch& e = leased.swa->entry;
      PayloadCheck swa{req.swa_buffer.first(e.payload_bytes), e.checksum, {}, {}};
      if (const std::byte* src = source(e); src != nullptr) {
        std::memcpy(swa.bytes.data(), src, e.payload_bytes);
        swa_verified = VerifySwa(req, swa, status);
      } else if (status.ok()) {
        status = Internal("the SWA state's location lies outside the node's arena");
      }
    }
    std::vector<VerifiedCopy> copies(usable);
    for (size_t b = 0; b < usable; ++b) {
      copies[b] = {source(leased.blocks[b]), req.block_buffers[b].data(), &headers[b]};
    }
    std::optional<CopyFailure> failure;
    const size_t arrived =
        CopyVerifiedBodies(copies, req.on_event, &out.bytes, &failure, nullptr, &copy_pool_);
    if (failure.has_value()) {
      cut(arrived, ChecksumMismatch("layer group " + std::to_string(failure->group) +
                                    " fails its checksum"));
    }
    out.blocks_ready = static_cast<uint32_t>(usable);
    FinishSwa(leased, want_swa, swa_ok, swa_verified, usable, status, out);
  }

  // Verifies the SWA state's bytes as they landed and reports it ready: a
  // worker needs it, with layer group 0, before it runs layer 0, so it is
  // read and reported before the bodies, not behind them. It is only good
  // with the prefix under it; a body that fails later, short of its
  // boundary, voids it (FinishSwa).
  static bool VerifySwa(const FetchRequest& req, PayloadCheck& p, Status& status) {
    Status st = VerifyHeader(p);
    for (size_t g = 0; st.ok() && g < p.header->groups.size(); ++g) st = VerifyGroup(p, g);
    if (!st.ok()) {
      if (status.ok()) status = Status(st.code(), "SWA state: " + st.message());
      return false;
    }
    if (req.on_event) req.on_event({FetchEvent::Type::kSwaReady, 0, 0});
    return true;
  }

  // The SWA state is served when it verified and the prefix it belongs to
  // arrived whole; sets the outcome's final status.
  static void FinishSwa(const MatchResult& leased, bool want_swa, bool swa_ok, bool swa_verified,
                        size_t usable, Status& status, FetchOutcome& out) {
    if (swa_verified && usable >= leased.swa->boundary_blocks) {
      out.swa_ready = true;
      out.bytes += leased.swa->entry.payload_bytes;
    } else if (want_swa && !swa_ok && status.ok()) {
      status = NotFound("SWA state is no longer stored");
    }
    out.status = status;
  }

  // Reads under `leased` (locations) what `match` describes, layer group
  // by layer group when the payloads are laid out as the built-in layouts
  // are, verifying each piece as it lands.
  void FetchInto(const FetchRequest& req, const MatchResult& match, const MatchResult& leased,
                 size_t n, bool want_swa, Nanos deadline, FetchOutcome& out) {
    // Blocks the lease really covers, in order and with the same identity.
    const size_t covered = LeasedPrefix(match, leased, n);
    Status status;
    if (covered < n) status = NotFound("block " + std::to_string(covered) + " is no longer stored");
    const bool swa_ok = want_swa && SwaLeased(match, leased);

    std::vector<PayloadCheck> checks(covered + (swa_ok ? 1 : 0));
    using ReadOp = dataplane::DataPlaneClient::ReadOp;
    using Range = dataplane::DataPlaneClient::Range;
    std::vector<ReadOp> ops;
    // An op reads piece `group` of payloads members[first, first + count).
    struct Piece {
      size_t first;
      size_t count;
      int group;  // -1: the whole payload (header and all groups)
    };
    std::vector<Piece> pieces;
    std::vector<size_t> members;  // payload indexes, grouped by piece
    for (size_t b = 0; b < covered; ++b) {
      const BlockMatch& bm = leased.blocks[b];
      checks[b] = {req.block_buffers[b].first(bm.payload_bytes), bm.checksum, {}, {}};
    }
    // The header and group table of a built-in layout sit at fixed places,
    // so pieces can be planned before any byte arrives: layer group g of
    // every block is requested before group g + 1 of any.
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> plan(covered);
    size_t max_groups = 0;
    for (size_t b = 0; b < covered; ++b) {
      const BlockMatch& bm = leased.blocks[b];
      static const Layout kGlobalKv = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
      const Layout& layout = kGlobalKv;
      if (bm.layout_id == layout.id && layout.PayloadBytes() == bm.payload_bytes) {
        uint64_t at = layout.HeaderBytes();
        for (size_t g = 0; g < layout.groups.size(); ++g) {
          // Group 0 carries the header with it.
          const uint64_t start = g == 0 ? 0 : at;
          plan[b].push_back({start, at + layout.groups[g].bytes - start});
          at += layout.groups[g].bytes;
        }
      } else {
        plan[b].push_back({0, bm.payload_bytes});
      }
      max_groups = std::max(max_groups, plan[b].size());
    }
    // The same piece of several blocks travels as one op (one request and
    // one reply over TCP, where a message per ~76 KB piece costs a third of
    // the bandwidth).
    std::vector<Range> ranges;
    for (size_t g = 0; g < max_groups; ++g) {
      Piece piece{members.size(), 0, 0};
      for (size_t b = 0; b <= covered; ++b) {
        const bool more = b < covered && g < plan[b].size();
        const int kind = more && plan[b].size() > 1 ? static_cast<int>(g) : -1;
        if (piece.count > 0 && (!more || kind != piece.group ||
                                piece.count == dataplane::DataPlaneClient::kMaxRangesPerRead)) {
          pieces.push_back(piece);
          piece = {members.size(), 0, 0};
        }
        if (!more) continue;
        const auto [off, len] = plan[b][g];
        ranges.push_back({leased.blocks[b].location + off, checks[b].bytes.subspan(off, len)});
        members.push_back(b);
        piece.group = kind;
        ++piece.count;
      }
    }
    // The SWA state goes first (see VerifySwa).
    if (swa_ok) {
      const BlockMatch& e = leased.swa->entry;
      checks[covered] = {req.swa_buffer.first(e.payload_bytes), e.checksum, {}, {}};
      ops.push_back({leased.lease, e.location, checks[covered].bytes});
      members.push_back(covered);
      pieces.insert(pieces.begin(), Piece{members.size() - 1, 1, -1});
    }
    for (size_t i = swa_ok ? 1 : 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      const Range& head = ranges[piece.first];
      ops.push_back({leased.lease, head.offset, head.dest,
                     std::span<const Range>(ranges).subspan(piece.first + 1, piece.count - 1)});
    }

    // Verification as pieces land. A group that lands before its block's
    // header waits for it.
    std::vector<std::vector<bool>> landed(covered);
    std::vector<std::vector<bool>> verified(covered);
    for (size_t b = 0; b < covered; ++b) {
      landed[b].assign(plan[b].size(), false);
      verified[b].assign(plan[b].size(), false);
    }
    size_t usable = covered;  // blocks [0, usable) have not failed
    auto cut = [&](size_t b, const Status& why) {
      if (b < usable) {
        usable = b;
        status = why;
      }
    };
    size_t groups_done = 0;  // layer groups announced for the whole prefix
    auto announce = [&] {
      while (req.on_event && usable > 0 && groups_done < max_groups) {
        for (size_t b = 0; b < usable; ++b) {
          if (groups_done < verified[b].size() && !verified[b][groups_done]) return;
        }
        req.on_event({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(usable),
                      static_cast<uint32_t>(groups_done)});
        ++groups_done;
      }
    };
    auto fail = [&](size_t b, const Status& st) {
      cut(b, Status(st.code(), "block " + std::to_string(b) + ": " + st.message()));
    };
    // Verifies whatever of block b has landed. The header rides in piece 0;
    // pieces that land before it wait.
    auto verify_block = [&](size_t b) {
      PayloadCheck& p = checks[b];
      if (b >= usable || !landed[b][0]) return;
      if (!p.header.has_value()) {
        if (Status st = VerifyHeader(p); !st.ok()) return fail(b, st);
        if (plan[b].size() > 1 && p.header->groups.size() != plan[b].size()) {
          return fail(b, ChecksumMismatch("unexpected group table"));
        }
      }
      for (size_t g = 0; g < plan[b].size(); ++g) {
        if (!landed[b][g] || verified[b][g]) continue;
        // A whole-payload piece covers every group of the header's table.
        const size_t first = plan[b].size() == 1 ? 0 : g;
        const size_t last = plan[b].size() == 1 ? p.header->groups.size() : g + 1;
        for (size_t gg = first; gg < last; ++gg) {
          if (Status st = VerifyGroup(p, gg); !st.ok()) return fail(b, st);
          if (req.on_event) {
            req.on_event({FetchEvent::Type::kGroupReady, static_cast<uint32_t>(b),
                          static_cast<uint32_t>(gg)});
          }
        }
        verified[b][g] = true;
      }
    };
    bool swa_verified = false;
    auto on_done = [&](size_t i, const Status& st) {
      const Piece& piece = pieces[i];
      const std::span<const size_t> payloads(members.data() + piece.first, piece.count);
      if (payloads[0] == covered && swa_ok) {
        if (!st.ok()) {
          if (status.ok()) status = st;
        } else if (usable >= leased.swa->boundary_blocks) {
          swa_verified = VerifySwa(req, checks[covered], status);
        }
        return;
      }
      if (!st.ok()) {
        cut(payloads[0], st);
        return;
      }
      for (size_t b : payloads) {
        landed[b][piece.group < 0 ? 0 : static_cast<size_t>(piece.group)] = true;
        verify_block(b);
      }
      announce();
    };
    Status transfer;
    if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
      transfer = DataPlaneBusy();
    } else {
      Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
      if (dp.ok() && (*dp)->mode() == dataplane::Mode::kRma && LeaseEnded(leased.lease)) {
        dp = Status(StatusCode::kLeaseExpired,
                    "lease " + std::to_string(leased.lease) + " has expired");
        usable = 0;
      }
      transfer = dp.ok() ? (*dp)->Read(ops, on_done, deadline) : dp.status();
      if (!transfer.ok()) MaybeDropLocked(transfer);
    }
    if (!transfer.ok() && status.ok()) status = transfer;
    if (!transfer.ok() && usable == covered) {
      // No piece reported the failure (e.g. no endpoint at all).
      for (size_t b = 0; b < covered; ++b) {
        if (!std::all_of(verified[b].begin(), verified[b].end(), [](bool v) { return v; })) {
          usable = std::min(usable, b);
          break;
        }
      }
    }
    for (size_t b = 0; b < usable; ++b) {
      if (!std::all_of(verified[b].begin(), verified[b].end(), [](bool v) { return v; })) {
        cut(b, Internal("block " + std::to_string(b) + " did not complete"));
        break;
      }
    }
    announce();
    for (size_t b = 0; b < usable; ++b) {
      out.bytes += checks[b].bytes.size();
      if (req.on_event) req.on_event({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(b), 0});
    }
    out.blocks_ready = static_cast<uint32_t>(usable);
    FinishSwa(leased, want_swa, swa_ok, swa_verified, usable, status, out);
  }

  std::unique_ptr<v1::CacheStore::Stub> stub_;
  const ClientOptions options_;
  const dataplane::Mode mode_;
  const std::string bearer_;
  CopyPool copy_pool_;  // FetchMapped's verified copies

  // The caller's namespace (it feeds key[0]); written once by Connect.
  std::string ns_;

  // The data plane: dp_taken_ (under dp_mu_) says whose turn it is
  // (DataPlaneTurn); only the turn's holder touches what follows.
  std::mutex dp_mu_;
  std::condition_variable dp_turn_cv_;
  bool dp_taken_ = false;
  std::unique_ptr<dataplane::DataPlaneClient> dp_;
  uint64_t region_bytes_ = 0;  // of the node's arena

  uint64_t dp_instance_ = 0;                // the node process dp_ talks to
  std::atomic<uint64_t> seen_instance_{0};  // the one that answered last

  std::mutex staged_mu_;
  std::unordered_map<LeaseId, Staged> staged_;

  // Read leases we hold and when they end: RMA reads bypass the node, so
  // the client refuses to read under a lease it knows has ended.
  std::mutex leases_mu_;
  std::unordered_map<LeaseId, Nanos> lease_expiry_;

  // Released read leases not yet sent (see Release and FlushReleases).
  static constexpr size_t kMaxQueuedReleases = 4096;
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  std::vector<LeaseId> releases_;
  bool stopping_ = false;
  std::thread release_flusher_;  // last: starts once everything above exists
};

}  // namespace

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

// The client's side of the data plane: one UCX context, worker and endpoint
// to one node, progressed on the calling thread.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "dataplane/data_plane.h"
#include "dataplane/ucx_common.h"

namespace strata::dataplane {

using internal::kAmPing;
using internal::kAmPong;
using internal::kAmReadReply;
using internal::kAmReadRequest;
using internal::kAmReadvRequest;
using internal::kAmWriteAck;
using internal::kAmWriteRequest;
using internal::kWireVersion;
using internal::ReadRange;
using internal::ReplyHeader;
using internal::RequestHeader;
using internal::StatusFromUcs;
using internal::SteadyNow;

// Callers on any thread drive the worker, one at a time (Impl::mu).
constexpr ucs_thread_mode_t kThreadMode = UCS_THREAD_MODE_SERIALIZED;
// What a call whose bytes have all arrived spends on handing over its
// acknowledgements (normally microseconds): until its deadline, but at
// least kMinAckFlush and at most kMaxAckFlush.
constexpr Nanos kMinAckFlush = kNanosPerSecond / 10;
constexpr Nanos kMaxAckFlush = kNanosPerSecond;

struct DataPlaneClient::Impl {
  struct Call;
  // One op of the current call. UCX callbacks point at it, so it lives in its
  // Call until every request referencing it has finished, or until the
  // worker holding those requests is destroyed (see Run).
  struct Op {
    Call* call = nullptr;
    size_t index = 0;
    std::byte* dest = nullptr;  // reads: the caller's buffer
    uint64_t length = 0;
    // Reads of several ranges: the caller's buffers and what the node is
    // asked for (sent with the request; alive until the send finishes).
    std::vector<ucp_dt_iov_t> iov;
    std::vector<ReadRange> ranges;
    size_t gets_left = 0;  // RMA: gets not finished yet
    RequestHeader header;  // sent to the node; alive until the send finishes
    bool done = false;
    Status status;
  };
  struct Call {
    Impl* impl = nullptr;
    std::vector<Op> ops;
    std::vector<size_t> completed;  // indexes not yet reported to the caller
    size_t done = 0;
    size_t outstanding = 0;  // UCX requests not finished (they point into ops)
    // A reply came by rendezvous: the node's send (and the pin on what it
    // reads) ends only when our acknowledgement reaches it.
    bool rendezvous = false;
  };

  ServerInfo server;
  ClientOptions options;
  // The worker is dropped when UCX does not hand back a failed call's
  // requests in time (ucx->worker is then null until the next call).
  std::unique_ptr<internal::UcxWorker> ucx;
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  bool peer_error_handling = false;
  Mode mode = Mode::kActiveMessage;
  // Every lane is TCP: reads gather their ranges into one eager reply.
  bool tcp_only = false;
  std::vector<std::string> lane_transports;
  Status ep_failure;  // set by the endpoint's error handler
  uint64_t next_op_id = 1;
  std::unordered_map<uint64_t, Op*> awaiting_reply;  // op id -> op
  // Guards everything above; every public call holds it from start to end.
  mutable std::mutex mu;

  // No request points into a Call here: Run returns only once UCX has
  // handed back every request of its call, or after destroying the worker.
  ~Impl() {
    CloseEndpoint(/*cancel=*/!ep_failure.ok(), SteadyNow() + internal::ClientTeardownGrace());
    if (ucx != nullptr && ucx->worker != nullptr) {
      ucp_worker_destroy(ucx->worker);
      ucx->worker = nullptr;
    }
  }

  // ---- completion plumbing (all on the calling thread, inside progress) ----

  void Complete(Op* op, Status status) {
    if (op->done) return;
    op->done = true;
    op->status = std::move(status);
    awaiting_reply.erase(op->header.op_id);
    op->call->completed.push_back(op->index);
    ++op->call->done;
  }

  static void RequestFinished(Op* op, ucs_status_t status, const char* what) {
    --op->call->outstanding;
    if (status != UCS_OK) {
      op->call->impl->Complete(op, StatusFromUcs(status, what));
    }
  }

  static void OnRequestSent(void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    RequestFinished(static_cast<Op*>(user_data), status, "sending request to node");
  }

  static void OnGetDone(void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* op = static_cast<Op*>(user_data);
    RequestFinished(op, status, "RMA read from node");
    if (--op->gets_left == 0 && status == UCS_OK) op->call->impl->Complete(op, Status::Ok());
  }

  static void OnReplyDataReceived(void* request, ucs_status_t status, size_t /*length*/,
                                  void* user_data) {
    ucp_request_free(request);
    auto* op = static_cast<Op*>(user_data);
    RequestFinished(op, status, "receiving read reply");
    if (status == UCS_OK) op->call->impl->Complete(op, Status::Ok());
  }

  static void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    Status failure = StatusFromUcs(status, "node endpoint failed");
    if (failure.code() != StatusCode::kUnavailable) {
      failure = Unavailable(failure.message());
    }
    self->ep_failure = std::move(failure);
  }

  // Finds the op a reply answers; nullptr for late replies to abandoned ops.
  Op* ReplyOp(const void* header, size_t header_length, ReplyHeader* reply) {
    if (header_length != sizeof(ReplyHeader)) return nullptr;
    std::memcpy(reply, header, sizeof(*reply));
    if (reply->version != kWireVersion) return nullptr;
    auto it = awaiting_reply.find(reply->op_id);
    return it == awaiting_reply.end() ? nullptr : it->second;
  }

  static Status ErrorFromReply(const ReplyHeader& reply, const void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    std::string message = "node: ";
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && data != nullptr) {
      message.append(static_cast<const char*>(data), std::min(length, internal::kMaxErrorMessage));
    }
    return {internal::StatusCodeFromWire(reply.code), std::move(message)};
  }

  // Pong and write acks: a status, maybe an error message.
  static ucs_status_t OnStatusReply(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    ReplyHeader reply;
    Op* op = self->ReplyOp(header, header_length, &reply);
    if (op == nullptr) return UCS_OK;
    if (reply.code == static_cast<uint32_t>(StatusCode::kOk)) {
      self->Complete(op, Status::Ok());
    } else {
      self->Complete(op, ErrorFromReply(reply, data, length, param));
    }
    return UCS_OK;
  }

  static ucs_status_t OnReadReply(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    ReplyHeader reply;
    Op* op = self->ReplyOp(header, header_length, &reply);
    if (op == nullptr) return UCS_OK;  // drops rendezvous data of abandoned ops
    if (reply.code != static_cast<uint32_t>(StatusCode::kOk)) {
      self->Complete(op, ErrorFromReply(reply, data, length, param));
      return UCS_OK;
    }
    if (length != op->length) {
      self->Complete(op, Internal("node replied with " + std::to_string(length) +
                                  " bytes, asked for " + std::to_string(op->length)));
      return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      if (op->iov.empty()) {
        if (length > 0) std::memcpy(op->dest, data, length);
      } else {
        const auto* from = static_cast<const std::byte*>(data);
        for (const ucp_dt_iov_t& to : op->iov) {
          if (to.length > 0) std::memcpy(to.buffer, from, to.length);
          from += to.length;
        }
      }
      self->Complete(op, Status::Ok());
      return UCS_OK;
    }
    // Rendezvous: UCX moves the bytes straight into the caller's buffers.
    self->awaiting_reply.erase(op->header.op_id);
    op->call->rendezvous = true;
    ucp_request_param_t param_out{};
    param_out.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param_out.cb.recv_am = &OnReplyDataReceived;
    param_out.user_data = op;
    void* into = op->dest;
    size_t count = length;
    if (!op->iov.empty()) {
      param_out.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      param_out.datatype = ucp_dt_make_iov();
      into = op->iov.data();
      count = op->iov.size();
    }
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->ucx->worker, data, into, count, &param_out);
    if (r == nullptr) {
      self->Complete(op, Status::Ok());
    } else if (UCS_PTR_IS_ERR(r)) {
      self->Complete(op, StatusFromUcs(UCS_PTR_STATUS(r), "receiving read reply"));
    } else {
      ++op->call->outstanding;
    }
    return UCS_OK;
  }

  // ---- worker ----

  // Makes a worker with the reply handlers; Connect's, or a fresh one after
  // DestroyWorker.
  Status OpenWorker() {
    if (ucx->worker == nullptr) {
      Result<ucp_worker_h> worker = internal::CreateWorker(ucx->context, kThreadMode);
      if (!worker.ok()) return worker.status();
      ucx->worker = *worker;
    }
    Status st = internal::SetAmHandler(ucx->worker, kAmPong, &Impl::OnStatusReply, this);
    if (st.ok()) st = internal::SetAmHandler(ucx->worker, kAmReadReply, &Impl::OnReadReply, this);
    if (st.ok()) st = internal::SetAmHandler(ucx->worker, kAmWriteAck, &Impl::OnStatusReply, this);
    if (!st.ok()) {
      ucp_worker_destroy(ucx->worker);  // nothing on it yet
      ucx->worker = nullptr;
    }
    return st;
  }

  // Destroys the worker with whatever UCX still holds on it, the endpoint
  // included. Callbacks of its requests may run in here (with
  // UCS_ERR_CANCELED), so the Ops they point at must be alive; UCX 1.13
  // mostly just drops them (a "not returned to mpool" warning, a request's
  // worth of memory lost per teardown). Afterwards this process's UCX
  // touches no caller buffer; a node reading a write's source over shared
  // memory (cma) is out of its hands (see data_plane.h). The next call
  // makes a fresh worker.
  void DestroyWorker() {
    if (ucx->worker == nullptr) return;
    // The key comes from the worker's memory pool: it goes first.
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    rkey = nullptr;
    ep = nullptr;  // ucp_worker_destroy destroys it
    ucp_worker_destroy(ucx->worker);
    ucx->worker = nullptr;
    internal::CountClientWorkerTeardown();
  }

  // ---- endpoint ----

  Status OpenEndpoint() {
    bool same_host = !server.host_id.empty() && server.host_id == HostId();
    bool local_shm = false;
    for (const std::string& t : internal::ContextTransports(ucx->context)) {
      local_shm = local_shm || internal::IsSharedMemoryTransport(t);
    }
    // UCX 1.13's shared-memory transports refuse peer error handling.
    peer_error_handling = !(same_host && local_shm);
    ucs_status_t st = CreateEndpoint();
    if (st == UCS_ERR_UNREACHABLE && peer_error_handling && local_shm) {
      // No host id, but the node is only reachable over shared memory.
      peer_error_handling = false;
      st = CreateEndpoint();
    }
    if (st != UCS_OK) {
      ep = nullptr;
      return StatusFromUcs(st, "connecting to the node's worker address");
    }
    ep_failure = Status::Ok();
    lane_transports.clear();
    bool rdma = false;
    tcp_only = true;
    for (const internal::EpLane& lane : internal::EpLanes(ep)) {
      lane_transports.push_back(lane.transport);
      rdma = rdma || internal::IsRdmaTransport(lane.transport);
      tcp_only = tcp_only && internal::IsTcpTransport(lane.transport);
    }
    tcp_only = tcp_only && !lane_transports.empty();
    if (options.mode != Mode::kActiveMessage && !server.packed_rkey.empty()) {
      st = ucp_ep_rkey_unpack(ep, server.packed_rkey.data(), &rkey);
      if (st != UCS_OK) {
        rkey = nullptr;
        return StatusFromUcs(st, "unpacking the node's rkey");
      }
    }
    Mode wanted = options.mode;
    void* mapped = nullptr;
    const bool native_rma =
        rkey != nullptr && (rdma || ucp_rkey_ptr(rkey, server.region_base, &mapped) == UCS_OK);
    const bool bounded = server.region_bytes > 0;
    if (wanted == Mode::kAuto) {
      wanted = native_rma && bounded ? Mode::kRma : Mode::kActiveMessage;
    }
    if (wanted == Mode::kRma && rkey == nullptr) {
      return PermissionDenied("node allows active-message reads only (no rkey)");
    }
    if (wanted == Mode::kRma && !bounded) {
      return InvalidArgument("RMA requested without the node's region size");
    }
    if (wanted == Mode::kRma && !native_rma) {
      // UCX would emulate RMA with active messages through the node's
      // worker: slower than asking for active messages, and UCX 1.13
      // aborts the node's process when such a client dies mid-transfer.
      return InvalidArgument(
          "RMA requested, but no transport to the node has native RMA (shared memory on a "
          "UCX-allocated region, or RDMA); use active messages");
    }
    if (wanted == Mode::kActiveMessage && rkey != nullptr) {
      ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
    mode = wanted;
    return Status::Ok();
  }

  ucs_status_t CreateEndpoint() {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(server.worker_address.data());
    params.err_mode = peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (peer_error_handling) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_handler.cb = &OnEpError;
      params.err_handler.arg = this;
    }
    return ucp_ep_create(ucx->worker, &params, &ep);
  }

  // Closes the endpoint, progressing until `deadline` at most. `cancel`:
  // give up on what is outstanding on it (a forced close). UCX allows that
  // only with peer error handling (elsewhere ucp_ep_close_nbx refuses it with
  // UCS_ERR_INVALID_PARAM and the endpoint would live on); without, the close
  // flushes.
  void CloseEndpoint(bool cancel, Nanos deadline) {
    if (ucx == nullptr || ucx->worker == nullptr || ep == nullptr) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = cancel && peer_error_handling ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
    ep = nullptr;
    (void)internal::WaitRequest(ucx->worker, r, deadline, "closing endpoint");
    // Only now: RMA gets still queued on the endpoint use the key until the
    // close has flushed or purged them.
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    rkey = nullptr;
  }

  // ---- calls ----

  // Runs one call: `issue(op)` starts each op; progress until every op is
  // done and UCX holds no request into the call, or the deadline passes or
  // the endpoint fails. Every op is reported to `on_done` once. Never
  // returns while UCX may still touch the call's buffers: after a failure,
  // requests UCX has not handed back within the teardown grace go with the
  // whole worker (the next call makes a fresh one).
  Status Run(std::unique_ptr<Call> call, const std::function<void(Op*)>& issue,
             const std::function<void(size_t, const Status&)>& on_done, Nanos deadline) {
    Status first_error;
    auto report = [&](size_t i) {
      const Status& s = call->ops[i].status;
      if (!s.ok() && first_error.ok()) first_error = s;
      if (on_done) on_done(i, s);
    };
    auto fail_all = [&](const Status& why) {
      for (Op& op : call->ops) Complete(&op, why);
      for (size_t i : call->completed) report(i);
      return first_error;
    };
    if (ucx->worker == nullptr) {
      Status st = OpenWorker();
      if (!st.ok()) return fail_all(st);
    }
    if (ep == nullptr) {
      Status st = OpenEndpoint();
      if (!st.ok()) {
        CloseEndpoint(/*cancel=*/true, SteadyNow() + internal::ClientTeardownGrace());
        return fail_all(st);
      }
      // A new endpoint introduces itself, as Connect's did (the node may
      // have restarted, and it watches this process through the hello).
      // One that could not goes, so that the next call tries again.
      st = Ping(deadline);
      if (!st.ok()) {
        CloseEndpoint(/*cancel=*/true, SteadyNow() + internal::ClientTeardownGrace());
        return fail_all(st);
      }
    }
    for (Op& op : call->ops) {
      if (!ep_failure.ok()) break;
      issue(&op);
    }
    while (true) {
      for (size_t i : call->completed) report(i);
      call->completed.clear();
      if (call->done == call->ops.size() && call->outstanding == 0) {
        if (call->rendezvous) FlushAcks(deadline);
        return first_error;
      }
      if (!ep_failure.ok() || SteadyNow() > deadline) break;
      ucp_worker_progress(ucx->worker);
    }
    Status why = !ep_failure.ok() ? ep_failure
                                  : DeadlineExceeded("data plane transfer did not finish in time");
    // Ops still open fail with `why` (not with the UCS_ERR_CANCELED that
    // the teardown below may hand their requests back with); late replies
    // to them are dropped.
    for (Op& op : call->ops) Complete(&op, why);
    if (call->outstanding > 0 || !ep_failure.ok()) {
      // UCX still points into caller buffers: cancel everything on the
      // endpoint and give UCX a grace to hand the requests back.
      // Without peer error handling there is no forced close, and a close
      // would only flush: the endpoint stays open during the grace.
      const Nanos grace = SteadyNow() + internal::ClientTeardownGrace();
      if (peer_error_handling) CloseEndpoint(/*cancel=*/true, grace);
      while (call->outstanding > 0 && SteadyNow() < grace) ucp_worker_progress(ucx->worker);
      if (call->outstanding > 0) {
        // What UCX still holds may write into or read from the caller's
        // buffers once we return: it goes with the worker, while `call`
        // (which its callbacks point at) is still alive.
        DestroyWorker();
      } else {
        CloseEndpoint(/*cancel=*/true, grace);
      }
    }
    return fail_all(why);
  }

  // The acknowledgements of rendezvous replies may wait in UCX for room
  // toward the node (a full shared-memory FIFO), and progress reports
  // nothing about them: an idle client would keep the node's sends, and the
  // entries they pin, open until its next call. A flush of the endpoint
  // completes only once everything queued on it went out. The call itself
  // has succeeded by now (every byte arrived), so the flush is capped at
  // kMaxAckFlush: a node that takes nothing (its worker stalled) must not
  // hold a finished call until a long deadline. Acks still queued then go
  // out with this client's next call (until then the node's replies stay
  // open, as they would after any flush cut short). A flush that fails or
  // runs out of time changes nothing for this call (a failed endpoint
  // fails the next one).
  void FlushAcks(Nanos deadline) {
    if (ep == nullptr) return;
    ucp_request_param_t param{};
    const Nanos now = SteadyNow();
    const Nanos until = std::clamp(deadline, now + kMinAckFlush, now + kMaxAckFlush);
    (void)internal::WaitRequest(ucx->worker, ucp_ep_flush_nbx(ep, &param), until,
                                "flushing acknowledgements to the node");
  }

  std::unique_ptr<Call> NewCall(size_t n) {
    auto call = std::make_unique<Call>();
    call->impl = this;
    call->ops.resize(n);
    for (size_t i = 0; i < n; ++i) {
      call->ops[i].call = call.get();
      call->ops[i].index = i;
      call->ops[i].header.session = server.session;
      call->ops[i].header.op_id = next_op_id++;
    }
    return call;
  }

  // Sends op->header as active message `id` (with `data`), awaiting a reply.
  void SendRequest(Op* op, uint16_t id, const void* data, size_t length) {
    awaiting_reply[op->header.op_id] = op;
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &OnRequestSent;
    param.user_data = op;
    param.flags = UCP_AM_SEND_FLAG_REPLY |
                  (length >= internal::kRendezvousThreshold ? UCP_AM_SEND_FLAG_RNDV : 0);
    ucs_status_ptr_t r =
        ucp_am_send_nbx(ep, id, &op->header, sizeof(op->header), data, length, &param);
    if (UCS_PTR_IS_ERR(r)) {
      Complete(op, StatusFromUcs(UCS_PTR_STATUS(r), "sending request to node"));
    } else if (r != nullptr) {
      ++op->call->outstanding;
    }
  }

  static Status CheckRange(uint64_t offset, uint64_t length) {
    if (offset > UINT64_MAX - length) return InvalidArgument("offset + length overflows");
    return Status::Ok();
  }

  // The node checks what it is asked for; a one-sided read is checked here.
  Status CheckReadRange(uint64_t offset, uint64_t length) const {
    STRATA_RETURN_IF_ERROR(CheckRange(offset, length));
    if (mode == Mode::kRma && offset + length > server.region_bytes) {
      return InvalidArgument("read of [" + std::to_string(offset) + ", " +
                             std::to_string(offset + length) + ") past the node's region of " +
                             std::to_string(server.region_bytes) + " bytes");
    }
    return Status::Ok();
  }

  // The handshake: the node answers with its verdict (wire version,
  // draining) and, on this host, watches this process through the hello.
  Status Ping(Nanos deadline) {
    auto call = NewCall(1);
    const internal::PeerHello hello{internal::kPeerHelloMagic, static_cast<uint32_t>(getpid())};
    return Run(
        std::move(call), [&](Op* op) { SendRequest(op, kAmPing, &hello, sizeof(hello)); }, nullptr,
        deadline);
  }

  static Status CheckRangeCount(const ReadOp& r) {
    if (1 + r.more.size() <= kMaxRangesPerRead) return Status::Ok();
    return InvalidArgument("a read op has " + std::to_string(1 + r.more.size()) +
                           " ranges; the limit is " + std::to_string(kMaxRangesPerRead));
  }

  Status Read(std::span<const ReadOp> reads,
              const std::function<void(size_t, const Status&)>& on_done, Nanos deadline) {
    const bool gathered =
        std::any_of(reads.begin(), reads.end(), [](const ReadOp& r) { return !r.more.empty(); });
    if (gathered && mode == Mode::kActiveMessage && !tcp_only) {
      return ReadRangeByRange(reads, on_done, deadline);
    }
    auto call = NewCall(reads.size());
    auto issue = [&](Op* op) {
      const ReadOp& r = reads[op->index];
      op->dest = r.dest.data();
      op->length = r.dest.size();
      op->header.lease = r.lease;
      op->header.offset = r.offset;
      op->header.flags = tcp_only ? uint32_t{internal::kReplyEager} : 0u;
      Status valid = CheckReadRange(r.offset, r.dest.size());
      if (valid.ok()) valid = CheckRangeCount(r);
      if (!r.more.empty()) {
        op->ranges.push_back({r.offset, r.dest.size()});
        op->iov.push_back({r.dest.data(), r.dest.size()});
        for (const Range& m : r.more) {
          if (valid.ok()) valid = CheckReadRange(m.offset, m.dest.size());
          op->ranges.push_back({m.offset, m.dest.size()});
          op->iov.push_back({m.dest.data(), m.dest.size()});
          op->length += m.dest.size();
        }
      }
      op->header.length = op->length;
      if (!valid.ok()) return Complete(op, valid);
      if (mode == Mode::kActiveMessage) {
        if (op->ranges.empty()) return SendRequest(op, kAmReadRequest, nullptr, 0);
        return SendRequest(op, kAmReadvRequest, op->ranges.data(),
                           op->ranges.size() * sizeof(ReadRange));
      }
      // RMA: one get per range; the op completes with the last.
      ++op->gets_left;  // held while issuing
      auto get = [&](std::byte* dest, uint64_t length, uint64_t offset) {
        if (length == 0 || op->done) return;
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = &OnGetDone;
        param.user_data = op;
        ucs_status_ptr_t st =
            ucp_get_nbx(ep, dest, length, server.region_base + offset, rkey, &param);
        if (UCS_PTR_IS_ERR(st)) {
          Complete(op, StatusFromUcs(UCS_PTR_STATUS(st), "RMA read from node"));
        } else if (st != nullptr) {
          ++op->gets_left;
          ++op->call->outstanding;
        }
      };
      get(r.dest.data(), r.dest.size(), r.offset);
      for (const Range& m : r.more) get(m.dest.data(), m.dest.size(), m.offset);
      if (--op->gets_left == 0) Complete(op, Status::Ok());
    };
    return Run(std::move(call), issue, on_done, deadline);
  }

  // Active messages on shared memory or RDMA: rendezvous replies are zero
  // copy per range, while one reply gathering several ranges is not; each
  // range goes as its own read and an op completes with its last range.
  Status ReadRangeByRange(std::span<const ReadOp> reads,
                          const std::function<void(size_t, const Status&)>& on_done,
                          Nanos deadline) {
    std::vector<ReadOp> singles;
    std::vector<size_t> owner;  // singles[j] is part of reads[owner[j]]
    std::vector<size_t> left(reads.size(), 0);
    std::vector<Status> result(reads.size());
    Status first_error;
    auto finish = [&](size_t i, const Status& s) {
      if (!s.ok() && result[i].ok()) result[i] = s;
      if (--left[i] > 0) return;
      if (!result[i].ok() && first_error.ok()) first_error = result[i];
      if (on_done) on_done(i, result[i]);
    };
    for (size_t i = 0; i < reads.size(); ++i) {
      const ReadOp& r = reads[i];
      left[i] = 1;
      if (Status st = CheckRangeCount(r); !st.ok()) {
        finish(i, st);
        continue;
      }
      left[i] = 1 + r.more.size();
      singles.push_back({r.lease, r.offset, r.dest});
      owner.push_back(i);
      for (const Range& m : r.more) {
        singles.push_back({r.lease, m.offset, m.dest});
        owner.push_back(i);
      }
    }
    Status st = Read(
        singles, [&](size_t j, const Status& s) { finish(owner[j], s); }, deadline);
    return first_error.ok() ? st : first_error;
  }

  Status Write(std::span<const WriteOp> writes, Nanos deadline) {
    auto call = NewCall(writes.size());
    auto issue = [&](Op* op) {
      const WriteOp& w = writes[op->index];
      op->header.lease = w.lease;
      op->header.offset = w.offset;
      op->header.length = w.src.size();
      Status valid = CheckRange(w.offset, w.src.size());
      if (!valid.ok()) return Complete(op, valid);
      SendRequest(op, kAmWriteRequest, w.src.data(), w.src.size());
    };
    return Run(std::move(call), issue, nullptr, deadline);
  }
};

DataPlaneClient::DataPlaneClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataPlaneClient::~DataPlaneClient() = default;

Result<std::unique_ptr<DataPlaneClient>> DataPlaneClient::Connect(const ServerInfo& server,
                                                                  ClientOptions options) {
  if (server.worker_address.empty()) return InvalidArgument("node worker address is empty");
  if (server.wire_version != 0 && server.wire_version != kWireVersion) {
    return InvalidArgument("the node speaks data-plane wire version " +
                           std::to_string(server.wire_version) + ", this client version " +
                           std::to_string(kWireVersion) + ": run the same Strata release on both");
  }
  auto impl = std::make_unique<Impl>();
  impl->server = server;
  impl->options = options;
  internal::UcxWorkerOptions ucx_options;
  ucx_options.thread_mode = kThreadMode;
  // A client reads with RMA only where the node offers it (it serves no
  // RMA to anyone, so it needs the feature only for its own gets).
  ucx_options.rma = options.mode != Mode::kActiveMessage && !server.packed_rkey.empty();
  auto ucx = internal::CreateUcxWorker(ucx_options);
  if (!ucx.ok()) return ucx.status();
  impl->ucx = std::move(*ucx);
  Impl* raw = impl.get();
  STRATA_RETURN_IF_ERROR(raw->OpenWorker());
  STRATA_RETURN_IF_ERROR(raw->OpenEndpoint());
  STRATA_RETURN_IF_ERROR(raw->Ping(SteadyNow() + options.timeout));
  return std::unique_ptr<DataPlaneClient>(new DataPlaneClient(std::move(impl)));
}

Status DataPlaneClient::Read(std::span<const ReadOp> ops,
                             const std::function<void(size_t, const Status&)>& on_done,
                             Nanos deadline) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->Read(ops, on_done, deadline);
}

Status DataPlaneClient::Write(std::span<const WriteOp> ops, Nanos deadline) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->Write(ops, deadline);
}

Mode DataPlaneClient::mode() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->mode;
}

const std::byte* DataPlaneClient::MappedRegion() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->mode != Mode::kRma || impl_->rkey == nullptr) return nullptr;
  void* mapped = nullptr;
  if (ucp_rkey_ptr(impl_->rkey, impl_->server.region_base, &mapped) != UCS_OK) return nullptr;
  return static_cast<const std::byte*>(mapped);
}

std::vector<std::string> DataPlaneClient::transports() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lane_transports;
}

}  // namespace strata::dataplane

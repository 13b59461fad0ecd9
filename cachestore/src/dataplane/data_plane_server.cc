// The node's side of the data plane: one UCX worker driven by one progress
// thread, the arena registered once, active-message handlers that check
// Access and answer straight from / into the arena.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "dataplane/data_plane.h"
#include "dataplane/listen_devices.h"
#include "dataplane/peer_processes.h"
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

namespace {
// After activity the progress thread spins this long before sleeping on the
// worker's event fd: back-to-back requests then cost no wake-up.
constexpr Nanos kSpinNanos = 100'000;
// The longest the progress thread sleeps on the worker's event fd. UCX 1.13
// can miss a wakeup on shared memory (a rendezvous ack that arrives as the
// thread arms): without a bound the send, and the entry it pins, would wait
// for the next unrelated event.
constexpr int kMaxSleepMs = 5;
// How often the progress thread looks for stalled transfers and exited peers.
constexpr Nanos kStalledCheckInterval = 500 * kNanosPerMilli;
}  // namespace

struct DataPlaneServer::Impl {
  // A send or receive UCX has not finished yet. Owned by `pending` until its
  // callback (or the shutdown sweep) deletes it.
  struct Pending {
    enum class Kind : uint8_t { kSend, kWriteRecv };
    Impl* impl = nullptr;
    Kind kind = Kind::kSend;
    ReplyHeader reply;              // kSend: header, alive until the send finishes
    std::string message;            // kSend: error text sent as data
    uint64_t payload_bytes = 0;     // kSend: arena bytes, counted when done
    std::vector<ucp_dt_iov_t> iov;  // kSend of several arena ranges
    RequestHeader request;          // kWriteRecv
    ucp_ep_h reply_ep = nullptr;    // kWriteRecv: where the ack goes
    // What the authorization pinned, released with the Pending once UCX is
    // done with the arena bytes.
    std::vector<TransferHold> holds;
    Nanos started = internal::SteadyNow();
    bool abandoned = false;  // given up (AbandonStalled): counted in `abandoned`, not `in_flight`
    // kSend: the process on this host it goes to (0: not known), and
    // whether it was let go when that process exited (ReleaseExitedPeers):
    // no hold, in no count, kept only for UCX's callback.
    pid_t peer_pid = 0;
    ucp_ep_h peer_ep = nullptr;  // kSend: where it goes
    bool peer_gone = false;
  };

  std::span<std::byte> region;
  Access access;
  ServerOptions options;
  std::unique_ptr<internal::UcxWorker> ucx;
  int efd = -1;              // the worker's event fd (owned by UCX), polled with a bound
  ucp_mem_h memh = nullptr;  // the arena's registration (RMA modes)
  std::span<std::byte> private_mapping;  // MapPrivateRegion's, unmapped last
  std::string worker_address;
  std::string packed_rkey;
  std::string host_id;
  std::vector<std::string> transports;
  std::vector<std::string> rdma_devices;

  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> draining{false};
  bool destroying = false;  // progress thread / shutdown only
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> in_flight{0};
  std::atomic<uint64_t> abandoned{0};
  std::atomic<uint64_t> released_peer_gone{0};
  internal::PeerProcesses peers;               // progress thread only
  std::atomic<uint64_t> watched_processes{0};  // peers.processes(), for stats()
  // Read and write handlers running now. A handler that checked `draining`
  // before Drain set it starts its transfer (in_flight) before it ends, so
  // Drain waits for both: otherwise it could see no transfer in flight just
  // before one starts.
  std::atomic<uint32_t> handling{0};
  struct Handling {
    explicit Handling(Impl* impl) : impl(impl) { impl->handling.fetch_add(1); }
    ~Handling() { impl->handling.fetch_sub(1); }
    Impl* impl;
  };
  // Changed by the progress thread only (under pending_mu, so that stats()
  // can look at how old the oldest is).
  std::unordered_set<Pending*> pending;
  mutable std::mutex pending_mu;

  void Track(Pending* p) {
    std::lock_guard lock(pending_mu);
    pending.insert(p);
  }
  void Untrack(Pending* p) {
    std::lock_guard lock(pending_mu);
    pending.erase(p);
  }

  ~Impl() {
    if (thread.joinable()) {
      stop.store(true, std::memory_order_release);
      ucp_worker_signal(ucx->worker);
      thread.join();
    }
    Shutdown();
  }

  // Gives up the transfers older than stalled_transfer_timeout (see
  // ServerOptions): they leave `in_flight` for `abandoned`, and keep their
  // holds until UCX finishes them or the worker goes. Progress thread only.
  void AbandonStalled(Nanos now) {
    uint64_t given_up = 0;
    {
      std::lock_guard lock(pending_mu);
      for (Pending* p : pending) {
        if (p->abandoned || p->peer_gone || now - p->started <= options.stalled_transfer_timeout) {
          continue;
        }
        p->abandoned = true;
        ++given_up;
      }
    }
    if (given_up == 0) return;
    abandoned.fetch_add(given_up, std::memory_order_acq_rel);
    in_flight.fetch_sub(given_up, std::memory_order_acq_rel);
    spdlog::warn(
        "event=data_plane_transfers_abandoned count={} after_s={} reason=\"the peer neither "
        "finished nor failed them (gone or stalled); what they pin stays pinned\"",
        given_up, options.stalled_transfer_timeout / kNanosPerSecond);
  }

  // Lets go of the replies to processes that have exited. UCX 1.13 can
  // neither fail nor cancel a same-host endpoint, so a client killed during
  // a rendezvous reply over shared memory leaves the send in UCX for good:
  // its holds go now (the entries they pinned are free again) and it leaves
  // the counts, while its Pending stays for UCX's callback (or the worker's
  // end). Only replies over endpoints with a cma lane are let go (HasCmaLane):
  // a peer that can read this process's memory with process_vm_readv gains
  // nothing from bytes let go early, and a live reader's copy fails its
  // checksum if they change. Progress thread only.
  void ReleaseExitedPeers() {
    const std::vector<pid_t> exited = peers.TakeExited();
    if (exited.empty()) return;
    watched_processes.store(peers.processes(), std::memory_order_relaxed);
    std::vector<TransferHold> holds;  // released after the lock
    std::unordered_map<ucp_ep_h, bool> cma_lane;
    uint64_t from_in_flight = 0, from_abandoned = 0;
    {
      std::lock_guard lock(pending_mu);
      for (Pending* p : pending) {
        if (p->peer_gone || p->peer_pid == 0 ||
            std::find(exited.begin(), exited.end(), p->peer_pid) == exited.end() ||
            !HasCmaLane(p->peer_ep, &cma_lane)) {
          continue;
        }
        p->peer_gone = true;
        ++(p->abandoned ? from_abandoned : from_in_flight);
        for (TransferHold& h : p->holds) holds.push_back(std::move(h));
        p->holds.clear();
      }
    }
    holds.clear();
    if (from_in_flight + from_abandoned == 0) return;
    released_peer_gone.fetch_add(from_in_flight + from_abandoned, std::memory_order_acq_rel);
    abandoned.fetch_sub(from_abandoned, std::memory_order_acq_rel);
    in_flight.fetch_sub(from_in_flight, std::memory_order_acq_rel);
    spdlog::warn(
        "event=data_plane_peer_exited processes={} transfers_released={} reason=\"a client on "
        "this host exited during its reads; what they pinned is free again\"",
        exited.size(), from_in_flight + from_abandoned);
  }

  // A transfer ended: its Pending (and holds) go, then it leaves whichever
  // count held it (none, once let go by ReleaseExitedPeers). The holds go
  // first: in_flight 0 (what Drain waits for) means every entry a reply
  // read is free again, but those of abandoned transfers.
  void End(Pending* p) {
    Untrack(p);
    const bool counted = !p->peer_gone;
    const bool was_abandoned = p->abandoned;
    delete p;
    if (counted) (was_abandoned ? abandoned : in_flight).fetch_sub(1, std::memory_order_acq_rel);
  }

  void Run() {
    Nanos last_active = internal::SteadyNow();
    Nanos next_check = last_active + kStalledCheckInterval;
    while (!stop.load(std::memory_order_acquire)) {
      if (const Nanos now = internal::SteadyNow(); now >= next_check) {
        ReleaseExitedPeers();
        AbandonStalled(now);
        next_check = now + kStalledCheckInterval;
      }
      if (ucp_worker_progress(ucx->worker) != 0) {
        last_active = internal::SteadyNow();
        continue;
      }
      if (internal::SteadyNow() - last_active < kSpinNanos) continue;
      ucs_status_t st = ucp_worker_arm(ucx->worker);
      if (st == UCS_ERR_BUSY) continue;
      if (st != UCS_OK) {
        // No event fd for these transports: poll gently instead.
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      if (efd >= 0) {
        pollfd p{efd, POLLIN, 0};
        (void)poll(&p, 1, kMaxSleepMs);
      } else {
        ucp_worker_wait(ucx->worker);
      }
      last_active = internal::SteadyNow();
    }
  }

  // Runs after the progress thread ended (or never started).
  void Shutdown() {
    if (ucx == nullptr) return;
    // Give replies already handed to UCX a moment to finish cleanly.
    const Nanos grace = internal::SteadyNow() + 200 * kNanosPerMilli;
    while (!pending.empty() && internal::SteadyNow() < grace) ucp_worker_progress(ucx->worker);
    destroying = true;
    // Destroying the worker completes what is left (callbacks may run and
    // delete their Pending); whatever it did not complete is ours to delete.
    // The arena's registration goes after it: a reply still in UCX refers
    // to it (and with UCP_MEM_MAP_ALLOCATE the unmap frees the arena).
    ucp_worker_destroy(ucx->worker);
    ucx->worker = nullptr;
    if (memh != nullptr) ucp_mem_unmap(ucx->context, memh);
    memh = nullptr;
    {
      std::lock_guard lock(pending_mu);
      for (Pending* p : pending) delete p;
      pending.clear();
    }
    ucx.reset();
    if (!private_mapping.empty()) munmap(private_mapping.data(), private_mapping.size());
    private_mapping = {};
  }

  // Registers the arena once, or lets UCX allocate it (`region` empty: a
  // shared-memory segment peers on this host can map), and packs the rkey
  // RMA clients read it with. Remote peers may read, never write: writes
  // arrive as active messages the node checks first.
  Status RegisterForRma(std::span<std::byte> arena, uint64_t bytes) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = arena.data();
    mp.length = bytes;
    mp.prot =
        UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ;
    mp.flags = arena.empty() ? UCP_MEM_MAP_ALLOCATE : 0;
    ucs_status_t st = ucp_mem_map(ucx->context, &mp, &memh);
    if (st != UCS_OK) {
      memh = nullptr;
      return StatusFromUcs(st, "ucp_mem_map of the arena");
    }
    if (arena.empty()) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      st = ucp_mem_query(memh, &attr);
      if (st != UCS_OK) return StatusFromUcs(st, "ucp_mem_query");
      arena = {static_cast<std::byte*>(attr.address), bytes};
    }
    region = arena;
    void* rkey = nullptr;
    size_t rkey_size = 0;
    st = ucp_rkey_pack(ucx->context, memh, &rkey, &rkey_size);
    if (st != UCS_OK) return StatusFromUcs(st, "ucp_rkey_pack");
    packed_rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    return Status::Ok();
  }

  // StartWithOwnRegion in kActiveMessage: plain anonymous memory, which
  // nobody else can map (UCX would allocate a shared-memory segment).
  Status MapPrivateRegion(uint64_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return ResourceExhausted("cannot map a data plane region of " + std::to_string(bytes) +
                               " bytes");
    private_mapping = {static_cast<std::byte*>(p), bytes};
    region = private_mapping;
    return Status::Ok();
  }

  // ---- replies ----

  static void OnSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* p = static_cast<Pending*>(user_data);
    ucp_request_free(request);
    p->impl->FinishSend(p, status);
  }

  void FinishSend(Pending* p, ucs_status_t status) {
    if (status == UCS_OK) bytes_sent.fetch_add(p->payload_bytes, std::memory_order_relaxed);
    End(p);
  }

  // Sends `id` with {op_id, status} to `ep`: data is the arena range on OK,
  // the error text otherwise.
  void Reply(ucp_ep_h ep, uint16_t id, uint64_t op_id, const Status& status, const std::byte* data,
             uint64_t length, bool eager = false, TransferHold hold = {}) {
    auto* p = new Pending();
    p->impl = this;
    p->holds.push_back(std::move(hold));
    p->reply.op_id = op_id;
    p->reply.code = static_cast<uint32_t>(status.code());
    const void* payload = data;
    if (!status.ok()) {
      p->message = status.message().substr(0, internal::kMaxErrorMessage);
      payload = p->message.data();
      length = p->message.size();
    } else {
      p->payload_bytes = length;
    }
    Send(ep, id, p, payload, length, eager);
  }

  // Sends the arena ranges `iov` (total `length` bytes) as one read reply.
  void ReplyGathered(ucp_ep_h ep, uint64_t op_id, std::vector<ucp_dt_iov_t> iov, uint64_t length,
                     bool eager, std::vector<TransferHold> holds) {
    auto* p = new Pending();
    p->impl = this;
    p->holds = std::move(holds);
    p->reply.op_id = op_id;
    p->payload_bytes = length;
    p->iov = std::move(iov);
    Send(ep, kAmReadReply, p, p->iov.data(), length, eager);
  }

  // Hands `p` (header and, with p->iov, the iov list) to UCX; `payload` is
  // contiguous bytes, or p->iov.data().
  void Send(ucp_ep_h ep, uint16_t id, Pending* p, const void* payload, uint64_t length,
            bool eager) {
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &OnSendDone;
    param.user_data = p;
    if (eager) {
      param.flags = UCP_AM_SEND_FLAG_EAGER;
    } else if (length >= internal::kRendezvousThreshold) {
      param.flags = UCP_AM_SEND_FLAG_RNDV;
    }
    size_t count = length;
    if (!p->iov.empty()) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      param.datatype = ucp_dt_make_iov();
      count = p->iov.size();
    }
    p->peer_pid = peers.PidOf(ep);
    p->peer_ep = ep;
    in_flight.fetch_add(1, std::memory_order_acq_rel);
    if (peers.HasExited(ep)) {
      // A request that waited in UCX while its client died: nobody would
      // take the reply, and it would pin its entry for good.
      FinishSend(p, UCS_ERR_CONNECTION_RESET);
      return;
    }
    ucs_status_ptr_t r =
        ucp_am_send_nbx(ep, id, &p->reply, sizeof(p->reply), payload, count, &param);
    if (r == nullptr) {
      FinishSend(p, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      FinishSend(p, UCS_PTR_STATUS(r));
    } else {
      Track(p);
    }
  }

  // ---- request checks ----

  Status CheckRange(const RequestHeader& h) const {
    if (h.offset > region.size() || h.length > region.size() - h.offset) {
      return InvalidArgument("range [" + std::to_string(h.offset) + ", +" +
                             std::to_string(h.length) + ") lies outside the node's arena");
    }
    return Status::Ok();
  }

  // Copies the header out (UCX gives no alignment guarantee); false when the
  // request cannot be answered at all.
  static bool ParseHeader(const void* header, size_t header_length,
                          const ucp_am_recv_param_t* param, RequestHeader* out) {
    if (header_length != sizeof(RequestHeader)) return false;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return false;
    std::memcpy(out, header, sizeof(*out));
    return true;
  }

  // ---- handlers (progress thread) ----

  // Counts a request and parses its header; false (counted as rejected)
  // when it cannot be answered at all.
  bool Accept(const void* header, size_t header_length, const ucp_am_recv_param_t* param,
              RequestHeader* h) {
    requests.fetch_add(1, std::memory_order_relaxed);
    if (ParseHeader(header, header_length, param, h)) return true;
    rejected.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  static ucs_status_t OnPing(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    RequestHeader h;
    if (!ParseHeader(header, header_length, param, &h)) return UCS_OK;
    self->WatchPeer(param, data, length);
    Status st;
    if (h.version != kWireVersion) {
      st = InvalidArgument("data plane wire version mismatch");
    } else if (self->draining.load(std::memory_order_acquire)) {
      st = Unavailable("node is draining");
    }
    self->Reply(param->reply_ep, kAmPong, h.op_id, st, nullptr, 0);
    return UCS_OK;
  }

  // Watches the process a hello names (ReleaseExitedPeers). Every ping
  // starts its endpoint over: one that names no process to watch (an old
  // client, a malformed hello) is forgotten, so an endpoint UCX reuses
  // never inherits a stale process.
  void WatchPeer(const ucp_am_recv_param_t* param, const void* data, size_t length) {
    internal::PeerHello hello;
    const bool named = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && data != nullptr &&
                       length == sizeof(hello);
    if (named) std::memcpy(&hello, data, sizeof(hello));
    if (!named || hello.magic != internal::kPeerHelloMagic || hello.pid > INT32_MAX ||
        !peers.Watch(param->reply_ep, static_cast<pid_t>(hello.pid))) {
      peers.Forget(param->reply_ep);
    }
    watched_processes.store(peers.processes(), std::memory_order_relaxed);
  }

  // Whether `ep` has a cma lane, i.e. its peer can read this process's
  // memory anyway: only then is the claim of a hello, which nothing here
  // can check, worth nothing to a liar, and a reply let go when the named
  // process exits. Asked when it matters (an endpoint's lanes may still
  // change while it is wired up); `cache` holds the answers of one pass.
  static bool HasCmaLane(ucp_ep_h ep, std::unordered_map<ucp_ep_h, bool>* cache) {
    const auto [it, inserted] = cache->try_emplace(ep, false);
    if (inserted) {
      const std::vector<internal::EpLane> lanes = internal::EpLanes(ep);
      it->second = std::any_of(lanes.begin(), lanes.end(), [](const internal::EpLane& lane) {
        return internal::IsCmaTransport(lane.transport);
      });
    }
    return it->second;
  }

  static ucs_status_t OnReadRequest(void* arg, const void* header, size_t header_length,
                                    void* /*data*/, size_t /*length*/,
                                    const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    const Handling handling(self);
    RequestHeader h;
    if (!self->Accept(header, header_length, param, &h)) return UCS_OK;
    Result<TransferHold> hold = self->CheckRequest(h, self->access.authorize_read);
    if (!hold.ok()) {
      self->rejected.fetch_add(1, std::memory_order_relaxed);
      self->Reply(param->reply_ep, kAmReadReply, h.op_id, hold.status(), nullptr, 0);
      return UCS_OK;
    }
    self->Reply(param->reply_ep, kAmReadReply, h.op_id, Status::Ok(),
                self->region.data() + h.offset, h.length, (h.flags & internal::kReplyEager) != 0,
                std::move(*hold));
    return UCS_OK;
  }

  // A read of several ranges under one lease, answered with one reply
  // that gathers them in order.
  static ucs_status_t OnReadvRequest(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    const Handling handling(self);
    RequestHeader h;
    if (!self->Accept(header, header_length, param, &h)) return UCS_OK;
    std::vector<ucp_dt_iov_t> iov;
    std::vector<TransferHold> holds;
    Status st = self->CheckGather(h, data, length, param, &iov, &holds);
    if (!st.ok()) {
      self->rejected.fetch_add(1, std::memory_order_relaxed);
      self->Reply(param->reply_ep, kAmReadReply, h.op_id, st, nullptr, 0);
      return UCS_OK;  // the holds of ranges authorized before the refusal go now
    }
    self->ReplyGathered(param->reply_ep, h.op_id, std::move(iov), h.length,
                        (h.flags & internal::kReplyEager) != 0, std::move(holds));
    return UCS_OK;
  }

  // Parses and authorizes a readv request's range list into `iov`, one hold
  // per range into `holds`.
  Status CheckGather(const RequestHeader& h, const void* data, size_t length,
                     const ucp_am_recv_param_t* param, std::vector<ucp_dt_iov_t>* iov,
                     std::vector<TransferHold>* holds) {
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || data == nullptr || length == 0 ||
        length % sizeof(ReadRange) != 0 ||
        length / sizeof(ReadRange) > DataPlaneClient::kMaxRangesPerRead) {
      return InvalidArgument("malformed range list (" + std::to_string(length) + " bytes)");
    }
    const size_t n = length / sizeof(ReadRange);
    iov->reserve(n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      ReadRange r;
      std::memcpy(&r, static_cast<const std::byte*>(data) + i * sizeof(r), sizeof(r));
      RequestHeader one = h;
      one.offset = r.offset;
      one.length = r.length;
      Result<TransferHold> hold = CheckRequest(one, access.authorize_read);
      if (!hold.ok()) return hold.status();
      holds->push_back(std::move(*hold));
      total += r.length;  // ranges lie inside the arena: no overflow
      iov->push_back({region.data() + r.offset, r.length});
    }
    if (total != h.length) {
      return InvalidArgument("ranges add up to " + std::to_string(total) + " bytes, header says " +
                             std::to_string(h.length));
    }
    return Status::Ok();
  }

  Result<TransferHold> CheckRequest(const RequestHeader& h, const Access::Authorize& authorize) {
    if (h.version != kWireVersion) return InvalidArgument("data plane wire version mismatch");
    if (draining.load()) return Unavailable("node is draining");
    STRATA_RETURN_IF_ERROR(CheckRange(h));
    if (!authorize)
      return PermissionDenied("node has no authorization callback for this operation");
    return authorize(h.session, h.lease, h.offset, h.length);
  }

  static ucs_status_t OnWriteRequest(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    const Handling handling(self);
    RequestHeader h;
    if (!self->Accept(header, header_length, param, &h)) return UCS_OK;  // drops rendezvous data
    Result<TransferHold> hold =
        length != h.length ? Result<TransferHold>(
                                 InvalidArgument("write carries " + std::to_string(length) +
                                                 " bytes, header says " + std::to_string(h.length)))
                           : self->CheckRequest(h, self->access.authorize_write);
    if (!hold.ok()) {
      self->rejected.fetch_add(1, std::memory_order_relaxed);
      self->Reply(param->reply_ep, kAmWriteAck, h.op_id, hold.status(), nullptr, 0);
      return UCS_OK;  // nothing lands: UCX drops the payload
    }
    std::byte* dest = self->region.data() + h.offset;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      // Eager (small) payload: already here, one copy.
      if (length > 0) std::memcpy(dest, data, length);
      self->WriteLanded(h, param->reply_ep, UCS_OK);
      return UCS_OK;  // the hold goes here: the bytes are in
    }
    auto* p = new Pending();
    p->impl = self;
    p->kind = Pending::Kind::kWriteRecv;
    p->request = h;
    p->reply_ep = param->reply_ep;
    p->holds.push_back(std::move(*hold));
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &OnWriteReceived;
    rp.user_data = p;
    self->in_flight.fetch_add(1, std::memory_order_acq_rel);
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->ucx->worker, data, dest, length, &rp);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      self->FinishWriteRecv(p, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
    } else {
      self->Track(p);
    }
    return UCS_OK;
  }

  static void OnWriteReceived(void* request, ucs_status_t status, size_t /*length*/,
                              void* user_data) {
    auto* p = static_cast<Pending*>(user_data);
    ucp_request_free(request);
    p->impl->FinishWriteRecv(p, status);
  }

  void FinishWriteRecv(Pending* p, ucs_status_t status) {
    // The ack (a transfer of its own) starts before this one ends, so a
    // draining node never sees nothing in flight in between. The hold
    // lasts through on_write_done, as for an eager write.
    if (!destroying) WriteLanded(p->request, p->reply_ep, status);  // going away: no acks
    End(p);
  }

  void WriteLanded(const RequestHeader& h, ucp_ep_h ep, ucs_status_t status) {
    if (status != UCS_OK) {
      rejected.fetch_add(1, std::memory_order_relaxed);
      Reply(ep, kAmWriteAck, h.op_id, StatusFromUcs(status, "receiving write"), nullptr, 0);
      return;
    }
    bytes_received.fetch_add(h.length, std::memory_order_relaxed);
    if (access.on_write_done) access.on_write_done(h.session, h.lease, h.offset, h.length);
    Reply(ep, kAmWriteAck, h.op_id, Status::Ok(), nullptr, 0);
  }
};

DataPlaneServer::DataPlaneServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataPlaneServer::~DataPlaneServer() = default;

Result<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(std::span<std::byte> region,
                                                                Access access,
                                                                const ServerOptions& options) {
  if (region.empty()) return InvalidArgument("data plane region is empty");
  return StartInternal(region, region.size(), std::move(access), options);
}

Result<std::unique_ptr<DataPlaneServer>> DataPlaneServer::StartWithOwnRegion(
    uint64_t bytes, Access access, const ServerOptions& options) {
  if (bytes == 0) return InvalidArgument("data plane region is empty");
  return StartInternal({}, bytes, std::move(access), options);
}

Result<std::unique_ptr<DataPlaneServer>> DataPlaneServer::StartInternal(
    std::span<std::byte> region, uint64_t bytes, Access access, const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->access = std::move(access);
  impl->options = options;
  impl->host_id = HostId();
  impl->rdma_devices = DiscoverRdmaDevices();
  // Active messages only: the context has no RMA at all, so a peer's
  // forged ucp_get/ucp_put (software RMA on tcp and shared memory) finds no
  // handler and is dropped, and the arena is neither registered for remote
  // access nor announced (no rkey, no address).
  const bool rma = options.mode != Mode::kActiveMessage;
  internal::UcxWorkerOptions ucx_options;
  ucx_options.wakeup = true;
  ucx_options.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucx_options.rma = rma;
  Result<std::vector<std::string>> devices = internal::NetDevicesForListenHost(options.listen_host);
  if (!devices.ok()) return devices.status();
  ucx_options.net_devices = std::move(devices).value();
  auto ucx = internal::CreateUcxWorker(ucx_options);
  if (!ucx.ok()) return ucx.status();
  impl->ucx = std::move(*ucx);
  ucp_context_h ctx = impl->ucx->context;
  ucp_worker_h worker = impl->ucx->worker;
  impl->transports = internal::ContextTransports(ctx);
  if (rma) {
    STRATA_RETURN_IF_ERROR(impl->RegisterForRma(region, bytes));
  } else if (region.empty()) {
    STRATA_RETURN_IF_ERROR(impl->MapPrivateRegion(bytes));
  } else {
    impl->region = region;
  }
  ucp_address_t* address = nullptr;
  size_t address_size = 0;
  const ucs_status_t st = ucp_worker_get_address(worker, &address, &address_size);
  if (st != UCS_OK) return StatusFromUcs(st, "ucp_worker_get_address");
  impl->worker_address.assign(reinterpret_cast<const char*>(address), address_size);
  ucp_worker_release_address(worker, address);

  Impl* raw = impl.get();
  STRATA_RETURN_IF_ERROR(internal::SetAmHandler(worker, kAmPing, &Impl::OnPing, raw));
  STRATA_RETURN_IF_ERROR(internal::SetAmHandler(worker, kAmReadRequest, &Impl::OnReadRequest, raw));
  STRATA_RETURN_IF_ERROR(
      internal::SetAmHandler(worker, kAmReadvRequest, &Impl::OnReadvRequest, raw));
  STRATA_RETURN_IF_ERROR(
      internal::SetAmHandler(worker, kAmWriteRequest, &Impl::OnWriteRequest, raw));
  if (ucp_worker_get_efd(worker, &impl->efd) != UCS_OK) impl->efd = -1;  // ucp_worker_wait then
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<DataPlaneServer>(new DataPlaneServer(std::move(impl)));
}

const std::string& DataPlaneServer::worker_address() const { return impl_->worker_address; }
const std::string& DataPlaneServer::packed_rkey() const { return impl_->packed_rkey; }
uint64_t DataPlaneServer::region_base() const {
  if (impl_->options.mode == Mode::kActiveMessage) return 0;  // nothing to address
  return reinterpret_cast<uint64_t>(impl_->region.data());
}
uint64_t DataPlaneServer::region_size() const { return impl_->region.size(); }
std::span<std::byte> DataPlaneServer::region() const { return impl_->region; }
const std::string& DataPlaneServer::host_id() const { return impl_->host_id; }
Mode DataPlaneServer::mode() const { return impl_->options.mode; }

Status DataPlaneServer::Drain(Nanos deadline) {
  impl_->draining.store(true);
  while (impl_->handling.load() > 0 || impl_->in_flight.load() > 0) {
    if (internal::SteadyNow() > deadline) {
      return DeadlineExceeded(std::to_string(impl_->in_flight.load()) +
                              " data plane transfers still in flight");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::Ok();
}

DataPlaneServer::Stats DataPlaneServer::stats() const {
  Stats s;
  s.bytes_sent = impl_->bytes_sent.load(std::memory_order_relaxed);
  s.bytes_received = impl_->bytes_received.load(std::memory_order_relaxed);
  s.requests = impl_->requests.load(std::memory_order_relaxed);
  s.rejected = impl_->rejected.load(std::memory_order_relaxed);
  s.in_flight = impl_->in_flight.load(std::memory_order_relaxed);
  s.abandoned = impl_->abandoned.load(std::memory_order_relaxed);
  s.released_peer_exited = impl_->released_peer_gone.load(std::memory_order_relaxed);
  s.watched_processes = impl_->watched_processes.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(impl_->pending_mu);
    Nanos oldest = 0;
    for (const Impl::Pending* p : impl_->pending) {
      if (p->abandoned || p->peer_gone) continue;
      if (oldest == 0 || p->started < oldest) oldest = p->started;
    }
    if (oldest != 0) {
      s.oldest_in_flight_seconds = static_cast<double>(internal::SteadyNow() - oldest) / 1e9;
    }
  }
  s.transports = impl_->transports;
  s.rdma_devices = impl_->rdma_devices;
  return s;
}

}  // namespace strata::dataplane

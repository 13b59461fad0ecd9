// Pieces shared by the data plane's node and client: the wire headers of
// the active messages, UCX context/worker setup, status mapping and the
// parsing of UCX's printed endpoint/context info (UCX 1.13 has no query for
// an endpoint's transports).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dataplane/data_plane.h"
#include "strata/clock.h"
#include "strata/status.h"

namespace strata::dataplane::internal {

// Active-message ids. Requests travel client -> node, replies node -> client.
enum AmId : uint16_t {
  kAmPing = 11,          // RequestHeader (op_id only), data = PeerHello; answered by kAmPong
  kAmPong = 12,          // ReplyHeader
  kAmReadRequest = 13,   // RequestHeader, no data
  kAmReadReply = 14,     // ReplyHeader; data = payload (OK) or error message
  kAmWriteRequest = 15,  // RequestHeader; data = payload
  kAmWriteAck = 16,      // ReplyHeader; data = error message (if any)
  kAmReadvRequest = 17,  // RequestHeader (offset unused, length = total);
                         // data = ReadRange[]; answered by kAmReadReply
};

// Bumped when a header or message changes; both sides reject other versions.
using dataplane::kWireVersion;

// RequestHeader::flags.
enum RequestFlag : uint32_t {
  // Reply to a read eagerly: UCX streams the arena ranges (up to 6 iov
  // entries on tcp, see kMaxRangesPerRead) straight from the arena in
  // fragments, where rendezvous would cost a handshake per reply and, for
  // several ranges, fall back to packing them. Clients ask for it over TCP.
  kReplyEager = 1,
};

struct RequestHeader {
  uint32_t version = kWireVersion;
  uint32_t flags = 0;  // RequestFlag bits
  uint64_t session = 0;
  uint64_t lease = 0;
  uint64_t op_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One range of a kAmReadvRequest, in the order its bytes are replied.
struct ReadRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A kAmPing's data: the client's process, so that a node on the same host
// can tell when it has exited (PeerProcesses). A node ignores ping data it
// does not recognize; clients before it sent none.
inline constexpr uint32_t kPeerHelloMagic = 0x44495053;  // "SPID"
struct PeerHello {
  uint32_t magic = kPeerHelloMagic;
  uint32_t pid = 0;
};

struct ReplyHeader {
  uint32_t version = kWireVersion;
  uint32_t code = 0;  // StatusCode
  uint64_t op_id = 0;
};

// Payloads from this size up go by rendezvous (zero copy on the node).
constexpr uint64_t kRendezvousThreshold = 8192;
// Error messages carried in replies are cut to this length.
constexpr size_t kMaxErrorMessage = 512;

inline Nanos SteadyNow() { return SteadyClock().Now(); }

Status StatusFromUcs(ucs_status_t status, const std::string& what);
// Status codes arriving from the wire; unknown codes become INTERNAL.
StatusCode StatusCodeFromWire(uint32_t code);

// What a context + worker is set up for.
struct UcxWorkerOptions {
  // The node sleeps on the worker's event fd (UCP_FEATURE_WAKEUP).
  bool wakeup = false;
  // UCS_THREAD_MODE_SINGLE for a worker only its creating thread drives (the
  // node's progress thread), UCS_THREAD_MODE_SERIALIZED for one any thread
  // may drive under a lock (a client's, driven by whichever caller holds its
  // mutex).
  ucs_thread_mode_t thread_mode = UCS_THREAD_MODE_SINGLE;
  // UCP_FEATURE_RMA. Without it the context installs no handlers for UCX's
  // software RMA (the get/put requests a peer's ucp_get_nbx / ucp_put_nbx
  // turn into where a transport has no native RMA, tcp and shared memory
  // among them): a forged request is dropped with a UCX warning, where with
  // it UCX would read or write whatever address the peer names.
  bool rma = true;
  // UCX_NET_DEVICES for this context ("lo", "eth0", "mlx5_0:1"); empty
  // leaves UCX's setting (the environment's, or every device). Each tcp
  // device is a listening socket bound to that device's address.
  std::vector<std::string> net_devices;
};

// One context + one worker, features AM plus what `options` asks for.
// Configuration (UCX_TLS, ...) comes from the environment.
struct UcxWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  UcxWorker() = default;
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;
  ~UcxWorker();
};
Result<std::unique_ptr<UcxWorker>> CreateUcxWorker(const UcxWorkerOptions& options);
// A further worker on `context`, e.g. to replace one that was destroyed.
Result<ucp_worker_h> CreateWorker(ucp_context_h context, ucs_thread_mode_t thread_mode);

// How long a client, after a failed or late call, waits for UCX to hand back
// the requests it still holds before it drops its whole worker (2 s).
Nanos ClientTeardownGrace();
// Tests: a shorter (or zero) grace, so that UCX still holds requests when it
// ends; a negative value restores the default.
void SetClientTeardownGraceForTesting(Nanos grace);
// How many times clients dropped their worker (process-wide), for tests; the
// client counts each with CountClientWorkerTeardown.
uint64_t ClientWorkerTeardownsForTesting();
void CountClientWorkerTeardown();

// Registers an active-message handler on `worker`.
Status SetAmHandler(ucp_worker_h worker, uint16_t id, ucp_am_recv_callback_t cb, void* arg);

// Runs `print(stream)` into a string (UCX prints its info to a FILE*).
std::string CaptureUcxPrint(const std::function<void(FILE*)>& print);

// "tcp/eth0", "posix/memory", ... of the context's resources.
std::vector<std::string> ContextTransports(ucp_context_h context);

struct EpLane {
  std::string transport;  // "cma/memory", "tcp/lo", "rc_mlx5/mlx5_0:1"
  bool rma_bw = false;    // UCX uses it for bulk RMA
};
std::vector<EpLane> EpLanes(ucp_ep_h ep);
// RDMA transports (verbs / mlx5): RMA on them is done by the NIC.
bool IsRdmaTransport(const std::string& transport);
bool IsSharedMemoryTransport(const std::string& transport);
bool IsTcpTransport(const std::string& transport);
// cma: the peer reads (and writes) the other process's memory with
// process_vm_readv / process_vm_writev.
bool IsCmaTransport(const std::string& transport);

// Blocks (progressing `worker`) until `request` from a ucp_*_nbx call
// completes or `deadline` passes; frees the request. Requests that did not
// finish are freed too (UCX releases them on completion).
Status WaitRequest(ucp_worker_h worker, ucs_status_ptr_t request, Nanos deadline,
                   const std::string& what);

}  // namespace strata::dataplane::internal

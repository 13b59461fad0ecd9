// The data plane (DESIGN §7): bulk bytes between a client process and a
// node's DRAM arena over UCX. No control plane here: the node hands its
// worker address, packed rkey, region base and a session id to clients over
// gRPC, and the client connects with them.
//
// Transfers:
//  - Reads, kRma: ucp_get_nbx straight from the node's registered arena; the
//    node's CPU is not involved. Only offered when the node allows it
//    (ServerOptions::mode != kActiveMessage): the rkey covers the whole arena,
//    so RMA clients are trusted with arena-wide read access (a node's `auto`
//    mode serves active messages only when several tenants share it).
//  - Reads, kActiveMessage: the client sends a small request {session, lease,
//    op id, offset, length} (over TCP, a list of ranges: ReadOp::more); the
//    node checks Access::authorize_read for each range and replies with one
//    active message whose data is the arena itself (an iov over the ranges),
//    so the node copies nothing: by rendezvous from 8 KiB up on shared
//    memory and RDMA (the client receives straight into the caller's
//    buffer), eagerly over TCP (UCX streams fragments from the arena, the
//    client copies them out: a rendezvous handshake per reply halves TCP
//    throughput for layer-group-sized pieces).
//  - Writes always use active messages: the node checks authorize_write,
//    receives the data straight into the arena at `offset`, calls
//    on_write_done and acks.
//  - Every authorization returns a TransferHold that the node keeps until
//    UCX is done with those bytes (reply sent, write landed, or failed).
//  - Errors from the node travel back as a status code and message.
//
// kAuto resolves on the client: kRma when RMA is native for this endpoint —
// the node's region is directly mappable here (ucp_rkey_ptr succeeds: shared
// memory on one host, region allocated by UCX, see StartWithOwnRegion) or an
// RDMA transport (rc/dc) carries the endpoint — and kActiveMessage
// otherwise: tcp, where UCX only emulates RMA, and shm with a region UCX did
// not allocate, where UCX 1.13 emulates RMA too while active-message
// rendezvous reads the node's memory with cma (zero copy), or when the node
// did not hand out an rkey.
//
// Failure detection: endpoints to another host (or without host_id) use
// UCP_ERR_HANDLING_MODE_PEER, so a dead node shows up as UNAVAILABLE. UCX
// 1.13's shared-memory transports refuse that mode, so endpoints on the same
// host (equal HostId()) use no error handling and a dead node shows up as
// DEADLINE_EXCEEDED (RMA reads from a dead local node may still succeed: the
// mapping outlives the process, and the bytes are what it last held). The
// node, for its part, learns that a client on its host died from the
// client's process (named in the handshake, watched with a pidfd), not from
// UCX: see ServerOptions::stalled_transfer_timeout.
//
// A failed call returns only once UCX has handed back its requests, or the
// client dropped its whole UCX worker with them (a fresh one serves the next
// call). On the same host one gap remains: a node pulls a rendezvous write's
// source with cma itself, so a write abandoned as late may still read the
// caller's buffer (harmless to the store: the bytes are never published, and
// a reused buffer fails the checksum), and without error handling the node
// keeps its receive, and the entry it pins, until it stops.
//
// UCX_TLS and the other UCX_* variables are read from the environment
// (ucp_config_read) by both sides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/clock.h"
#include "strata/status.h"

namespace strata::dataplane {

enum class Mode : uint8_t { kAuto, kRma, kActiveMessage };
std::string_view ModeName(Mode mode);
// "auto", "rma" or "am", the names config files and ClientOptions use.
Result<Mode> ParseMode(std::string_view name);

// Identifies this machine (hostname and boot id) so a client can tell that a
// node shares its host and shared-memory transports may reach it.
std::string HostId();

// The version of the data plane's messages. A node announces it in Hello;
// a client refuses a node with another one (INVALID_ARGUMENT) rather
// than send it messages it would drop.
inline constexpr uint32_t kWireVersion = 2;

// ---- Node side ------------------------------------------------------------

struct ServerOptions {
  // kActiveMessage: the node's UCX context has no RMA feature, registers
  // nothing for remote access and hands out no rkey and no address: every
  // byte that leaves or enters the arena goes through an authorized active
  // message, and a forged ucp_get/ucp_put is dropped by UCX. kAuto / kRma:
  // clients may read the whole arena with RMA (docs/security.md).
  Mode mode = Mode::kAuto;
  // The host the node listens on (its `listen` address, without the port).
  // UCX's network transports then use only the interfaces that carry it
  // (a tcp socket per interface otherwise). Empty or a wildcard: every
  // interface. An explicit UCX_NET_DEVICES in the environment wins.
  std::string listen_host;
  // A reply or write UCX has not finished this long after it started is
  // given up: counted apart from those in flight (Stats::abandoned), so a
  // draining node no longer waits for it. Its peer is stalled, or gone
  // without UCX noticing: over shared memory UCX 1.13 refuses peer error
  // handling, so such a transfer can be neither failed nor cancelled. What
  // it pins stays pinned until UCX lets go of it, or the node stops: a peer
  // that was only stalled may still read those bytes, and they must not be
  // reused. One exception: a client on this host names its process when it
  // connects, and once that process has exited (the node watches it with a
  // pidfd, and looks twice a second) its replies are let go at once
  // (Stats::released_peer_exited), holds included, over endpoints whose
  // peer could read the node's memory with cma anyway (the `am` path over
  // shared memory).
  Nanos stalled_transfer_timeout = Seconds(30);
};

// What an authorization keeps alive until the transfer it allowed has
// finished (the reply sent, the write landed, or the transfer failed): the
// node pins the entry, so a lease that ends meanwhile cannot free bytes still
// being sent or received and hand them to someone else. Move-only; releases
// on destruction. An empty hold keeps nothing.
class TransferHold {
 public:
  TransferHold() = default;
  explicit TransferHold(std::function<void()> release) : release_(std::move(release)) {}
  TransferHold(TransferHold&& other) noexcept : release_(std::exchange(other.release_, nullptr)) {}
  TransferHold& operator=(TransferHold&& other) noexcept {
    if (this != &other) {
      Reset();
      release_ = std::exchange(other.release_, nullptr);
    }
    return *this;
  }
  TransferHold(const TransferHold&) = delete;
  TransferHold& operator=(const TransferHold&) = delete;
  ~TransferHold() { Reset(); }

  void Reset() {
    if (std::function<void()> release = std::exchange(release_, nullptr)) release();
  }

 private:
  std::function<void()> release_;
};

struct Access {
  // Called on the progress thread for every active-message request. The node
  // answers with a hold only if `session`'s principal owns `lease` and
  // [offset, offset + length) lies inside an entry the lease covers; the
  // server keeps the hold until that transfer is over. Missing callbacks
  // deny everything.
  using Authorize = std::function<Result<TransferHold>(uint64_t session, uint64_t lease,
                                                       uint64_t offset, uint64_t length)>;
  Authorize authorize_read;
  Authorize authorize_write;
  // Called (progress thread) once a write into [offset, offset + length) has
  // fully landed in the arena, before the client is acked.
  std::function<void(uint64_t session, uint64_t lease, uint64_t offset, uint64_t length)>
      on_write_done;
};

// Owns a ucp_context, a ucp_worker and one progress thread; every UCX call of
// the node happens on that thread after Start returns (gRPC threads never
// touch UCX). The progress thread spins briefly after activity and sleeps on
// the worker's event fd otherwise.
class DataPlaneServer {
 public:
  // Registers `region` once (ucp_mem_map; remote read only) and starts the
  // progress thread. `region` must outlive the server.
  static Result<std::unique_ptr<DataPlaneServer>> Start(std::span<std::byte> region, Access access,
                                                        const ServerOptions& options);
  // Lets UCX allocate the region (ucp_mem_map ALLOCATE: a shared-memory
  // segment when shm transports are enabled), so that clients on this host
  // map it and RMA reads are plain memcpy. UCX 1.13 cannot do that for a
  // region it did not allocate: there, "RMA" over shm is emulated with
  // active messages through the node's worker, and kAuto picks active
  // messages (rendezvous via cma, zero copy) instead. Freed with the server.
  static Result<std::unique_ptr<DataPlaneServer>> StartWithOwnRegion(uint64_t bytes, Access access,
                                                                     const ServerOptions& options);
  // Stops the thread, ends in-flight sends, unmaps the region, frees UCX.
  ~DataPlaneServer();
  DataPlaneServer(const DataPlaneServer&) = delete;
  DataPlaneServer& operator=(const DataPlaneServer&) = delete;

  const std::string& worker_address() const;  // ucp_worker_get_address blob
  const std::string& packed_rkey() const;     // ucp_rkey_pack blob; empty in kActiveMessage
  uint64_t region_base() const;               // remote address of region[0]; 0 in kActiveMessage
  uint64_t region_size() const;
  std::span<std::byte> region() const;  // the registered bytes, for the node's own use
  const std::string& host_id() const;   // HostId() of the node
  Mode mode() const;                    // what the node allows (see ServerOptions)

  // Answers new requests with UNAVAILABLE from now on and waits until the
  // transfers already in flight finish or `deadline` (steady clock ns)
  // passes (DEADLINE_EXCEEDED). RMA reads bypass the node and are not seen.
  Status Drain(Nanos deadline);

  struct Stats {
    uint64_t bytes_sent = 0;      // read replies completed
    uint64_t bytes_received = 0;  // writes landed
    uint64_t requests = 0;        // active-message requests seen
    uint64_t rejected = 0;        // answered with an error
    uint64_t in_flight = 0;       // replies / writes not finished yet
    // Age of the oldest of those UCX has not finished. A transfer pins its
    // entry until then; one that a stalled peer never completes shows here
    // until stalled_transfer_timeout gives it up.
    double oldest_in_flight_seconds = 0;
    // Transfers given up (ServerOptions::stalled_transfer_timeout) that UCX
    // has not finished: each still pins its entry.
    uint64_t abandoned = 0;
    // Transfers let go because the client process they went to exited
    // (same host, cma; see ServerOptions::stalled_transfer_timeout).
    uint64_t released_peer_exited = 0;
    // Client processes on this host watched for that (those that connected
    // over an endpoint with a cma lane and have not exited).
    uint64_t watched_processes = 0;
    std::vector<std::string> transports;    // "tcp/eth0", "posix/memory", ...
    std::vector<std::string> rdma_devices;  // DiscoverRdmaDevices()
  };
  Stats stats() const;

  struct Impl;

 private:
  explicit DataPlaneServer(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<DataPlaneServer>> StartInternal(std::span<std::byte> region,
                                                                uint64_t bytes, Access access,
                                                                const ServerOptions& options);
  std::unique_ptr<Impl> impl_;
};

// ---- Client side ----------------------------------------------------------

struct ServerInfo {
  std::string worker_address;
  std::string packed_rkey;  // empty: the node allows active messages only
  uint64_t region_base = 0;
  uint64_t session = 0;  // opaque id from the control plane, sent with every request
  std::string host_id;   // the node's HostId(); empty = assume another host
  // The registered region's size: RMA reads past it are refused here (over
  // shared memory UCX would copy whatever lies beyond, or fault). 0: not
  // known, and no RMA.
  uint64_t region_bytes = 0;
  // The node's kWireVersion; 0: not told (nodes before Hello carried it).
  uint32_t wire_version = 0;
};

struct ClientOptions {
  Mode mode = Mode::kAuto;
  Nanos timeout = Seconds(10);  // for Connect's handshake with the node
};

// One object = one endpoint (own ucp_context and worker) to one node. Calls
// from several threads serialize on an internal mutex; progress happens on
// the calling thread. After a deadline or a node failure the endpoint is
// torn down and the next call reconnects to the same worker address.
class DataPlaneClient {
 public:
  // Creates the endpoint and round-trips a handshake with the node within
  // options.timeout (UNAVAILABLE / DEADLINE_EXCEEDED when it does not answer).
  static Result<std::unique_ptr<DataPlaneClient>> Connect(const ServerInfo& server,
                                                          ClientOptions options);
  ~DataPlaneClient();
  DataPlaneClient(const DataPlaneClient&) = delete;
  DataPlaneClient& operator=(const DataPlaneClient&) = delete;

  // A range of a read op beyond its first.
  struct Range {
    uint64_t offset;  // from region_base
    std::span<std::byte> dest;
  };
  struct ReadOp {
    uint64_t lease;
    uint64_t offset;  // from region_base
    std::span<std::byte> dest;
    // More ranges under the same lease that complete with this op. Over
    // TCP one request and one reply carry them all: a message there costs
    // as much as tens of KB of payload, so a reader that wants small
    // pieces in a set order (layer group g of every block first) gathers
    // them rather than sending one message each. Elsewhere (RMA, shared
    // memory, RDMA) each range travels on its own. At most
    // kMaxRangesPerRead ranges in all.
    std::span<const Range> more = {};
  };
  // UCX sends this many arena ranges in one TCP message without packing
  // them (tcp's am_zcopy takes 6 iov entries; UCX keeps some for itself).
  static constexpr size_t kMaxRangesPerRead = 4;
  struct WriteOp {
    uint64_t lease;
    uint64_t offset;  // from region_base
    std::span<const std::byte> src;
  };

  // Issues every op at once (pipelined) and progresses until all complete or
  // `deadline` (steady clock ns) passes. `on_done(i, status)` runs on the
  // calling thread exactly once per op, as op i completes (any order), and
  // for ops still open at the deadline or failure. Returns the first error:
  // DEADLINE_EXCEEDED, UNAVAILABLE (node gone or draining), the node's
  // authorize_* answer (PERMISSION_DENIED, NOT_FOUND, ...), INVALID_ARGUMENT.
  // When it returns, no UCX request points at a caller buffer any more.
  // The node's replies end (and unpin what they read) only when this
  // client's acknowledgements reach it: a successful call hands them over
  // before it returns; after a failed one, call again or destroy the client
  // (its close flushes them), as RemoteStore does.
  Status Read(std::span<const ReadOp> ops,
              const std::function<void(size_t, const Status&)>& on_done, Nanos deadline);
  Status Write(std::span<const WriteOp> ops, Nanos deadline);

  Mode mode() const;  // resolved: kRma or kActiveMessage
  // Where the node's region is mapped into this process (UCX shared memory
  // on one host: ucp_rkey_ptr), or nullptr. Lets a reader copy and verify
  // in one pass instead of a get followed by a hash. Valid until the next
  // Read or Write on this object (a failure there may reconnect).
  const std::byte* MappedRegion() const;
  // Transports of the endpoint's lanes, e.g. {"cma/memory", "sysv/memory"}.
  std::vector<std::string> transports() const;

  struct Impl;

 private:
  explicit DataPlaneClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// RDMA devices found through libibverbs (ibv_get_device_list): their names;
// empty on machines without RDMA hardware.
std::vector<std::string> DiscoverRdmaDevices();

}  // namespace strata::dataplane

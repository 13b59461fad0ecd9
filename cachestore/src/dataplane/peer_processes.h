// The processes on this host that a node's data plane replies to, watched
// through pidfds, so that the node learns within one look that a client has
// exited. UCX 1.13 cannot tell it: same-host (shared-memory) endpoints
// refuse peer error handling, and a client killed during a rendezvous reply
// leaves that reply in flight for ever (issue #39).
//
// A client names its process in its hello (internal::PeerHello); nothing
// here checks the claim. The server only acts on it for endpoints whose
// peer could read the node's memory with cma anyway (see
// DataPlaneServer::Impl::ReleaseExitedPeers), so a false claim gains the
// claimer nothing. Progress thread only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

namespace strata::dataplane::internal {

class PeerProcesses {
 public:
  // Bounds on what a flood of hellos can make the node hold: processes
  // (one pidfd each) and endpoints.
  static constexpr size_t kMaxProcesses = 4096;
  static constexpr size_t kMaxEndpoints = 16384;

  PeerProcesses() = default;
  ~PeerProcesses();  // closes the pidfds
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  // Remembers that `endpoint` belongs to process `pid`, replacing what it
  // belonged to. False when that is not watched: pid not a process of
  // ours to watch (<= 1, or this process), pidfd_open failed (no such
  // process, kernel before 5.3, a sandbox), or a bound was reached.
  bool Watch(const void* endpoint, pid_t pid);
  // The process `endpoint` belongs to; 0 when not watched.
  pid_t PidOf(const void* endpoint) const;
  // The processes that have exited since the last call, forgotten now
  // with their endpoints. Does not block.
  std::vector<pid_t> TakeExited();

  size_t processes() const { return pidfd_.size(); }
  size_t endpoints() const { return endpoint_pid_.size(); }

 private:
  std::unordered_map<const void*, pid_t> endpoint_pid_;
  std::unordered_map<pid_t, int> pidfd_;
};

}  // namespace strata::dataplane::internal

// The processes on this host that a node's data plane replies to, watched
// through pidfds, so that the node learns within one look that a client has
// exited. UCX 1.13 cannot tell it: same-host (shared-memory) endpoints
// refuse peer error handling, and a client killed during a rendezvous reply
// leaves that reply in flight for ever (issue #39).
//
// A client names its process in its hello (internal::PeerHello); nothing
// here checks the claim. The server lets replies go on it only over
// endpoints whose peer could read the node's memory with cma anyway (see
// DataPlaneServer::Impl::HasCmaLane), so a false claim gains the claimer
// nothing, and one endpoint holds at most one pidfd. Progress thread only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace strata::dataplane::internal {

class PeerProcesses {
 public:
  // Bounds on what hellos can make the node hold: processes (one pidfd
  // each), endpoints, and endpoints per process (a client that reconnects
  // often leaves old endpoints behind; the oldest are forgotten first).
  static constexpr size_t kMaxProcesses = 4096;
  static constexpr size_t kMaxEndpoints = 16384;
  static constexpr size_t kMaxEndpointsPerProcess = 64;

  PeerProcesses() = default;
  ~PeerProcesses();  // closes the pidfds
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  // Forgets what `endpoint` was known as, then remembers that it belongs
  // to process `pid`. False when that is not watched: pid not a process to
  // watch (<= 1, or this process), pidfd_open failed (no such process,
  // kernel before 5.3, a sandbox), or a bound was reached.
  bool Watch(const void* endpoint, pid_t pid);
  // Forgets `endpoint` (a hello that names no process to watch); a pidfd
  // no endpoint names any more is closed.
  void Forget(const void* endpoint);
  // The live process `endpoint` belongs to; 0 when not watched.
  pid_t PidOf(const void* endpoint) const;
  // Whether `endpoint` belonged to a process that has exited: a reply to
  // it would never be taken.
  bool HasExited(const void* endpoint) const { return exited_.contains(endpoint); }
  // The processes that have exited since the last call; their endpoints
  // count as exited from now on. Does not block.
  std::vector<pid_t> TakeExited();

  size_t processes() const { return processes_.size(); }
  size_t endpoints() const { return endpoint_pid_.size(); }

 private:
  struct Process {
    int pidfd = -1;
    std::deque<const void*> endpoints;  // oldest first
  };
  void MarkExited(const void* endpoint);

  std::unordered_map<const void*, pid_t> endpoint_pid_;
  std::unordered_map<pid_t, Process> processes_;
  // Endpoints of exited processes, at most kMaxEndpoints (oldest dropped).
  std::unordered_set<const void*> exited_;
  std::deque<const void*> exited_order_;
};

}  // namespace strata::dataplane::internal

#include "dataplane/peer_processes.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // Linux 5.3; the same number on every architecture
#endif

namespace strata::dataplane::internal {

PeerProcesses::~PeerProcesses() {
  for (const auto& [pid, fd] : pidfd_) close(fd);
}

bool PeerProcesses::Watch(const void* endpoint, pid_t pid) {
  if (pid <= 1 || pid == getpid()) return false;
  if (!endpoint_pid_.contains(endpoint) && endpoint_pid_.size() >= kMaxEndpoints) return false;
  if (!pidfd_.contains(pid)) {
    if (pidfd_.size() >= kMaxProcesses) return false;
    const long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return false;
    pidfd_.emplace(pid, static_cast<int>(fd));
  }
  // A pidfd no endpoint names any more stays until its process exits:
  // at most kMaxProcesses of them.
  endpoint_pid_[endpoint] = pid;
  return true;
}

pid_t PeerProcesses::PidOf(const void* endpoint) const {
  const auto it = endpoint_pid_.find(endpoint);
  return it == endpoint_pid_.end() ? 0 : it->second;
}

std::vector<pid_t> PeerProcesses::TakeExited() {
  std::vector<pid_t> exited;
  if (pidfd_.empty()) return exited;
  std::vector<pollfd> fds;
  std::vector<pid_t> pids;
  fds.reserve(pidfd_.size());
  pids.reserve(pidfd_.size());
  for (const auto& [pid, fd] : pidfd_) {
    fds.push_back({fd, POLLIN, 0});
    pids.push_back(pid);
  }
  // A pidfd turns readable when its process exits.
  if (poll(fds.data(), fds.size(), 0) <= 0) return exited;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    close(fds[i].fd);
    pidfd_.erase(pids[i]);
    exited.push_back(pids[i]);
  }
  if (!exited.empty()) {
    std::erase_if(endpoint_pid_, [&](const auto& entry) {
      return std::find(exited.begin(), exited.end(), entry.second) != exited.end();
    });
  }
  return exited;
}

}  // namespace strata::dataplane::internal

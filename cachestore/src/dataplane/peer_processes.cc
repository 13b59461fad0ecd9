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
  for (const auto& [pid, process] : processes_) close(process.pidfd);
}

bool PeerProcesses::Watch(const void* endpoint, pid_t pid) {
  Forget(endpoint);
  if (pid <= 1 || pid == getpid() || endpoint_pid_.size() >= kMaxEndpoints) return false;
  auto it = processes_.find(pid);
  if (it == processes_.end()) {
    if (processes_.size() >= kMaxProcesses) return false;
    const long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return false;
    it = processes_.emplace(pid, Process{static_cast<int>(fd), {}}).first;
  }
  std::deque<const void*>& endpoints = it->second.endpoints;
  if (endpoints.size() >= kMaxEndpointsPerProcess) {
    endpoint_pid_.erase(endpoints.front());
    endpoints.pop_front();
  }
  endpoints.push_back(endpoint);
  endpoint_pid_[endpoint] = pid;
  return true;
}

void PeerProcesses::Forget(const void* endpoint) {
  exited_.erase(endpoint);  // its stale place in exited_order_ is skipped later
  const auto it = endpoint_pid_.find(endpoint);
  if (it == endpoint_pid_.end()) return;
  const auto process = processes_.find(it->second);
  endpoint_pid_.erase(it);
  if (process == processes_.end()) return;
  std::deque<const void*>& endpoints = process->second.endpoints;
  endpoints.erase(std::find(endpoints.begin(), endpoints.end(), endpoint));
  if (endpoints.empty()) {
    close(process->second.pidfd);
    processes_.erase(process);
  }
}

pid_t PeerProcesses::PidOf(const void* endpoint) const {
  const auto it = endpoint_pid_.find(endpoint);
  return it == endpoint_pid_.end() ? 0 : it->second;
}

void PeerProcesses::MarkExited(const void* endpoint) {
  if (!exited_.insert(endpoint).second) return;
  exited_order_.push_back(endpoint);
  while (exited_order_.size() > kMaxEndpoints) {
    // Entries forgotten meanwhile are gone from exited_ already.
    const void* oldest = exited_order_.front();
    exited_order_.pop_front();
    if (std::find(exited_order_.begin(), exited_order_.end(), oldest) == exited_order_.end()) {
      exited_.erase(oldest);
    }
  }
}

std::vector<pid_t> PeerProcesses::TakeExited() {
  std::vector<pid_t> exited;
  if (processes_.empty()) return exited;
  std::vector<pollfd> fds;
  std::vector<pid_t> pids;
  fds.reserve(processes_.size());
  pids.reserve(processes_.size());
  for (const auto& [pid, process] : processes_) {
    fds.push_back({process.pidfd, POLLIN, 0});
    pids.push_back(pid);
  }
  // A pidfd turns readable when its process exits.
  if (poll(fds.data(), fds.size(), 0) <= 0) return exited;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    const auto process = processes_.find(pids[i]);
    for (const void* endpoint : process->second.endpoints) {
      endpoint_pid_.erase(endpoint);
      MarkExited(endpoint);
    }
    close(process->second.pidfd);
    processes_.erase(process);
    exited.push_back(pids[i]);
  }
  return exited;
}

}  // namespace strata::dataplane::internal

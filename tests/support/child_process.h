// A child process for tests and benchmarks (a node, etcd, redis): started
// with posix_spawn, stdout and stderr into one log file, killed (SIGKILL)
// and reaped when the object goes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace strata::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts args[0] (looked up on PATH when `search_path`) with the log
  // truncated first. Kills a child this object still runs. False, with
  // *error set, when it cannot be spawned.
  bool Start(const std::vector<std::string>& args, const std::string& log_path, std::string* error,
             bool search_path = false);
  // True once the child has exited (and is reaped); *exit_status: its exit
  // code, or -1 when a signal ended it.
  bool HasExited(int* exit_status = nullptr);
  // SIGTERM, then waits up to `patience` for the exit; past it, SIGKILL.
  // Returns the exit code (-1: killed by a signal, or had to be).
  int Terminate(std::chrono::milliseconds patience = std::chrono::seconds(20));
  // SIGKILL and reap; a no-op when nothing runs.
  void Kill();

  std::string Log() const;
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ != 0; }

 private:
  pid_t pid_ = 0;
  std::string log_path_;
};

// A loopback TCP port nobody listens on right now (for a server started on
// it next, or a restart on the same port); 0 when the system gives none.
int FreePort();

}  // namespace strata::testing

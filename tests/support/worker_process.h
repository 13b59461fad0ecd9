// A real `strata-worker serve` (or `strata-router`) process for tests and
// benchmarks: started with the caller's flags, ready once it prints
// "listening http=PORT". Start needs STRATA_WORKER_BINARY defined to the
// worker's path; StartCommand runs any such server.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"

namespace strata::testing {

class WorkerProcess {
 public:
  // Starts `strata-worker serve --listen 127.0.0.1:0 <flags...>`; nullptr
  // with the log in *error when it does not come up.
#ifdef STRATA_WORKER_BINARY
  static std::unique_ptr<WorkerProcess> Start(const std::string& log_path,
                                              const std::vector<std::string>& flags,
                                              std::string* error) {
    std::vector<std::string> args = {STRATA_WORKER_BINARY, "serve", "--listen", "127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    return StartCommand(args, log_path, error);
  }
#endif

  // `args` (the binary first) with the log at `log_path`.
  static std::unique_ptr<WorkerProcess> StartCommand(const std::vector<std::string>& args,
                                                     const std::string& log_path,
                                                     std::string* error) {
    std::unique_ptr<WorkerProcess> w(new WorkerProcess());
    if (!w->process_.Start(args, log_path, error)) return nullptr;
    const std::regex listening(R"(listening http=(\d+))");
    for (int i = 0; i < 600; ++i) {  // up to 60 s: sanitizer builds make the model slowly
      std::smatch m;
      const std::string log = w->process_.Log();
      if (std::regex_search(log, m, listening)) {
        w->port_ = std::stoi(m[1]);
        return w;
      }
      if (w->process_.HasExited()) {
        *error = args[0] + " exited at start:\n" + log;
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *error = args[0] + " did not start in time:\n" + w->process_.Log();
    return nullptr;
  }

  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  std::string Log() const { return process_.Log(); }
  // SIGTERM without waiting (the worker drains).
  void SendSigterm() const { ::kill(process_.pid(), SIGTERM); }
  // Waits up to `patience` for the exit; its code, or -2 if still running.
  int WaitExit(std::chrono::milliseconds patience) {
    const auto until = std::chrono::steady_clock::now() + patience;
    int status = -2;
    while (!process_.HasExited(&status)) {
      if (std::chrono::steady_clock::now() > until) return -2;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status;
  }
  int Terminate() { return process_.Terminate(); }
  void Kill() { process_.Kill(); }

 private:
  WorkerProcess() = default;
  ChildProcess process_;
  int port_ = 0;
};

}  // namespace strata::testing

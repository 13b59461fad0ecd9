// Runs a real strata-node process for a test: its own config, tokens file
// and log in a temporary directory; stopped by SIGTERM or SIGKILL.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "node/token_auth.h"
#include "temp_dir.h"

namespace strata::testing {

// Tokens every node test knows: namespace, role and the token itself.
struct TestToken {
  const char* token;
  const char* ns;
  const char* role;
};
inline constexpr TestToken kTokenA{"token-a", "tenant-a", "write"};
inline constexpr TestToken kTokenB{"token-b", "tenant-b", "write"};
inline constexpr TestToken kTokenReadA{"token-read-a", "tenant-a", "read"};
inline constexpr TestToken kTokenAdminA{"token-admin-a", "tenant-a", "admin"};
inline constexpr TestToken kTokenAdminB{"token-admin-b", "tenant-b", "admin"};
inline constexpr TestToken kTokenOperator{"token-operator", "*", "admin"};

class NodeProcess {
 public:
  struct Options {
    int port = 0;                       // 0: any
    std::vector<std::string> settings;  // "key=value" config overrides
  };

  // Starts the node and waits for its "listening" line. On failure returns
  // nullptr and puts the log in *error. `tokens`: the tokens file; empty:
  // every kToken* above.
  static std::unique_ptr<NodeProcess> Start(const std::string& dir, const Options& options,
                                            std::string* error,
                                            const std::vector<TestToken>& tokens = {}) {
    std::unique_ptr<NodeProcess> n(new NodeProcess());
    n->dir_ = dir;
    n->log_path_ = dir + "/node-" + std::to_string(++Counter()) + ".log";
    const std::string tokens_file = dir + "/tokens";
    {
      std::ofstream out(tokens_file);
      const std::vector<TestToken> all = {kTokenA,      kTokenB,      kTokenReadA,
                                          kTokenAdminA, kTokenAdminB, kTokenOperator};
      for (const TestToken& t : tokens.empty() ? all : tokens) {
        out << HashToken(t.token) << " " << t.ns << " " << t.role << "\n";
      }
    }
    std::vector<std::string> args = {STRATA_NODE_BINARY,
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(options.port),
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--tokens-file",
                                     tokens_file,
                                     "--dram-bytes",
                                     "256MiB",
                                     "--set",
                                     "shutdown_grace=2s"};
    for (const std::string& s : options.settings) {
      args.emplace_back("--set");
      args.push_back(s);
    }
    if (!n->process_.Start(args, n->log_path_, error)) return nullptr;
    const std::regex listening(R"(listening grpc=(\d+) http=(\d+))");
    for (int i = 0; i < 300; ++i) {  // up to 30 s: sanitizer builds start slowly
      std::smatch m;
      const std::string log = n->Log();
      if (std::regex_search(log, m, listening)) {
        n->grpc_port_ = std::stoi(m[1]);
        n->http_port_ = std::stoi(m[2]);
        return n;
      }
      if (n->process_.HasExited()) {
        *error = "strata-node exited at start:\n" + n->Log();
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *error = "strata-node did not start in time:\n" + n->Log();
    return nullptr;
  }

  // SIGTERM and wait; returns the exit status (-1 if it had to be killed).
  int Terminate(std::chrono::seconds patience = std::chrono::seconds(20)) {
    if (!process_.running()) return exit_status_;
    exit_status_ = process_.Terminate(patience);
    return exit_status_;
  }
  void Kill() {
    if (!process_.running()) return;
    process_.Kill();
    exit_status_ = -1;
  }
  std::string Log() const { return process_.Log(); }
  std::string uri() const { return "strata://127.0.0.1:" + std::to_string(grpc_port_); }
  std::string target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  pid_t pid() const { return process_.pid(); }

 private:
  NodeProcess() = default;
  static int& Counter() {
    static int n = 0;
    return n;
  }
  std::string dir_, log_path_;
  ChildProcess process_;
  int grpc_port_ = 0, http_port_ = 0;
  int exit_status_ = 0;
};

}  // namespace strata::testing

// Runs a real etcd server for a test: loopback client and peer ports, its
// own data directory, killed (SIGKILL) or stopped (SIGTERM) on demand and
// restartable on the same port and data directory (an etcd restart test).
//
//   if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissing;
//   std::string error;
//   auto etcd = EtcdProcess::Start(TempDir("x") + "/etcd", &error);
//   ASSERT_NE(etcd, nullptr) << error;
//   etcd->endpoint();  // "http://127.0.0.1:<port>"
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"

namespace strata::testing {

class EtcdProcess {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kMissing =
      "etcd is not installed (/usr/bin/etcd; Debian package etcd-server): cluster tests need a "
      "real etcd";

  static bool Available() { return access(kBinary, X_OK) == 0; }

  // Starts etcd with `dir` as its data directory (created) and waits until
  // its client port answers. `client_port` 0 picks a free one. With
  // `extra_host` (an address of this machine) clients may also connect
  // there, on the same port. On failure returns nullptr and puts the log in
  // *error. `flags` go on etcd's command line as they are.
  static std::unique_ptr<EtcdProcess> Start(const std::string& dir, std::string* error,
                                            int client_port = 0, const std::string& extra_host = "",
                                            std::vector<std::string> flags = {}) {
    std::unique_ptr<EtcdProcess> e(new EtcdProcess());
    e->dir_ = dir;
    e->extra_host_ = extra_host;
    e->flags_ = std::move(flags);
    e->client_port_ = client_port != 0 ? client_port : FreePort();
    e->peer_port_ = FreePort();
    std::filesystem::create_directories(dir);
    if (!e->Launch(error)) return nullptr;
    return e;
  }

  ~EtcdProcess() { Kill(); }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // kill -9: no goodbye to anyone (leases stay until their TTL runs out on
  // the restarted server).
  void Kill() { process_.Kill(); }

  // Restarts a killed server on the same ports and data directory.
  bool Restart(std::string* error) {
    Kill();
    return Launch(error);
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  int client_port() const { return client_port_; }
  pid_t pid() const { return process_.pid(); }
  std::string Log() const { return process_.Log(); }

 private:
  EtcdProcess() = default;

  // etcd's GET /health says true once it has a leader and serves.
  static bool Healthy(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    std::string reply;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
      if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
        char buf[512];
        ssize_t n = 0;
        while ((n = read(fd, buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
      }
    }
    close(fd);
    return reply.find("\"health\":\"true\"") != std::string::npos;
  }

  bool Launch(std::string* error) {
    log_path_ = dir_ + "/etcd-" + std::to_string(++launches_) + ".log";
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    std::string listen = client;
    if (!extra_host_.empty())
      listen += ",http://" + extra_host_ + ":" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {kBinary,
                                     "--name",
                                     "strata-test",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     listen,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "strata-test=" + peer,
                                     "--logger",
                                     "zap",
                                     "--log-level",
                                     "warn"};
    args.insert(args.end(), flags_.begin(), flags_.end());
    if (!process_.Start(args, log_path_, error)) return false;
    for (int i = 0; i < 200; ++i) {  // up to 20 s
      if (Healthy(client_port_)) return true;
      if (process_.HasExited()) {
        *error = "etcd exited at start:\n" + Log();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *error = "etcd did not start in time:\n" + Log();
    Kill();
    return false;
  }

  std::string dir_, log_path_, extra_host_;
  std::vector<std::string> flags_;
  int client_port_ = 0, peer_port_ = 0;
  int launches_ = 0;
  ChildProcess process_;
};

}  // namespace strata::testing

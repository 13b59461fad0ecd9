// A node's registration in etcd (DESIGN §6): its NodeRecord under
// /strata/<cluster>/nodes/<node_id>, attached to an etcd lease that a
// background thread keeps alive (every TTL/3). If etcd goes away the thread
// keeps trying; if the lease is lost (expired while etcd was unreachable,
// or etcd came back empty) it registers again under a new lease. Draining
// is reflected in the record within ~100 ms. Deregister (or destruction)
// revokes the lease, so clients see the node leave at once instead of
// after the TTL.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/etcd_membership.h"
#include "strata/status.h"
#include "util/mutex.h"

namespace strata::cluster {

struct NodeRegistrationOptions {
  std::vector<std::string> etcd_endpoints;
  std::string cluster = "strata";
  NodeRecord record;  // info.node_id and info.address are required
  std::chrono::seconds lease_ttl{5};
  std::chrono::milliseconds call_timeout{1000};
  // Polled; when it turns true the record is rewritten with draining=true.
  std::function<bool()> draining;
};

class NodeRegistration {
 public:
  // Validates the options and starts the keep-alive thread. Does not wait
  // for etcd: a node starts (and serves) even while etcd is unreachable,
  // and registers as soon as it answers.
  static Result<std::unique_ptr<NodeRegistration>> Start(NodeRegistrationOptions options);
  ~NodeRegistration();
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

  // Stops the thread and revokes the lease (deleting the key). Safe to call
  // twice; returns the revoke's error, if any (the key then goes with the
  // lease's TTL).
  Status Deregister();

  // Whether the record is in etcd under a live lease, as of the last
  // successful round trip.
  bool registered() const;
  // How many times the record was written afresh: under a new lease, or
  // put back after someone deleted the key.
  uint64_t registrations() const;
  int64_t lease_id() const;

 private:
  explicit NodeRegistration(NodeRegistrationOptions options, std::unique_ptr<EtcdClient> client);
  // The keep-alive thread: registers while unregistered, else renews,
  // until Deregister.
  void Run();
  Status Register();

  // The keep-alive thread's timers and which outages it has logged.
  struct Renewal {
    std::chrono::milliseconds ttl{0};
    std::chrono::milliseconds keepalive_every{0};
    std::chrono::steady_clock::time_point last_renewed;
    std::chrono::steady_clock::time_point next_keepalive;
    std::chrono::steady_clock::time_point next_record_put;
    bool outage_logged = false;
    bool record_failure_logged = false;
  };
  // Registers afresh; returns how long to wait before the next round.
  std::chrono::milliseconds TryRegister(Renewal& r);
  // Follows the draining flag and keeps `lease` alive; returns how long to
  // wait before the next round, or nullopt when the lease is lost (lease_
  // is then 0, and the next round registers afresh at once).
  std::optional<std::chrono::milliseconds> Renew(Renewal& r, int64_t lease, bool written_draining);
  // Rewrites the record with `draining`; a refused update is retried after
  // kRetryInterval. Returns the failure only when the lease is gone.
  Status UpdateRecord(Renewal& r, int64_t lease, bool draining);
  // Renews `lease`, then checks that the key is still ours (CheckKey).
  Status KeepAlive(Renewal& r, int64_t lease, bool draining);
  // Puts the record back under `lease` if the key is gone (one transaction).
  Status CheckKey(int64_t lease, bool draining);
  bool Stopping();

  const NodeRegistrationOptions options_;
  const std::string key_;
  std::unique_ptr<EtcdClient> client_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool deregistered_ = false;
  int64_t lease_ = 0;  // 0: not registered
  bool written_draining_ = false;
  uint64_t registrations_ = 0;
  bool key_taken_logged_ = false;  // the keep-alive thread's
  std::thread thread_;
};

}  // namespace strata::cluster

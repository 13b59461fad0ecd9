// A small etcd v3 client over gRPC (the KV, Lease and Watch services of
// proto/etcd/): what membership and node registration need. Every call has
// a deadline; with several endpoints a call that finds one unreachable
// moves on to the next. Errors are Status values, never exceptions.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::cluster {

struct EtcdClientOptions {
  // "http://127.0.0.1:2379" or "127.0.0.1:2379"; tried in order, the one
  // that last answered first.
  std::vector<std::string> endpoints;
  std::chrono::milliseconds call_timeout{2000};
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;  // the store revision the listing reflects
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: the key, value empty
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
};

// What a prefix watch reports. `on_reset` gets the full listing whenever the
// watch (re)starts: first, and after a reconnect or a compaction, so a
// consumer replaces its state instead of patching it with events it may
// have missed. `on_events` gets the changes after that listing, in order.
// Both run on the watch's own thread, never concurrently.
struct EtcdWatchHandler {
  std::function<void(const EtcdRange&)> on_reset;
  std::function<void(const std::vector<EtcdEvent>&)> on_events;
  // Optional: each time the watch stream breaks (etcd gone, ...).
  std::function<void(const Status&)> on_error;
};

// A running prefix watch; the destructor stops it (and waits for a handler
// call in progress to return, or for a listing in flight: at most one call
// timeout per endpoint while etcd is unreachable). It may outlive the
// client that made it.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // How many times the listing was (re)loaded; for tests and metrics.
  virtual uint64_t resets() const = 0;
};

class EtcdClient {
 public:
  static Result<std::unique_ptr<EtcdClient>> Open(const EtcdClientOptions& options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Put with lease 0 is a key without a lease.
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // Puts the key only where there is none, in one transaction: nothing is
  // written when it exists, and what it holds then is returned (nullopt:
  // written). LEASE_EXPIRED for a lease etcd does not know.
  Result<std::optional<EtcdKeyValue>> PutIfAbsent(std::string_view key, std::string_view value,
                                                  int64_t lease = 0);
  // The key, if present: NOT_FOUND otherwise.
  Result<EtcdKeyValue> Get(std::string_view key);
  // Every key starting with `prefix`, sorted by key.
  Result<EtcdRange> GetPrefix(std::string_view prefix);
  // The number of keys deleted (0 when there was none).
  Result<int64_t> Delete(std::string_view key);
  Result<int64_t> DeletePrefix(std::string_view prefix);
  // Drops history before `revision` (watches from older revisions are
  // cancelled by the server).
  Status Compact(int64_t revision);

  Result<EtcdLease> LeaseGrant(int64_t ttl_seconds);
  // Deletes the lease and every key attached to it.
  Status LeaseRevoke(int64_t lease);
  // One keep-alive round trip; the lease's renewed TTL. LEASE_EXPIRED when
  // the server no longer knows the lease (expired, revoked, or lost with an
  // etcd that came back empty).
  Result<int64_t> LeaseKeepAlive(int64_t lease);

  // Watches every key under `prefix` (non-empty; see EtcdWatchHandler);
  // reconnects (with a re-list) until destroyed. The handler may not
  // destroy the returned watch.
  std::unique_ptr<EtcdWatch> WatchPrefix(std::string prefix, EtcdWatchHandler handler);

  const EtcdClientOptions& options() const;

  struct Impl;  // shared with running watches, which may outlive the client

 private:
  explicit EtcdClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// "k" -> the end of etcd's range of every key starting with "k" ("k" with
// its last byte incremented, carrying over 0xff bytes; "\0" for everything).
std::string PrefixRangeEnd(std::string_view prefix);

// "http://a:1, b:2" -> {"http://a:1", "b:2"}; INVALID_ARGUMENT when empty
// or an entry has no port.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

}  // namespace strata::cluster

#include "cluster/node_registration.h"
#include "util/mutex.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace strata::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the draining flag is looked at, and how soon a failed
// registration is tried again.
constexpr milliseconds kPollInterval{100};
constexpr milliseconds kRetryInterval{500};

}  // namespace

NodeRegistration::NodeRegistration(NodeRegistrationOptions options,
                                   std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)),
      key_(NodeKey(options_.cluster, options_.record.info.node_id)),
      client_(std::move(client)) {}

Result<std::unique_ptr<NodeRegistration>> NodeRegistration::Start(NodeRegistrationOptions options) {
  STRATA_RETURN_IF_ERROR(ValidateKeySegment("cluster name", options.cluster));
  STRATA_RETURN_IF_ERROR(ValidateKeySegment("node id", options.record.info.node_id));
  if (options.record.info.address.empty()) {
    return InvalidArgument("node registration needs the node's advertised address");
  }
  if (options.lease_ttl < std::chrono::seconds(1)) {
    return InvalidArgument("etcd lease TTL must be at least 1 s");
  }
  EtcdClientOptions client_options;
  client_options.endpoints = options.etcd_endpoints;
  client_options.call_timeout = options.call_timeout;
  Result<std::unique_ptr<EtcdClient>> client = EtcdClient::Open(client_options);
  if (!client.ok()) return client.status();
  // Logging here, before the thread exists, also builds spdlog's registry on
  // this thread (its lazy init in the prebuilt library is invisible to TSan).
  spdlog::debug("event=etcd_registration_starting node_id={} cluster={}",
                options.record.info.node_id, options.cluster);
  std::unique_ptr<NodeRegistration> r(
      new NodeRegistration(std::move(options), std::move(client).value()));
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

NodeRegistration::~NodeRegistration() {
  Status st = Deregister();
  if (!st.ok()) {
    spdlog::warn("event=etcd_deregister_failed key={} error=\"{}\"", key_, st.ToString());
  }
}

bool NodeRegistration::Stopping() {
  MutexLock lock(mu_);
  return stopping_;
}

bool NodeRegistration::registered() const {
  MutexLock lock(mu_);
  return lease_ != 0;
}

uint64_t NodeRegistration::registrations() const {
  MutexLock lock(mu_);
  return registrations_;
}

int64_t NodeRegistration::lease_id() const {
  MutexLock lock(mu_);
  return lease_;
}

Status NodeRegistration::Register() {
  const bool draining = options_.draining && options_.draining();
  Result<EtcdLease> lease = client_->LeaseGrant(options_.lease_ttl.count());
  if (!lease.ok()) return lease.status();
  NodeRecord record = options_.record;
  record.info.draining = draining;
  if (Status st = client_->Put(key_, EncodeNodeRecord(record), lease->id); !st.ok()) {
    // The lease would only time out; give it back now.
    (void)client_->LeaseRevoke(lease->id);
    return st;
  }
  uint64_t n = 0;
  {
    MutexLock lock(mu_);
    lease_ = lease->id;
    written_draining_ = draining;
    n = ++registrations_;
  }
  spdlog::info("event=etcd_registered key={} lease={} ttl_s={} draining={} registrations={}", key_,
               lease->id, lease->ttl_seconds, draining, n);
  return Status::Ok();
}

void NodeRegistration::Run() {
  Renewal r;
  r.ttl = options_.lease_ttl;
  r.keepalive_every = std::max(r.ttl / 3, kPollInterval);
  r.last_renewed = Clock::now();
  r.next_keepalive = Clock::now();
  r.next_record_put = Clock::now();
  while (!Stopping()) {
    int64_t lease = 0;
    bool written_draining = false;
    {
      MutexLock lock(mu_);
      lease = lease_;
      written_draining = written_draining_;
    }
    milliseconds pause = kPollInterval;
    if (lease == 0) {
      pause = TryRegister(r);
    } else if (std::optional<milliseconds> renewed = Renew(r, lease, written_draining)) {
      pause = *renewed;
    } else {
      continue;  // lost: register afresh at once
    }
    MutexLock lock(mu_);
    cv_.wait_for(lock.native(), pause, [&] { return stopping_; });
  }
}

milliseconds NodeRegistration::TryRegister(Renewal& r) {
  const Status st = Register();
  if (st.ok()) {
    r.outage_logged = false;
    r.last_renewed = Clock::now();
    r.next_keepalive = r.last_renewed + r.keepalive_every;
    return kPollInterval;
  }
  if (!r.outage_logged) {
    spdlog::warn("event=etcd_register_failed key={} error=\"{}\" retry_ms={}", key_, st.ToString(),
                 kRetryInterval.count());
    r.outage_logged = true;
  }
  return kRetryInterval;
}

std::optional<milliseconds> NodeRegistration::Renew(Renewal& r, int64_t lease,
                                                    bool written_draining) {
  Status st = Status::Ok();
  const bool draining = options_.draining && options_.draining();
  // A refused update (etcd out of space refuses every Put but renews
  // leases) is retried later; the keep-alives go on meanwhile.
  if (draining != written_draining && Clock::now() >= r.next_record_put) {
    st = UpdateRecord(r, lease, draining);
  }
  if (st.ok() && Clock::now() >= r.next_keepalive) st = KeepAlive(r, lease, draining);
  // A lease etcd no longer knows, or one not renewed for a whole TTL
  // (it may have expired while etcd was away): register afresh. A new
  // lease takes the key over, so the old one expires without it.
  const bool lost =
      st.code() == StatusCode::kLeaseExpired || (!st.ok() && Clock::now() - r.last_renewed > r.ttl);
  if (!st.ok() && !r.outage_logged) {
    spdlog::warn("event=etcd_keepalive_failed key={} lease={} error=\"{}\"", key_, lease,
                 st.ToString());
    r.outage_logged = true;
  }
  if (lost) {
    spdlog::warn("event=etcd_lease_lost key={} lease={}", key_, lease);
    MutexLock lock(mu_);
    lease_ = 0;
    return std::nullopt;
  }
  return std::clamp(std::chrono::duration_cast<milliseconds>(r.next_keepalive - Clock::now()),
                    milliseconds(1), kPollInterval);
}

Status NodeRegistration::UpdateRecord(Renewal& r, int64_t lease, bool draining) {
  NodeRecord record = options_.record;
  record.info.draining = draining;
  const Status put = client_->Put(key_, EncodeNodeRecord(record), lease);
  if (put.ok()) {
    MutexLock lock(mu_);
    written_draining_ = draining;
    spdlog::info("event=etcd_record_updated key={} draining={}", key_, draining);
    r.record_failure_logged = false;
    return Status::Ok();
  }
  r.next_record_put = Clock::now() + kRetryInterval;
  if (!r.record_failure_logged) {
    spdlog::warn("event=etcd_record_update_failed key={} error=\"{}\" retry_ms={}", key_,
                 put.ToString(), kRetryInterval.count());
    r.record_failure_logged = true;
  }
  return put.code() == StatusCode::kLeaseExpired ? put : Status::Ok();
}

Status NodeRegistration::KeepAlive(Renewal& r, int64_t lease, bool draining) {
  Result<int64_t> renewed = client_->LeaseKeepAlive(lease);
  Status st = renewed.status();
  if (st.ok()) {
    r.last_renewed = Clock::now();
    r.next_keepalive = r.last_renewed + r.keepalive_every;
    r.outage_logged = false;
    // Only a lease found gone counts against it; a failed check is tried
    // again at the next keep-alive.
    if (Status key = CheckKey(lease, draining); key.code() == StatusCode::kLeaseExpired) {
      st = key;
    } else if (!key.ok()) {
      spdlog::warn("event=etcd_key_check_failed key={} error=\"{}\"", key_, key.ToString());
    }
  } else {
    r.next_keepalive = Clock::now() + kRetryInterval;
  }
  return st;
}

// A live lease does not keep the key: an operator's delete, or a second
// node started with this node id, takes it away, and the node would serve
// on unseen. A missing key is put back; one held by another lease is the
// other node's, so it is reported, not fought over. One transaction does
// both, so a node taking the key meanwhile is never overwritten.
Status NodeRegistration::CheckKey(int64_t lease, bool draining) {
  NodeRecord record = options_.record;
  record.info.draining = draining;
  Result<std::optional<EtcdKeyValue>> held =
      client_->PutIfAbsent(key_, EncodeNodeRecord(record), lease);
  if (!held.ok()) return held.status();
  if (held->has_value()) {
    const int64_t holder = (*held)->lease;
    if (holder != lease && !key_taken_logged_) {
      spdlog::error(
          "event=etcd_key_taken key={} lease={} other_lease={}: another node "
          "registered with this node id",
          key_, lease, holder);
      key_taken_logged_ = true;
    } else if (holder == lease) {
      key_taken_logged_ = false;
    }
    return Status::Ok();
  }
  {
    MutexLock lock(mu_);
    written_draining_ = draining;
    ++registrations_;
  }
  spdlog::warn("event=etcd_key_restored key={} lease={}", key_, lease);
  return Status::Ok();
}

Status NodeRegistration::Deregister() {
  {
    MutexLock lock(mu_);
    if (deregistered_) return Status::Ok();
    deregistered_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  int64_t lease = 0;
  {
    MutexLock lock(mu_);
    lease = lease_;
    lease_ = 0;
  }
  if (lease == 0) return Status::Ok();
  Status st = client_->LeaseRevoke(lease);
  if (st.code() == StatusCode::kLeaseExpired) return Status::Ok();  // gone already
  if (st.ok()) spdlog::info("event=etcd_deregistered key={} lease={}", key_, lease);
  return st;
}

}  // namespace strata::cluster

// Leases: renewal and abort, and read-lease releases batched into the next
// call (or a flush within milliseconds).
#include "remote/remote_store_impl.h"
#include "util/mutex.h"

namespace strata {

Status RemoteStore::RenewLease(LeaseId lease, Nanos ttl) {
  if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl must be in [0, 10m]");
  v1::RenewLeaseRequest req;
  req.set_lease_id(lease);
  req.set_ttl_ms(static_cast<uint32_t>(ttl / kNanosPerMilli));
  v1::RenewLeaseResponse resp;
  const Nanos sent = SteadyClock().Now();
  STRATA_RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return stub_->RenewLease(c, req, &resp); },
           /*idempotent=*/true));
  const Nanos expiry = sent + Nanos{resp.ttl_ms()} * kNanosPerMilli;
  {
    MutexLock lock(staged_mu_);
    if (auto it = staged_.find(lease); it != staged_.end()) {
      it->second.expiry = expiry;
      it->second.ttl = Nanos{resp.ttl_ms()} * kNanosPerMilli;
    }
  }
  MutexLock lock(leases_mu_);
  if (auto it = lease_expiry_.find(lease); it != lease_expiry_.end()) it->second = expiry;
  return Status::Ok();
}

void RemoteStore::Release(LeaseId lease) {
  if (lease == 0) return;
  {
    // A released reservation is aborted by the node: its buffers go.
    MutexLock lock(staged_mu_);
    staged_.erase(lease);
  }
  {
    MutexLock lock(leases_mu_);
    lease_expiry_.erase(lease);
  }
  {
    MutexLock lock(release_mu_);
    // Past the cap the oldest are dropped: they still end at expiry.
    if (releases_.size() >= kMaxQueuedReleases) releases_.erase(releases_.begin());
    releases_.push_back(lease);
  }
  release_cv_.notify_one();
}

Status RemoteStore::Abort(LeaseId lease) {
  {
    MutexLock lock(staged_mu_);
    staged_.erase(lease);
  }
  {
    MutexLock lock(leases_mu_);
    lease_expiry_.erase(lease);
  }
  v1::AbortRequest req;
  req.set_lease_id(lease);
  v1::AbortResponse resp;
  return Call([&](grpc::ClientContext* c) { return stub_->Abort(c, req, &resp); },
              /*idempotent=*/true);
}

void RemoteStore::FlushReleases() {
  constexpr auto kReleaseDelay = std::chrono::milliseconds(2);
  MutexLock lock(release_mu_);
  while (true) {
    release_cv_.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_) {
      return stopping_ || !releases_.empty();
    });
    if (!stopping_) {
      release_cv_.wait_for(lock.native(), kReleaseDelay,
                           [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_) { return stopping_; });
    }
    std::vector<LeaseId> batch;
    batch.swap(releases_);
    if (batch.empty() && stopping_) return;
    lock.Unlock();
    // One Abort call per kMaxReleasesPerMatch leases; failures are not
    // retried (a node that is down took its leases with it, and an
    // unreachable one lets them expire).
    for (size_t i = 0; i < batch.size(); i += kMaxReleasesPerMatch) {
      v1::AbortRequest req;
      for (size_t j = i; j < std::min(batch.size(), i + kMaxReleasesPerMatch); ++j) {
        req.add_release_leases(batch[j]);
      }
      v1::AbortResponse resp;
      (void)Call([&](grpc::ClientContext* c) { return stub_->Abort(c, req, &resp); },
                 /*idempotent=*/true);
    }
    lock.Lock();
  }
}

bool RemoteStore::LeaseEnded(LeaseId lease) {
  MutexLock lock(leases_mu_);
  auto it = lease_expiry_.find(lease);
  return it != lease_expiry_.end() && SteadyClock().Now() >= it->second;
}

}  // namespace strata

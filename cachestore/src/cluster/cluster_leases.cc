// Cluster leases: renewal, abort and release fanned out to the nodes' leases.
#include "cluster/cluster_store_impl.h"
#include "util/mutex.h"

namespace strata {

Status ClusterStore::RenewLease(LeaseId lease_id, Nanos ttl) {
  if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl must be in [0, 10m]");
  std::shared_ptr<ReadLease> read;
  std::shared_ptr<WriteLease> write;
  {
    MutexLock lock(leases_mu_);
    if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) read = it->second;
    if (auto it = write_leases_.find(lease_id); it != write_leases_.end()) write = it->second;
  }
  std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> parts;
  if (read != nullptr) parts = read->parts;
  if (write != nullptr) {
    for (const WritePart& p : write->parts) {
      if (p.reservation.write_lease != 0) parts.emplace_back(p.node, p.reservation.write_lease);
    }
  }
  if (parts.empty()) return LeaseExpired("lease " + std::to_string(lease_id) + " is not live");
  const Nanos sent = SteadyClock().Now();
  std::vector<Status> results(parts.size());
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < parts.size(); ++i) {
    tasks.emplace_back([&, i] {
      results[i] = OnNode(*parts[i].first, kWrites, [&](NodeClient& client) {
        return client.RenewLease(parts[i].second, ttl);
      });
    });
  }
  pool_.RunAll(std::move(tasks));
  if (write != nullptr) {
    // Every replica that reserved must still hold its space.
    for (const Status& st : results) STRATA_RETURN_IF_ERROR(st);
    // With ttl 0 each node applies its own default, which we do not
    // know: assume the longest a lease may have.
    const Nanos held = ttl > 0 ? ttl : kMaxLeaseTtl;
    MutexLock lock(leases_mu_);
    write->reclaim_at = std::max(write->reclaim_at, sent + 2 * held);
    return Status::Ok();
  }
  // A read lease survives while every block of the prefix keeps at least
  // one replica whose lease renewed; fetches then skip the others.
  std::vector<LeaseId> lost;
  Status first_error;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!results[i].ok()) {
      lost.push_back(parts[i].second);
      if (first_error.ok()) first_error = results[i];
    }
  }
  auto renewed = std::make_shared<ReadLease>(*read);
  // Only prunes our table; the nodes keep their own clocks (0: their
  // default of 10 s).
  renewed->expiry = sent + (ttl > 0 ? ttl : kDefaultReadLeaseTtl);
  auto gone = [&](const Holder& h) {
    return std::find(lost.begin(), lost.end(), h.lease) != lost.end();
  };
  for (std::vector<Holder>& hs : renewed->holders) std::erase_if(hs, gone);
  std::erase_if(renewed->swa, gone);
  // Parts dropped here are never released later: end them now (a part
  // that only timed out or was skipped may still hold its pins).
  std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> dropped;
  std::erase_if(renewed->parts, [&](const auto& part) {
    const bool drop = std::find(lost.begin(), lost.end(), part.second) != lost.end();
    if (drop) dropped.push_back(part);
    return drop;
  });
  ReleaseParts(dropped);
  const bool whole = std::all_of(renewed->holders.begin(), renewed->holders.end(),
                                 [](const std::vector<Holder>& hs) { return !hs.empty(); });
  MutexLock lock(leases_mu_);
  if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) it->second = renewed;
  return whole ? Status::Ok() : first_error;
}

Status ClusterStore::Abort(LeaseId lease_id) {
  std::shared_ptr<ReadLease> read;
  std::shared_ptr<WriteLease> write;
  {
    MutexLock lock(leases_mu_);
    if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) {
      read = std::move(it->second);
      read_leases_.erase(it);
    }
    if (auto it = write_leases_.find(lease_id); it != write_leases_.end()) {
      write = std::move(it->second);
      write_leases_.erase(it);
    }
  }
  if (write != nullptr) AbortParts(*write);
  if (read != nullptr) AbortParts(read->parts);
  return Status::Ok();  // unknown or ended leases are fine: abort is idempotent
}

void ClusterStore::Release(LeaseId lease_id) {
  std::shared_ptr<ReadLease> read;
  {
    MutexLock lock(leases_mu_);
    if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) {
      read = std::move(it->second);
      read_leases_.erase(it);
    }
  }
  if (read == nullptr) {
    (void)Abort(lease_id);
    return;
  }
  ReleaseParts(read->parts);
}

void ClusterStore::AbortParts(const WriteLease& lease) {
  std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> parts;
  for (const WritePart& p : lease.parts) {
    if (p.reservation.write_lease != 0) parts.emplace_back(p.node, p.reservation.write_lease);
  }
  AbortParts(parts);
}

void ClusterStore::ReleaseParts(
    const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts) {
  for (const auto& [node, lease] : parts) {
    Result<std::shared_ptr<NodeClient>> client = Client(*node, /*probe=*/false);
    if (client.ok()) (*client)->Release(lease);  // else it ends at its expiry
  }
}

void ClusterStore::AbortParts(
    const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts) {
  std::vector<std::function<void()>> tasks;
  tasks.reserve(parts.size());
  for (const auto& [node, lease] : parts) {
    tasks.emplace_back([&node = node, lease = lease, this] {
      bool asked = false;
      (void)OnNode(*node, kWrites, [&](NodeClient& client) {
        asked = true;
        return client.Abort(lease);
      });
      if (!asked) ReleaseParts({{node, lease}});
    });
  }
  pool_.RunAll(std::move(tasks));
}

}  // namespace strata

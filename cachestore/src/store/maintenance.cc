// The maintenance thread: lease expiry, TTLs, watermarks, SSD upkeep.
#include "store/cache_store_impl.h"

namespace strata {

void CacheStore::Impl::MaintenanceLoop() {
  std::unique_lock lock(maintenance_mu);
  while (!stopping) {
    maintenance_cv.wait_for(lock, std::chrono::nanoseconds(opts.maintenance_interval));
    if (stopping) break;
    lock.unlock();
    RunMaintenance();
    MaybeRunSsdMaintenance(/*background=*/true);
    lock.lock();
  }
}

MaintenanceReport CacheStore::Impl::RunMaintenance() {
  MaintenanceReport report;
  const Nanos now = clock->Now();
  for (LeaseRecord& rec : leases.TakeExpired(now)) {
    (rec.write ? report.expired_write_leases : report.expired_read_leases)++;
    EndLease(rec, /*expired=*/true);
  }
  std::lock_guard lock(structure_mu);
  for (Entry*& head : ttl_head) {  // DeleteSubtreeLocked advances head
    while (head != nullptr && head->expiry <= now) {
      report.ttl_expired += DeleteSubtreeLocked(head, EvictReason::kTtl);
    }
  }
  report.evicted = EvictToWatermarkLocked(now);
  return report;
}

void CacheStore::Impl::MaybeRunSsdMaintenance(bool background) {
  if (ssd == nullptr) return;
  {
    std::lock_guard lock(maintenance_mu);
    if (background && maintenance_runs++ % 10 != 0) return;
  }
  ssd->RunMaintenance();
}

}  // namespace strata

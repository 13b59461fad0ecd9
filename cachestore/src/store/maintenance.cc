// The maintenance thread: lease expiry, TTLs, watermarks, SSD upkeep.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

void CacheStore::Impl::MaintenanceLoop() {
  MutexLock lock(maintenance_mu);
  while (!stopping) {
    maintenance_cv.wait_for(lock.native(), std::chrono::nanoseconds(opts.maintenance_interval));
    if (stopping) break;
    lock.Unlock();
    RunMaintenance();
    MaybeRunSsdMaintenance(/*background=*/true);
    lock.Lock();
  }
}

MaintenanceReport CacheStore::Impl::RunMaintenance() {
  MaintenanceReport report;
  const Nanos now = clock->Now();
  for (LeaseRecord& rec : leases.TakeExpired(now)) {
    (rec.write ? report.expired_write_leases : report.expired_read_leases)++;
    EndLease(rec, /*expired=*/true);
  }
  MutexLock lock(structure_mu);
  for (Entry*& head : ttl_head) {  // DeleteSubtree advances head
    while (head != nullptr && head->expiry <= now) {
      report.ttl_expired += DeleteSubtree(head, EvictReason::kTtl);
    }
  }
  report.evicted = EvictToWatermark(now);
  return report;
}

void CacheStore::Impl::MaybeRunSsdMaintenance(bool background) {
  if (ssd == nullptr) return;
  {
    MutexLock lock(maintenance_mu);
    if (background && maintenance_runs++ % 10 != 0) return;
  }
  ssd->RunMaintenance();
}

}  // namespace strata

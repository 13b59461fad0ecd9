// Live read and write leases, and admin pins. A lease names the entries it
// holds; the entries' own counters are what eviction looks at, this table
// is what lets a lease be renewed, ended, or found expired. Pins are here
// for their bytes: a namespace's leases and pins share one cap, checked
// under one lock, so neither can take room the other was granted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "eviction/entry.h"
#include "strata/status.h"
#include "strata/store_types.h"
#include "util/mutex.h"

namespace strata {

struct LeaseRecord {
  LeaseId id = 0;
  uint32_t ns = 0;
  bool write = false;
  Nanos granted = 0;
  Nanos expiry = 0;
  std::vector<EntryRef> entries;
  // Write leases: the batch position of each entry, and the batch size, so
  // publish can line its checksums and results up with the reservation.
  std::vector<uint32_t> positions;
  std::vector<std::optional<ChainKey>> parents;  // GLOBAL_KV parent of each entry
  uint32_t batch_size = 0;
  uint64_t reserved_bytes = 0;  // write leases: their entries' extents (set by Grant)
};

// What one namespace may hold at once: entries of every lease (an entry in
// two leases counts twice: each costs a record here), and DRAM bytes: what
// its read leases pin, counted by the store (each entry once, as it is
// pinned, so before its lease is granted), plus the extents its write
// leases reserve, plus the extents of its entries an admin pinned (an
// entry both pinned and read counts twice: neither knows when the other
// ends).
struct LeaseLimits {
  uint64_t entries = UINT64_MAX;
  uint64_t bytes = UINT64_MAX;
  const std::atomic<int64_t>* read_pinned_bytes = nullptr;  // none: 0
};

// What one namespace's leases hold, live or expired (until taken), and its
// admin pins that have not run out.
struct HeldByLeases {
  uint64_t entries = 0;
  uint64_t reserved_bytes = 0;
  uint64_t admin_pinned_bytes = 0;
};

class LeaseTable {
 public:
  LeaseTable();
  // Assigns an id and takes the record (moved from), unless the record's
  // namespace would then hold more than `limits` allow: RESOURCE_EXHAUSTED,
  // and the record is left as it was for the caller to release. The check
  // and the grant are one step, so concurrent grants never overshoot (a
  // read lease's pins are counted before its grant: a reservation granted
  // meanwhile sees them). `record.granted` is now.
  Result<LeaseId> Grant(LeaseRecord& record, const LeaseLimits& limits);

  // Counts an admin pin of `e` (`bytes` of namespace `ns`) until `until`,
  // or moves the end of the pin counted for it; RESOURCE_EXHAUSTED, and
  // nothing changed, if the namespace would then hold more than
  // `limits.bytes`, leases and pins together.
  Status HoldPin(const Entry* e, uint32_t ns, uint64_t bytes, Nanos now, Nanos until,
                 const LeaseLimits& limits);
  // Stops counting `e`'s pin (unpinned, or the entry is freed); none: no-op.
  void DropPin(const Entry* e);
  // Whether live-or-expired lease `id` of namespace `ns` is a write lease;
  // nullopt if unknown.
  std::optional<bool> IsWrite(uint32_t ns, LeaseId id) const;

  // Runs `fn` on a live lease of namespace `ns` under the table's lock, so
  // the lease cannot end meanwhile. NOT_FOUND for another namespace's or an
  // unknown id, LEASE_EXPIRED once past its expiry.
  Status WithLive(uint32_t ns, LeaseId id, Nanos now,
                  const std::function<void(const LeaseRecord&)>& fn) const;
  // Moves a live lease's expiry to `new_expiry`; RESOURCE_EXHAUSTED, and
  // the lease left as it is, past `longest_life` after its grant.
  Status Renew(uint32_t ns, LeaseId id, Nanos now, Nanos new_expiry, Nanos longest_life);
  // Removes and returns the lease whatever its expiry; nullopt if unknown.
  std::optional<LeaseRecord> Take(uint32_t ns, LeaseId id);
  std::vector<LeaseRecord> TakeExpired(Nanos now);
  std::vector<LeaseRecord> TakeAll();

  size_t live(bool write) const;
  // As of `now`: pins that ran out by then are no longer counted.
  HeldByLeases held(uint32_t ns, Nanos now) const;

 private:
  struct PinRecord {
    uint32_t ns = 0;
    uint64_t bytes = 0;
    Nanos until = 0;
  };

  mutable Mutex mu_;
  // Starts at random: clients name leases by id alone, so a node restarted
  // must not hand out the ids its previous life did (a client's late abort
  // or write of the old lease would land on someone else's new one).
  LeaseId next_id_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<LeaseId, LeaseRecord> leases_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint32_t, HeldByLeases> held_ ABSL_GUARDED_BY(mu_);  // by namespace
  std::unordered_map<const Entry*, PinRecord> pins_ ABSL_GUARDED_BY(mu_);
  std::multimap<Nanos, const Entry*> pin_ends_ ABSL_GUARDED_BY(mu_);  // each pin's `until`

  void Forget(const LeaseRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `ns` holds with pins that ran out by `now` no longer counted.
  HeldByLeases Held(uint32_t ns, Nanos now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the pins that ran out by `now`.
  void DropEndedPins(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes `limits` counts for `ns` outside this table (its read pins).
  static uint64_t ReadPinnedBytes(const LeaseLimits& limits);
  void DropPinRecord(std::unordered_map<const Entry*, PinRecord>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ErasePinEnd(const Entry* e, Nanos until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetIfEmpty(uint32_t ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace strata

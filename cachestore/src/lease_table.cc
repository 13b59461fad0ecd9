#include "lease_table.h"

#include <random>

namespace strata {

namespace {
// Below 2^53, so ids stay exact as JSON numbers; two nodes' ranges then
// meet with odds of about (leases granted) / 2^52.
constexpr LeaseId kLeaseIdMask = (LeaseId{1} << 52) - 1;
}  // namespace

LeaseTable::LeaseTable() {
  std::random_device rd;
  next_id_ = ((LeaseId{rd()} << 32) | rd()) & kLeaseIdMask;
}

LeaseId LeaseTable::Grant(LeaseRecord record) {
  std::lock_guard lock(mu_);
  do {
    next_id_ = (next_id_ + 1) & kLeaseIdMask;  // 0 is "no lease"
  } while (next_id_ == 0 || leases_.contains(next_id_));
  record.id = next_id_;
  const LeaseId id = record.id;
  leases_.emplace(id, std::move(record));
  return id;
}

std::optional<bool> LeaseTable::IsWrite(uint32_t ns, LeaseId id) const {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) return std::nullopt;
  return it->second.write;
}

Status LeaseTable::WithLive(uint32_t ns, LeaseId id, Nanos now,
                            const std::function<void(const LeaseRecord&)>& fn) const {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) {
    return LeaseExpired("lease " + std::to_string(id) + " is not live (expired or released)");
  }
  if (it->second.expiry <= now) return LeaseExpired("lease " + std::to_string(id) + " expired");
  fn(it->second);
  return Status::Ok();
}

Status LeaseTable::Renew(uint32_t ns, LeaseId id, Nanos now, Nanos new_expiry) {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) {
    return LeaseExpired("lease " + std::to_string(id) + " is not live (expired or released)");
  }
  if (it->second.expiry <= now) return LeaseExpired("lease " + std::to_string(id) + " expired");
  it->second.expiry = new_expiry;
  return Status::Ok();
}

std::optional<LeaseRecord> LeaseTable::Take(uint32_t ns, LeaseId id) {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) return std::nullopt;
  LeaseRecord record = std::move(it->second);
  leases_.erase(it);
  return record;
}

std::vector<LeaseRecord> LeaseTable::TakeExpired(Nanos now) {
  std::lock_guard lock(mu_);
  std::vector<LeaseRecord> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      out.push_back(std::move(it->second));
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<LeaseRecord> LeaseTable::TakeAll() {
  std::lock_guard lock(mu_);
  std::vector<LeaseRecord> out;
  out.reserve(leases_.size());
  for (auto& [id, record] : leases_) out.push_back(std::move(record));
  leases_.clear();
  return out;
}

size_t LeaseTable::live(bool write) const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, record] : leases_) n += record.write == write;
  return n;
}

}  // namespace strata

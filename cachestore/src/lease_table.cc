#include "lease_table.h"

#include <algorithm>
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
  leased_entries_[record.ns] += record.entries.size();
  leases_.emplace(id, std::move(record));
  return id;
}

void LeaseTable::ForgetLocked(const LeaseRecord& record) {
  auto it = leased_entries_.find(record.ns);
  if (it == leased_entries_.end()) return;
  it->second -= std::min<uint64_t>(it->second, record.entries.size());
  if (it->second == 0) leased_entries_.erase(it);
}

uint64_t LeaseTable::leased_entries(uint32_t ns) const {
  std::lock_guard lock(mu_);
  auto it = leased_entries_.find(ns);
  return it == leased_entries_.end() ? 0 : it->second;
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

Status LeaseTable::Renew(uint32_t ns, LeaseId id, Nanos now, Nanos new_expiry, Nanos longest_life) {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) {
    return LeaseExpired("lease " + std::to_string(id) + " is not live (expired or released)");
  }
  if (it->second.expiry <= now) return LeaseExpired("lease " + std::to_string(id) + " expired");
  if (new_expiry - it->second.granted > longest_life) {
    // Refused rather than cut short: a client must not believe it holds
    // the lease (and its buffers) for longer than it does.
    return ResourceExhausted("lease " + std::to_string(id) + " cannot be renewed past " +
                             std::to_string(longest_life / kNanosPerSecond) +
                             " s after its grant; it ends at its current expiry");
  }
  it->second.expiry = new_expiry;
  return Status::Ok();
}

std::optional<LeaseRecord> LeaseTable::Take(uint32_t ns, LeaseId id) {
  std::lock_guard lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) return std::nullopt;
  LeaseRecord record = std::move(it->second);
  leases_.erase(it);
  ForgetLocked(record);
  return record;
}

std::vector<LeaseRecord> LeaseTable::TakeExpired(Nanos now) {
  std::lock_guard lock(mu_);
  std::vector<LeaseRecord> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      ForgetLocked(it->second);
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
  leased_entries_.clear();
  return out;
}

size_t LeaseTable::live(bool write) const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, record] : leases_) n += record.write == write;
  return n;
}

}  // namespace strata

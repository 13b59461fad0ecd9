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

Result<LeaseId> LeaseTable::Grant(LeaseRecord& record, const LeaseLimits& limits) {
  // A write lease's entries are reserved by the caller: their extents stay put.
  uint64_t bytes = 0;
  if (record.write) {
    for (const EntryRef& ref : record.entries) bytes += ref.entry->extent.length;
  }
  std::lock_guard lock(mu_);
  const HeldByLeases before = held_.contains(record.ns) ? held_.at(record.ns) : HeldByLeases{};
  if (before.entries + record.entries.size() > limits.entries) {
    return ResourceExhausted("its leases hold " + std::to_string(before.entries) + " entries; " +
                             std::to_string(record.entries.size()) + " more would pass the " +
                             std::to_string(limits.entries) + " allowed");
  }
  const uint64_t pinned =
      limits.read_pinned_bytes == nullptr
          ? 0
          : static_cast<uint64_t>(std::max<int64_t>(limits.read_pinned_bytes->load(), 0));
  if (pinned + before.reserved_bytes + bytes > limits.bytes) {
    return ResourceExhausted("its leases hold " + std::to_string(pinned + before.reserved_bytes) +
                             " bytes of the DRAM tier (" + std::to_string(pinned) +
                             " pinned by reads, " + std::to_string(before.reserved_bytes) +
                             " reserved); " + std::to_string(bytes) + " more would pass the " +
                             std::to_string(limits.bytes) +
                             " allowed (max_held_share_per_namespace)");
  }
  do {
    next_id_ = (next_id_ + 1) & kLeaseIdMask;  // 0 is "no lease"
  } while (next_id_ == 0 || leases_.contains(next_id_));
  record.id = next_id_;
  record.reserved_bytes = bytes;
  HeldByLeases& held = held_[record.ns];
  held.entries += record.entries.size();
  held.reserved_bytes += bytes;
  const LeaseId id = record.id;
  leases_.emplace(id, std::move(record));
  return id;
}

void LeaseTable::ForgetLocked(const LeaseRecord& record) {
  auto it = held_.find(record.ns);
  if (it == held_.end()) return;
  HeldByLeases& held = it->second;
  held.entries -= std::min<uint64_t>(held.entries, record.entries.size());
  held.reserved_bytes -= std::min(held.reserved_bytes, record.reserved_bytes);
  if (held.entries == 0) held_.erase(it);
}

HeldByLeases LeaseTable::held(uint32_t ns) const {
  std::lock_guard lock(mu_);
  auto it = held_.find(ns);
  return it == held_.end() ? HeldByLeases{} : it->second;
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
  held_.clear();
  return out;
}

size_t LeaseTable::live(bool write) const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, record] : leases_) n += record.write == write;
  return n;
}

}  // namespace strata

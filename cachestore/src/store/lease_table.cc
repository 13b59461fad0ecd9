#include "store/lease_table.h"
#include "util/mutex.h"

#include <algorithm>
#include <random>
#include <string>

namespace strata {

namespace {
// Below 2^53, so ids stay exact as JSON numbers; two nodes' ranges then
// meet with odds of about (leases granted) / 2^52.
constexpr LeaseId kLeaseIdMask = (LeaseId{1} << 52) - 1;

// Why `more` bytes would take a namespace holding `held` (and `read_pinned`
// through its read leases) past `limit`; empty if they would not.
std::string PastBytes(const HeldByLeases& held, uint64_t read_pinned, uint64_t more,
                      uint64_t limit) {
  const uint64_t total = read_pinned + held.reserved_bytes + held.admin_pinned_bytes;
  if (total + more <= limit) return {};
  return "it holds " + std::to_string(total) + " bytes of the DRAM tier (" +
         std::to_string(read_pinned) + " pinned by reads, " + std::to_string(held.reserved_bytes) +
         " reserved, " + std::to_string(held.admin_pinned_bytes) + " pinned by admins); " +
         std::to_string(more) + " more would pass the " + std::to_string(limit) +
         " allowed (max_held_share_per_namespace)";
}
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
  MutexLock lock(mu_);
  DropEndedPins(record.granted);
  const HeldByLeases before = Held(record.ns, record.granted);
  if (before.entries + record.entries.size() > limits.entries) {
    return ResourceExhausted("its leases hold " + std::to_string(before.entries) + " entries; " +
                             std::to_string(record.entries.size()) + " more would pass the " +
                             std::to_string(limits.entries) + " allowed");
  }
  if (std::string why = PastBytes(before, ReadPinnedBytes(limits), bytes, limits.bytes);
      !why.empty()) {
    return ResourceExhausted(why);
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

Status LeaseTable::HoldPin(const Entry* e, uint32_t ns, uint64_t bytes, Nanos now, Nanos until,
                           const LeaseLimits& limits) {
  MutexLock lock(mu_);
  DropEndedPins(now);
  auto it = pins_.find(e);
  if (it != pins_.end()) {
    // A pin renewed: its bytes are counted already.
    ErasePinEnd(e, it->second.until);
    it->second.until = until;
    pin_ends_.emplace(until, e);
    return Status::Ok();
  }
  if (std::string why = PastBytes(Held(ns, now), ReadPinnedBytes(limits), bytes, limits.bytes);
      !why.empty()) {
    return ResourceExhausted(why);
  }
  pins_.emplace(e, PinRecord{ns, bytes, until});
  pin_ends_.emplace(until, e);
  held_[ns].admin_pinned_bytes += bytes;
  return Status::Ok();
}

void LeaseTable::DropPin(const Entry* e) {
  MutexLock lock(mu_);
  auto it = pins_.find(e);
  if (it != pins_.end()) DropPinRecord(it);
}

void LeaseTable::ErasePinEnd(const Entry* e, Nanos until) {
  auto [first, last] = pin_ends_.equal_range(until);
  for (auto end = first; end != last; ++end) {
    if (end->second == e) {
      pin_ends_.erase(end);
      return;
    }
  }
}

void LeaseTable::DropPinRecord(std::unordered_map<const Entry*, PinRecord>::iterator it) {
  ErasePinEnd(it->first, it->second.until);
  const uint32_t ns = it->second.ns;
  HeldByLeases& held = held_[ns];
  held.admin_pinned_bytes -= std::min(held.admin_pinned_bytes, it->second.bytes);
  pins_.erase(it);
  ForgetIfEmpty(ns);
}

void LeaseTable::DropEndedPins(Nanos now) {
  while (!pin_ends_.empty() && pin_ends_.begin()->first <= now) {
    DropPinRecord(pins_.find(pin_ends_.begin()->second));
  }
}

HeldByLeases LeaseTable::Held(uint32_t ns, Nanos now) const {
  auto it = held_.find(ns);
  HeldByLeases held = it == held_.end() ? HeldByLeases{} : it->second;
  for (auto end = pin_ends_.begin(); end != pin_ends_.end() && end->first <= now; ++end) {
    const PinRecord& pin = pins_.at(end->second);
    if (pin.ns == ns) held.admin_pinned_bytes -= std::min(held.admin_pinned_bytes, pin.bytes);
  }
  return held;
}

uint64_t LeaseTable::ReadPinnedBytes(const LeaseLimits& limits) {
  return limits.read_pinned_bytes == nullptr
             ? 0
             : static_cast<uint64_t>(std::max<int64_t>(limits.read_pinned_bytes->load(), 0));
}

void LeaseTable::ForgetIfEmpty(uint32_t ns) {
  auto it = held_.find(ns);
  if (it != held_.end() && it->second.entries == 0 && it->second.admin_pinned_bytes == 0) {
    held_.erase(it);
  }
}

void LeaseTable::Forget(const LeaseRecord& record) {
  auto it = held_.find(record.ns);
  if (it == held_.end()) return;
  HeldByLeases& held = it->second;
  held.entries -= std::min<uint64_t>(held.entries, record.entries.size());
  held.reserved_bytes -= std::min(held.reserved_bytes, record.reserved_bytes);
  ForgetIfEmpty(record.ns);
}

HeldByLeases LeaseTable::held(uint32_t ns, Nanos now) const {
  MutexLock lock(mu_);
  return Held(ns, now);
}

std::optional<bool> LeaseTable::IsWrite(uint32_t ns, LeaseId id) const {
  MutexLock lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) return std::nullopt;
  return it->second.write;
}

Status LeaseTable::WithLive(uint32_t ns, LeaseId id, Nanos now,
                            const std::function<void(const LeaseRecord&)>& fn) const {
  MutexLock lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) {
    return LeaseExpired("lease " + std::to_string(id) + " is not live (expired or released)");
  }
  if (it->second.expiry <= now) return LeaseExpired("lease " + std::to_string(id) + " expired");
  fn(it->second);
  return Status::Ok();
}

Status LeaseTable::Renew(uint32_t ns, LeaseId id, Nanos now, Nanos new_expiry, Nanos longest_life) {
  MutexLock lock(mu_);
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
  MutexLock lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.ns != ns) return std::nullopt;
  LeaseRecord record = std::move(it->second);
  leases_.erase(it);
  Forget(record);
  return record;
}

std::vector<LeaseRecord> LeaseTable::TakeExpired(Nanos now) {
  MutexLock lock(mu_);
  std::vector<LeaseRecord> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      Forget(it->second);
      out.push_back(std::move(it->second));
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<LeaseRecord> LeaseTable::TakeAll() {
  MutexLock lock(mu_);
  std::vector<LeaseRecord> out;
  out.reserve(leases_.size());
  for (auto& [id, record] : leases_) out.push_back(std::move(record));
  leases_.clear();
  for (auto it = held_.begin(); it != held_.end();) {
    it->second.entries = it->second.reserved_bytes = 0;
    it = it->second.admin_pinned_bytes == 0 ? held_.erase(it) : std::next(it);
  }
  return out;
}

size_t LeaseTable::live(bool write) const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [id, record] : leases_) n += record.write == write;
  return n;
}

}  // namespace strata

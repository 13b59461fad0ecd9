// I/O plumbing of the SSD tier: io_uring rings, planning direct and bounced
// I/O, free-space reservations, file syncs.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

UringRing* SsdTier::Impl::AcquireRing() {
  MutexLock lock(rings_mu);
  rings_cv.wait(lock.native(),
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rings_mu) { return !idle_rings.empty(); });
  UringRing* r = idle_rings.back();
  idle_rings.pop_back();
  return r;
}

void SsdTier::Impl::ReleaseRing(UringRing* r) {
  if (r->broken()) {
    // A broken ring fails every batch it gets: replace it.
    auto fresh = UringRing::Create(fds, opts.queue_depth, opts.io_buffer_bytes);
    if (fresh.ok()) {
      spdlog::warn("ssd: an io_uring ring failed; replaced it");
      MutexLock lock(rings_mu);
      for (std::unique_ptr<UringRing>& owned : rings) {
        if (owned.get() != r) continue;
        owned = std::move(fresh).value();
        r = owned.get();
        break;
      }
    } else {
      spdlog::error("ssd: an io_uring ring failed and cannot be replaced: {}",
                    fresh.status().ToString());
    }
  }
  {
    MutexLock lock(rings_mu);
    idle_rings.push_back(r);
  }
  rings_cv.notify_one();
}

void SsdTier::Impl::PlanOps(bool write, const SsdEntryMeta& meta, std::byte* direct,
                            std::vector<IoOp>* ops, std::vector<std::pair<size_t, uint64_t>>* owner,
                            size_t entry) const {
  if (direct != nullptr) {
    ops->push_back({write, meta.file, meta.offset, static_cast<uint32_t>(meta.extent_bytes), direct,
                    0, false});
    owner->emplace_back(entry, 0);
    return;
  }
  // Not rings.front()->buffer_bytes(): ReleaseRing may replace that ring
  // meanwhile (under rings_mu).
  const uint64_t chunk = opts.io_buffer_bytes;
  for (uint64_t off = 0; off < meta.extent_bytes; off += chunk) {
    const uint64_t len = std::min(chunk, meta.extent_bytes - off);
    ops->push_back(
        {write, meta.file, meta.offset + off, static_cast<uint32_t>(len), nullptr, 0, false});
    owner->emplace_back(entry, off);
  }
}

uint64_t SsdTier::Impl::UnallocatedBytes(uint32_t file, uint64_t offset, uint64_t bytes) const {
  const uint64_t end = offset + bytes;
  uint64_t holes = 0;
  for (uint64_t pos = offset; pos < end;) {
    const off_t data = ::lseek(fds[file], static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= end) return holes + (end - pos);
    holes += static_cast<uint64_t>(data) - pos;
    const off_t hole = ::lseek(fds[file], data, SEEK_HOLE);
    if (hole < 0) return holes + (end - static_cast<uint64_t>(data));
    pos = static_cast<uint64_t>(hole);
  }
  return holes;
}

Status SsdTier::Impl::ReserveFreeSpace(uint64_t consumes, Reservation* r, bool* full) {
  MutexLock lock(free_mu);
  // statvfs under free_mu: a reservation is given back only after its
  // batch's writes, so each admitted batch is counted here, in the free
  // space or in reserved_bytes (in both while it is being written).
  struct statvfs vfs {};
  if (::statvfs(opts.dir.c_str(), &vfs) != 0) return Status::Ok();
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  *full = free_bytes < opts.min_free_bytes + consumes;
  if (free_bytes < opts.min_free_bytes + reserved_bytes + consumes) {
    return Unavailable("the file system has " + std::to_string(free_bytes) + " bytes free, less " +
                       std::to_string(reserved_bytes) +
                       " reserved by batches being written; a batch needs " +
                       std::to_string(consumes) + " and " + std::to_string(opts.min_free_bytes) +
                       " are kept free");
  }
  r->AddLocked(consumes);
  return Status::Ok();
}

Status SsdTier::Impl::SyncFiles(const std::vector<bool>& touched) const {
  for (size_t f = 0; f < fds.size(); ++f) {
    if (touched[f] && ::fdatasync(fds[f]) != 0) {
      return Unavailable("fdatasync " + paths[f] + ": " + Errno(errno));
    }
  }
  return Status::Ok();
}

}  // namespace strata

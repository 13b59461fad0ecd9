#include "store/dram_arena.h"
#include "util/mutex.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace strata {

namespace {
constexpr uint64_t kHugePage = 2ull << 20;
}

Result<std::unique_ptr<DramArena>> DramArena::Create(const DramArenaOptions& options) {
  const uint32_t granule = options.granule_bytes;
  if (granule == 0 || (granule & (granule - 1)) != 0 || granule > kHugePage) {
    return InvalidArgument("arena granule must be a power of two up to 2 MiB");
  }
  if (options.capacity_bytes < granule) return InvalidArgument("arena smaller than a granule");
  if (!options.external_region.empty()) {
    const auto addr = reinterpret_cast<uintptr_t>(options.external_region.data());
    if (addr % granule != 0) return InvalidArgument("external arena region is not granule-aligned");
    const uint64_t capacity =
        std::min<uint64_t>(options.capacity_bytes, options.external_region.size()) / granule *
        granule;
    if (capacity < granule) return InvalidArgument("external arena region smaller than a granule");
    if (options.prefault) {
      auto* bytes = reinterpret_cast<volatile char*>(options.external_region.data());
      for (uint64_t off = 0; off < capacity; off += 4096) bytes[off] = 0;
    }
    return std::unique_ptr<DramArena>(
        new DramArena(options.external_region.data(), /*mapped=*/0, capacity, granule, false));
  }
  const uint64_t mapped = (options.capacity_bytes + kHugePage - 1) / kHugePage * kHugePage;
  const int populate = options.prefault ? MAP_POPULATE : 0;
  void* p = MAP_FAILED;
  bool huge = false;
  if (options.try_huge_pages) {
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | populate, -1, 0);
    huge = p != MAP_FAILED;
  }
  if (p == MAP_FAILED) {
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return ResourceExhausted("cannot map a DRAM arena of " + std::to_string(mapped) +
                               " bytes: " + std::strerror(errno));
    }
    // Transparent huge pages where the system allows; harmless where not.
    if (options.try_huge_pages) madvise(p, mapped, MADV_HUGEPAGE);
    if (options.prefault && madvise(p, mapped, MADV_POPULATE_WRITE) != 0) {
      if (errno != EINVAL) {
        // Out of memory (or locked pages): a clear error now, not an OOM
        // kill the first time the arena fills.
        const int err = errno;
        munmap(p, mapped);
        return ResourceExhausted("cannot populate a DRAM arena of " + std::to_string(mapped) +
                                 " bytes: " + std::strerror(err));
      }
      // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch each page.
      auto* bytes = static_cast<volatile char*>(p);
      for (uint64_t off = 0; off < mapped; off += 4096) bytes[off] = 0;
    }
  }
  const uint64_t capacity = options.capacity_bytes / granule * granule;
  return std::unique_ptr<DramArena>(
      new DramArena(static_cast<std::byte*>(p), mapped, capacity, granule, huge));
}

DramArena::DramArena(std::byte* base, uint64_t mapped, uint64_t capacity, uint32_t granule,
                     bool huge)
    : base_(base),
      mapped_(mapped),
      capacity_(capacity),
      huge_pages_(huge),
      alloc_(capacity, granule) {}

DramArena::~DramArena() {
  if (mapped_ != 0) munmap(base_, mapped_);
}

std::optional<Extent> DramArena::Allocate(uint64_t bytes) {
  MutexLock lock(mu_);
  std::optional<Extent> e = alloc_.Allocate(bytes);
  used_.store(alloc_.used_bytes(), std::memory_order_relaxed);
  return e;
}

void DramArena::Free(const Extent& extent) {
  MutexLock lock(mu_);
  alloc_.Free(extent);
  used_.store(alloc_.used_bytes(), std::memory_order_relaxed);
}

uint64_t DramArena::allocated_extents() const {
  MutexLock lock(mu_);
  return alloc_.allocated_extents();
}

bool DramArena::CheckConsistency() const {
  MutexLock lock(mu_);
  return alloc_.CheckConsistency();
}

}  // namespace strata

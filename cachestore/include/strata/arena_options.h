// Options of the DRAM tier's memory (part of CacheStoreOptions). The arena
// itself is internal (cachestore/src/store/dram_arena.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace strata {

struct DramArenaOptions {
  uint64_t capacity_bytes = 1ull << 30;
  uint32_t granule_bytes = 4096;  // also keeps extents O_DIRECT-aligned
  bool try_huge_pages = true;
  bool prefault = true;  // touch every page at start, not on the first put
  // Memory someone else owns and keeps mapped for the arena's lifetime
  // (the node lets UCX allocate it, so clients on the host can map it for
  // RMA). Empty: the arena maps its own.
  std::span<std::byte> external_region;
};

}  // namespace strata

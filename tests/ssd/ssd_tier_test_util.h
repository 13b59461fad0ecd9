// Helpers shared by the SSD tier's tests (ssd_tier_test, ssd_tier_faults_test).
#pragma once

#include <sys/statvfs.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ssd/ssd_tier.h"
#include "strata/clock.h"

namespace strata::testing::ssd {

inline SsdKey Key(uint64_t i, StateKind kind = StateKind::kGlobalKv) {
  SsdKey k;
  k.ns = "tenant-" + std::to_string(i % 3);
  for (size_t b = 0; b < 16; ++b) {
    k.model_id.bytes[b] = static_cast<uint8_t>(b * 7);
    k.chain.bytes[b] = static_cast<uint8_t>((i >> (8 * (b % 8))) + b);
  }
  k.kind = kind;
  return k;
}

// 4 KiB-aligned memory, for direct reads.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(SsdIoBytes(n)) {
    data = static_cast<std::byte*>(std::aligned_alloc(kSsdBlockBytes, size));
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::span<std::byte> span() { return {data, size}; }
  std::byte* data;
  size_t size;
};

// What the file system holding `path` has free for an unprivileged user.
inline uint64_t FreeBytes(const std::string& path) {
  struct statvfs vfs {};
  EXPECT_EQ(::statvfs(path.c_str(), &vfs), 0);
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

inline SsdTierOptions Options(const std::string& dir, uint64_t capacity = 64 << 20) {
  SsdTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.queue_depth = 8;
  o.rings = 2;
  o.io_buffer_bytes = 64 << 10;  // small, so large payloads span several I/Os
  return o;
}

// A tier of eight 4 KiB entries on `clock` that evicts on demand.
inline SsdTierOptions EightOnDemand(const std::string& dir, ManualClock& clock,
                                    const char* policy) {
  SsdTierOptions o = Options(dir, 8 * kSsdBlockBytes);
  o.clock = &clock;
  o.high_watermark = o.low_watermark = 1.0;
  o.eviction_policy = policy;
  return o;
}

// Every entry of namespace `ns`, a few pages at a time.
inline std::vector<std::pair<SsdKey, SsdEntryMeta>> ListAll(const SsdTier& tier,
                                                            std::string_view ns) {
  std::vector<std::pair<SsdKey, SsdEntryMeta>> out;
  std::optional<SsdListCursor> after;
  for (;;) {
    SsdListPage page = tier.List(ns, after, 3);
    out.insert(out.end(), page.entries.begin(), page.entries.end());
    if (!page.more) return out;
    after = SsdListCursor{out.back().first.chain, out.back().first.kind};
  }
}

}  // namespace strata::testing::ssd

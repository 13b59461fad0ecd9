// The SSD tier on its own: round trips, crash safety between data and index,
// checksum failures, TTL, watermarks, restart accounting, a full disk.
#include "ssd/ssd_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <thread>
#include <utility>

#include "ssd/uring_io.h"
#include "strata/layout.h"
#include "temp_dir.h"
#include "test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::ScopedTempDir;
using testing::ScopedTmpfs;

SsdKey Key(uint64_t i, StateKind kind = StateKind::kGlobalKv) {
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
uint64_t FreeBytes(const std::string& path) {
  struct statvfs vfs {};
  EXPECT_EQ(::statvfs(path.c_str(), &vfs), 0);
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

SsdTierOptions Options(const std::string& dir, uint64_t capacity = 64 << 20) {
  SsdTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.queue_depth = 8;
  o.rings = 2;
  o.io_buffer_bytes = 64 << 10;  // small, so large payloads span several I/Os
  return o;
}

// A tier of eight 4 KiB entries on `clock` that evicts on demand.
SsdTierOptions EightOnDemand(const std::string& dir, ManualClock& clock, const char* policy) {
  SsdTierOptions o = Options(dir, 8 * kSsdBlockBytes);
  o.clock = &clock;
  o.high_watermark = o.low_watermark = 1.0;
  o.eviction_policy = policy;
  return o;
}

// Every entry of namespace `ns`, a few pages at a time.
std::vector<std::pair<SsdKey, SsdEntryMeta>> ListAll(const SsdTier& tier, std::string_view ns) {
  std::vector<std::pair<SsdKey, SsdEntryMeta>> out;
  std::optional<SsdListCursor> after;
  for (;;) {
    SsdListPage page = tier.List(ns, after, 3);
    out.insert(out.end(), page.entries.begin(), page.entries.end());
    if (!page.more) return out;
    after = SsdListCursor{out.back().first.chain, out.back().first.kind};
  }
}

TEST(SsdTierTest, RandomPayloadsRoundTripAndSurviveRestart) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path());
  o.data_files = 2;
  std::mt19937_64 rng(42);
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 40; ++i) {
    const size_t n = 1 + rng() % (300 << 10);  // 1 B .. 300 KiB, many chunkings
    payloads.push_back(RandomBytes(n, rng()));
  }
  {
    auto tier = SsdTier::Open(o).value();
    std::vector<SsdWrite> writes;
    for (size_t i = 0; i < payloads.size(); ++i) {
      writes.push_back({Key(i), payloads[i], 1000 + i, 7});
    }
    for (const Status& st : tier->WriteBatch(writes)) ASSERT_TRUE(st.ok()) << st.ToString();
    // Rewriting is an idempotent no-op.
    for (const Status& st : tier->WriteBatch(writes)) ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(tier->Stats().entries, payloads.size());
    for (size_t i = 0; i < payloads.size(); ++i) {
      std::vector<std::byte> out(payloads[i].size());  // unaligned: bounce path
      ASSERT_TRUE(tier->Read({Key(i), out}).ok());
      EXPECT_EQ(out, payloads[i]) << i;
    }
  }
  auto tier = SsdTier::Open(o).value();
  uint64_t used = 0;
  for (const auto& p : payloads) used += SsdIoBytes(p.size());
  EXPECT_EQ(tier->Stats().used_bytes, used);  // accounting rebuilt from the index
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::vector<SsdRead> reads;
  for (size_t i = 0; i < payloads.size(); ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(payloads[i].size()));
    reads.push_back({Key(i), bufs.back()->span()});  // aligned: direct path
  }
  std::vector<Status> results = tier->ReadBatch(reads);
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].ToString();
    EXPECT_EQ(0, std::memcmp(bufs[i]->data, payloads[i].data(), payloads[i].size())) << i;
    const std::optional<SsdEntryMeta> meta = tier->Lookup(Key(i));
    ASSERT_TRUE(meta.has_value());
    EXPECT_EQ(meta->entry_checksum, 1000 + i);
    EXPECT_EQ(meta->layout_id, 7u);
    EXPECT_EQ(meta->payload_bytes, payloads[i].size());
  }
  EXPECT_EQ(tier->Read({Key(999), bufs[0]->span()}).code(), StatusCode::kNotFound);
  std::vector<std::byte> small(1);
  EXPECT_EQ(tier->Read({Key(0), small}).code(),
            payloads[0].size() > 1 ? StatusCode::kInvalidArgument : StatusCode::kOk);
}

TEST(SsdTierTest, FindNamesEntriesByChainKeyWithoutTheirModelAndAfterRestart) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  SsdKey a = Key(4);  // tenant-1
  SsdKey other_model = Key(5);
  other_model.ns = a.ns;
  other_model.model_id.bytes[0] ^= 1;
  SsdKey same_chain_other_ns = a;
  same_chain_other_ns.ns = "tenant-2";
  const std::vector<std::byte> p = RandomBytes(5000, 4);
  auto check = [&](SsdTier& tier) {
    auto found = tier.Find(a.ns, a.chain, a.kind);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].first.model_id, a.model_id);
    EXPECT_EQ(found[0].second.entry_checksum, 11u);
    found = tier.Find(a.ns, other_model.chain, other_model.kind);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].first.model_id, other_model.model_id);
    found = tier.Find(same_chain_other_ns.ns, a.chain, a.kind);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].second.entry_checksum, 13u);
    EXPECT_TRUE(tier.Find(a.ns, a.chain, StateKind::kSwaState).empty());
    EXPECT_TRUE(tier.Find("tenant-0", a.chain, a.kind).empty());
    EXPECT_TRUE(tier.Find(a.ns, Key(6).chain, a.kind).empty());
  };
  {
    auto tier = SsdTier::Open(o).value();
    ASSERT_TRUE(tier->Write({a, p, 11, 1}).ok());
    ASSERT_TRUE(tier->Write({other_model, p, 12, 1}).ok());
    ASSERT_TRUE(tier->Write({same_chain_other_ns, p, 13, 1}).ok());
    check(*tier);
  }
  auto tier = SsdTier::Open(o).value();  // models known again from the index
  check(*tier);
  ASSERT_TRUE(tier->Erase(a).ok());
  EXPECT_TRUE(tier->Find(a.ns, a.chain, a.kind).empty());
  // Many models: a lookup under each.
  SsdKey many = Key(7);
  many.ns = "tenant-many";
  for (uint8_t m = 0; m < 70; ++m) {
    many.model_id.bytes[1] = m;
    ASSERT_TRUE(tier->Write({many, p, m, 1}).ok());
  }
  EXPECT_EQ(tier->Find(many.ns, many.chain, many.kind).size(), 70u);
  EXPECT_TRUE(tier->Find(many.ns, a.chain, many.kind).empty());
  // List names one namespace's entries, not those of a namespace whose
  // name starts with it.
  SsdKey short_ns = Key(8);
  short_ns.ns = "tenant";
  ASSERT_TRUE(tier->Write({short_ns, p, 14, 1}).ok());
  auto listed = ListAll(*tier, "tenant");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].first.chain, short_ns.chain);
  EXPECT_EQ(listed[0].first.ns, "tenant");
  EXPECT_EQ(ListAll(*tier, "tenant-many").size(), 70u);
  EXPECT_EQ(ListAll(*tier, other_model.ns).size(), 1u);  // a was erased
  EXPECT_TRUE(ListAll(*tier, "tenan").empty());
  clock.Advance(o.ttl + 1);
  EXPECT_TRUE(tier->Find(a.ns, other_model.chain, other_model.kind).empty());  // expired
  EXPECT_TRUE(tier->Find(many.ns, many.chain, many.kind).empty());
}

// Pages of a namespace's entries, in (chain key, kind, model) order: page
// after page from each one's last entry, `limit` at a time, the models of
// one (chain key, kind) never split, until a page says nothing follows.
TEST(SsdTierTest, ListPagesCoverANamespaceInOrderWithoutSplittingAKeysModels) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  o.sync = false;
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(100, 16);
  std::mt19937_64 rng(17);
  std::vector<SsdKey> want;
  for (uint64_t i = 0; i < 60; ++i) {
    SsdKey k = Key(i * 3);  // namespace tenant-0
    k.kind = rng() % 2 == 0 ? StateKind::kGlobalKv : StateKind::kSwaState;
    // A few chain keys under several models (at most one in practice).
    const int models = i % 10 == 0 ? 3 : 1;
    for (int m = 0; m < models; ++m) {
      k.model_id.bytes[0] = static_cast<uint8_t>(rng() % 4);
      if (std::any_of(want.begin(), want.end(), [&](const SsdKey& w) {
            return w.chain == k.chain && w.kind == k.kind && w.model_id == k.model_id;
          })) {
        continue;
      }
      ASSERT_TRUE(tier->Write({k, p, 1, 1}).ok());
      want.push_back(k);
    }
  }
  ASSERT_TRUE(tier->Write({Key(1), p, 1, 1}).ok());  // another namespace
  SsdKey expired = Key(3000);
  ASSERT_TRUE(tier->Write({expired, p, 1, 1}).ok());
  clock.Advance(o.ttl - 1);
  for (SsdKey& k : want) {
    // Rewritten, so all but `expired` outlive the clock step below.
    ASSERT_TRUE(tier->Erase(k).ok());
    ASSERT_TRUE(tier->Write({k, p, 1, 1}).ok());
  }
  clock.Advance(2);  // `expired` is past its TTL, not yet swept
  auto order = [](const SsdKey& k) { return std::tie(k.chain.bytes, k.kind, k.model_id.bytes); };
  std::sort(want.begin(), want.end(),
            [&](const SsdKey& a, const SsdKey& b) { return order(a) < order(b); });
  for (size_t limit : {1, 2, 5, 64, 1000}) {
    std::vector<SsdKey> got;
    std::optional<SsdListCursor> after;
    for (int pages = 0;; ++pages) {
      ASSERT_LT(pages, 100) << "limit " << limit;
      const SsdListPage page = tier->List("tenant-0", after, limit);
      for (const auto& [key, meta] : page.entries) {
        EXPECT_EQ(key.ns, "tenant-0");
        got.push_back(key);
      }
      if (!page.more) break;
      ASSERT_FALSE(page.entries.empty());
      const SsdKey& last = page.entries.back().first;
      // Never more than `limit`, except to finish the last key's models.
      if (page.entries.size() > limit) {
        const SsdKey& first_extra = page.entries[limit - 1].first;
        EXPECT_EQ(first_extra.chain, last.chain);
      }
      after = SsdListCursor{last.chain, last.kind};
    }
    ASSERT_EQ(got.size(), want.size()) << "limit " << limit;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(order(got[i]), order(want[i])) << "limit " << limit << " at " << i;
    }
  }
}

TEST(SsdTierTest, AlignedSourcesAreWrittenInPlace) {
  ScopedTempDir dir;
  auto tier = SsdTier::Open(Options(dir.path())).value();
  std::vector<std::unique_ptr<AlignedBuffer>> sources;
  std::vector<SsdWrite> writes;
  for (uint64_t i = 0; i < 6; ++i) {
    const size_t n = 5000 + i * 70000;  // below and above the bounce buffer size
    const std::vector<std::byte> bytes = RandomBytes(n, i);
    sources.push_back(std::make_unique<AlignedBuffer>(n));
    std::memcpy(sources.back()->data, bytes.data(), n);
    writes.push_back({Key(i), {sources.back()->data, n}, 0, 1, sources.back()->size});
  }
  for (const Status& st : tier->WriteBatch(writes)) ASSERT_TRUE(st.ok()) << st.ToString();
  for (uint64_t i = 0; i < 6; ++i) {
    std::vector<std::byte> out(writes[i].payload.size());
    ASSERT_TRUE(tier->Read({Key(i), out}).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), writes[i].payload.data(), out.size())) << i;
  }
}

TEST(SsdTierTest, BadOptionsAreRejected) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path());
  o.queue_depth = 0;
  EXPECT_EQ(SsdTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir.path());
  o.io_buffer_bytes = 1000;
  EXPECT_EQ(SsdTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options("");
  EXPECT_EQ(SsdTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir.path(), 100);
  EXPECT_EQ(SsdTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir.path());
  o.eviction_policy = "random";
  EXPECT_EQ(SsdTier::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(SsdTierTest, FlippedBitIsDetectedDroppedAndCounted) {
  ScopedTempDir dir;
  const std::vector<std::byte> payload = RandomBytes(10000, 1);
  uint64_t offset = 0;
  {
    auto tier = SsdTier::Open(Options(dir.path())).value();
    ASSERT_TRUE(tier->Write({Key(1), payload, 5, 1}).ok());
    ASSERT_TRUE(tier->Write({Key(2), payload, 5, 1}).ok());
    offset = tier->Lookup(Key(1))->offset;
  }
  {
    const int fd = ::open((dir.path() + "/data-0.bin").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::byte b{};
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset + 1234)), 1);
    b ^= std::byte{0x10};
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset + 1234)), 1);
    ::close(fd);
  }
  auto tier = SsdTier::Open(Options(dir.path())).value();
  std::vector<std::byte> out(payload.size());
  const Status st = tier->Read({Key(1), out});
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();  // a miss, never the bytes
  EXPECT_EQ(tier->Stats().checksum_failures, 1u);
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_TRUE(tier->Read({Key(2), out}).ok());  // the neighbour is untouched
  EXPECT_EQ(out, payload);
  tier.reset();
  tier = SsdTier::Open(Options(dir.path())).value();  // dropped for good
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(payload.size()));
}

// The data checksum is taken before any I/O: bytes that change after it
// (here, before the write) fail their first read instead of becoming a copy
// that vouches for them. A caller's own checksum is the one kept.
TEST(SsdTierTest, BytesChangedBeforeTheirWriteFailTheirFirstRead) {
  ScopedTempDir dir;
  std::vector<std::byte> payload = RandomBytes(10000, 2);
  const std::vector<std::byte> original = payload;
  SsdTierOptions o = Options(dir.path());
  bool change = true;
  o.before_data_write_hook = [&] {
    if (change) payload[1234] ^= std::byte{0x10};
  };
  auto tier = SsdTier::Open(o).value();
  ASSERT_TRUE(tier->Write({Key(1), payload, 5, 1}).ok());
  std::vector<std::byte> out(payload.size());
  EXPECT_EQ(tier->Read({Key(1), out}).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Stats().checksum_failures, 1u);

  SsdWrite w{Key(2), payload, 5, 1};
  w.data_checksum = Checksum64(payload);  // the caller checked these bytes
  change = false;
  payload[99] ^= std::byte{0x01};  // and they changed before the tier saw them
  ASSERT_TRUE(tier->Write(w).ok());
  EXPECT_EQ(tier->Read({Key(2), out}).code(), StatusCode::kNotFound);
  payload = original;
  ASSERT_TRUE(tier->Write({Key(3), payload, 5, 1}).ok());
  EXPECT_TRUE(tier->Read({Key(3), out}).ok());
  EXPECT_EQ(out, payload);
}

// Runs in a child process: one batch completes, the next is killed
// (SIGKILL) by the fault hook between its data write and its index write.
[[noreturn]] void WriteThenDieBeforeIndex(const std::string& dir) {
  static std::atomic<bool> die{false};
  SsdTierOptions o = Options(dir);
  o.before_index_write_hook = [] {
    if (die.load()) ::kill(::getpid(), SIGKILL);
  };
  auto opened = SsdTier::Open(o);
  if (!opened.ok()) ::_exit(2);
  std::unique_ptr<SsdTier> tier = std::move(opened).value();
  const std::vector<std::byte> a = RandomBytes(50000, 10);
  if (!tier->Write({Key(10), a, 1, 1}).ok()) ::_exit(3);
  die.store(true);
  const std::vector<std::byte> b = RandomBytes(50000, 11);
  std::vector<SsdWrite> batch = {{Key(11), b, 1, 1}, {Key(12), b, 1, 1}};
  (void)tier->WriteBatch(batch);
  ::_exit(4);  // not reached: the hook killed us
}

// The child's entry point: this binary re-executed with the directory in
// STRATA_SSD_CRASH_DIR (exec, not a bare fork: the parent has threads).
TEST(SsdTierCrashChild, WriteThenDie) {
  const char* dir = std::getenv("STRATA_SSD_CRASH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of KillBetweenDataAndIndex";
  WriteThenDieBeforeIndex(dir);
}

TEST(SsdTierTest, KillBetweenDataAndIndexLeavesNothingTorn) {
  ScopedTempDir dir;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("STRATA_SSD_CRASH_DIR", dir.path().c_str(), 1);
    ::execl("/proc/self/exe", "ssd_tier_test", "--gtest_filter=SsdTierCrashChild.WriteThenDie",
            static_cast<char*>(nullptr));
    ::_exit(5);  // exec failed
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  auto tier = SsdTier::Open(Options(dir.path())).value();
  EXPECT_TRUE(tier->Contains(Key(10)));
  EXPECT_FALSE(tier->Contains(Key(11)));  // data written, never indexed: invisible
  EXPECT_FALSE(tier->Contains(Key(12)));
  EXPECT_EQ(tier->Stats().entries, 1u);
  EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(50000));  // their extents are free again
  std::vector<std::byte> out(50000);
  ASSERT_TRUE(tier->Read({Key(10), out}).ok());
  EXPECT_EQ(out, RandomBytes(50000, 10));
  // The space is reused and the new entries read back whole.
  const std::vector<std::byte> c = RandomBytes(50000, 12);
  ASSERT_TRUE(tier->Write({Key(11), c, 1, 1}).ok());
  ASSERT_TRUE(tier->Read({Key(11), out}).ok());
  EXPECT_EQ(out, c);
}

TEST(SsdTierTest, TtlExpiresEntriesAndFreesTheirSpace) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  o.ttl = Hours(72);
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(8192, 3);
  ASSERT_TRUE(tier->Write({Key(1), p, 1, 1}).ok());
  clock.Advance(Hours(71));
  ASSERT_TRUE(tier->Write({Key(2), p, 1, 1}).ok());
  EXPECT_EQ(tier->RunMaintenance(), 0u);
  clock.Advance(Hours(2));
  EXPECT_FALSE(tier->Contains(Key(1)));  // expired: a miss even before the sweep
  std::vector<std::byte> out(p.size());
  EXPECT_EQ(tier->Read({Key(1), out}).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->RunMaintenance(), 1u);
  EXPECT_EQ(tier->Stats().ttl_expired, 1u);
  EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(p.size()));
  // Rewriting an expired key replaces it and frees the old extent.
  clock.Advance(Hours(72));
  const std::vector<std::byte> q = RandomBytes(8192, 33);
  ASSERT_TRUE(tier->Write({Key(2), q, 1, 1}).ok());
  EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(q.size()));
  ASSERT_TRUE(tier->Read({Key(2), out}).ok());
  EXPECT_EQ(out, q);
  tier.reset();
  clock.Advance(Hours(73));  // Key(2) expires while the tier is closed
  tier = SsdTier::Open(o).value();
  EXPECT_EQ(tier->Stats().entries, 0u);
  EXPECT_EQ(tier->Stats().used_bytes, 0u);
}

TEST(SsdTierTest, WatermarkEvictsLeastRecentlyUsedAndReusesSpace) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 40 * 8192);  // 40 entries of 8 KiB
  o.clock = &clock;
  o.high_watermark = 0.9;
  o.low_watermark = 0.5;
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(8000, 4);
  for (uint64_t i = 0; i < 36; ++i) {
    ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
    clock.Advance(Seconds(1));
  }
  tier->Touch(Key(0));  // recently used: kept
  clock.Advance(Seconds(1));
  ASSERT_TRUE(tier->Write({Key(100), p, 1, 1}).ok());  // crosses the high watermark
  const SsdTierStats st = tier->Stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.used_bytes, 20u * 8192);
  EXPECT_TRUE(tier->Contains(Key(0)));
  EXPECT_TRUE(tier->Contains(Key(100)));
  EXPECT_FALSE(tier->Contains(Key(1)));  // the oldest untouched went first
  for (uint64_t i = 200; i < 260; ++i) ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
  const uint64_t used = tier->Stats().used_bytes;
  const uint64_t entries = tier->Stats().entries;
  EXPECT_LE(used, o.capacity_bytes);
  tier.reset();
  tier = SsdTier::Open(o).value();
  EXPECT_EQ(tier->Stats().used_bytes, used);
  EXPECT_EQ(tier->Stats().entries, entries);
}

// A second tier on a live tier's directory is refused before it touches a
// file: resizing them would cut off the live tier's entries.
TEST(SsdTierTest, ADirectoryServesOneTierAtATime) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path(), 16 << 20);
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(1 << 20, 9);
  for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
  SsdTierOptions smaller = Options(dir.path(), 2 << 20);
  smaller.index_dir = dir.path() + "/other-index";  // its own index: no RocksDB lock to hit
  auto second = SsdTier::Open(smaller);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use by another SSD tier"), std::string::npos)
      << second.status().ToString();
  for (uint64_t i = 0; i < 12; ++i) {
    std::vector<std::byte> back(p.size());
    const Status read = tier->Read({Key(i), back});
    ASSERT_TRUE(read.ok()) << i << ": " << read.ToString();
    EXPECT_EQ(back, p);
  }
  tier.reset();  // the lock goes with it
  EXPECT_TRUE(SsdTier::Open(o).ok());
}

// An entry larger than one data file could never be placed: refused at
// once, evicting nothing for it.
TEST(SsdTierTest, AnEntryLargerThanADataFileIsRefusedWithoutEvicting) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 256 << 10);  // four files of 64 KiB
  o.data_files = 4;
  o.clock = &clock;
  o.high_watermark = o.low_watermark = 1.0;
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> small = RandomBytes(4000, 1);
  for (uint64_t i = 0; i < 60; ++i) ASSERT_TRUE(tier->Write({Key(i), small, 1, 1}).ok());
  const std::vector<std::byte> big = RandomBytes(100 << 10, 2);
  const Status st = tier->Write({Key(1000), big, 1, 1});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("exceeds one data file"), std::string::npos) << st.ToString();
  EXPECT_EQ(tier->Stats().entries, 60u);
  EXPECT_EQ(tier->Stats().evictions, 0u);
}

// Enough room in total but only in 4 KiB holes: an 8 KiB entry gets a run
// made by evicting in rank order (the oldest entry, beside a hole), not a
// refusal that says everything is being read.
TEST(SsdTierTest, FreeSpaceInHolesIsJoinedByEvictingForTheRun) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 16 * kSsdBlockBytes);  // one file of 16 blocks
  o.data_files = 1;
  o.clock = &clock;
  o.high_watermark = o.low_watermark = 1.0;
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> small = RandomBytes(4000, 1);
  for (uint64_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(tier->Write({Key(i), small, 1, 1}).ok());
    clock.Advance(Seconds(1));
  }
  for (uint64_t i = 1; i < 16; i += 2) ASSERT_TRUE(tier->Erase(Key(i)).ok());
  ASSERT_EQ(tier->Stats().used_bytes, 8 * kSsdBlockBytes);  // half free, in single blocks
  const std::vector<std::byte> pair = RandomBytes(8000, 2);
  const Status st = tier->Write({Key(100), pair, 1, 1});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(tier->Stats().evictions, 1u);
  EXPECT_LE(tier->Stats().evictions, 2u);
  EXPECT_FALSE(tier->Contains(Key(0)));  // the least recently used went first
  std::vector<std::byte> back(pair.size());
  ASSERT_TRUE(tier->Read({Key(100), back}).ok());
  EXPECT_EQ(back, pair);
}

// A ring that fails at the io_uring level fails its batch cleanly (nothing
// indexed) and is replaced, so the tier goes on writing and reading.
TEST(SsdTierTest, ABrokenRingIsReplacedAndTheTierGoesOn) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path());
  o.rings = 1;                                  // the next batch takes the replacement
  o.write_retry_interval = 5 * kNanosPerMilli;  // an I/O error pauses writes this long
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> payload = RandomBytes(100 << 10, 5);
  tier->FailNextSubmitsForTesting(-EIO);
  EXPECT_FALSE(tier->Write({Key(1), payload, 11, 7}).ok());
  EXPECT_FALSE(tier->Lookup(Key(1)).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(tier->Write({Key(1), payload, 11, 7}).ok());
  std::vector<std::byte> out(payload.size());
  ASSERT_TRUE(tier->Read({Key(1), out}).ok());
  EXPECT_EQ(out, payload);
  tier->FailNextSubmitsForTesting(-EIO);
  EXPECT_FALSE(tier->Read({Key(1), out}).ok());  // a failed read drops nothing
  ASSERT_TRUE(tier->Read({Key(1), out}).ok());
  EXPECT_EQ(out, payload);
}

// A key erased and written again before the erase reached the index: the
// new entry's index record must survive the old one's delete (it is what a
// restart rebuilds from).
TEST(SsdTierTest, AKeyWrittenAgainDuringItsEraseSurvivesARestart) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path());
  SsdTier* tier_ptr = nullptr;
  const std::vector<std::byte> v1 = RandomBytes(8000, 31), v2 = RandomBytes(8000, 32);
  bool rewrite = true;
  o.before_index_delete_hook = [&] {
    if (std::exchange(rewrite, false)) {
      EXPECT_TRUE(tier_ptr->Write({Key(1), v2, 1, 1}).ok());  // lands between retire and delete
    }
    return Status::Ok();
  };
  {
    auto tier = SsdTier::Open(o).value();
    tier_ptr = tier.get();
    ASSERT_TRUE(tier->Write({Key(1), v1, 1, 1}).ok());
    ASSERT_TRUE(tier->Erase(Key(1)).ok());
    EXPECT_TRUE(tier->Contains(Key(1)));  // the second write
  }
  o.before_index_delete_hook = nullptr;
  auto tier = SsdTier::Open(o).value();
  ASSERT_TRUE(tier->Contains(Key(1)));
  std::vector<std::byte> out(v2.size());
  ASSERT_TRUE(tier->Read({Key(1), out}).ok());
  EXPECT_EQ(out, v2);
}

// A chain written, or read, in one batch at one instant (a batch lists the
// root first): under pressure its tail goes first, for either policy. An
// ancestor evicted before its descendants would leave them unreachable.
TEST(SsdTierTest, EqualTimesEvictAChainsTailBeforeItsAncestors) {
  for (const char* policy : {"lru", "deadline"}) {
    ScopedTempDir dir;
    ManualClock clock;
    auto tier = SsdTier::Open(EightOnDemand(dir.path(), clock, policy)).value();
    const std::vector<std::byte> p = RandomBytes(kSsdBlockBytes, 13);
    std::vector<SsdWrite> chain;
    for (uint64_t i = 0; i < 8; ++i) chain.push_back({Key(100 + i), p, 1, 1});
    for (const Status& st : tier->WriteBatch(chain)) ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<std::vector<std::byte>> out(8, std::vector<std::byte>(p.size()));
    std::vector<SsdRead> reads;
    for (uint64_t i = 0; i < 8; ++i) reads.push_back({Key(100 + i), out[i]});
    for (const Status& st : tier->ReadBatch(reads)) ASSERT_TRUE(st.ok()) << st.ToString();
    for (uint64_t j = 0; j < 3; ++j) ASSERT_TRUE(tier->Write({Key(200 + j), p, 1, 1}).ok());
    for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(tier->Contains(Key(100 + i))) << policy << i;
    for (uint64_t i = 5; i < 8; ++i) EXPECT_FALSE(tier->Contains(Key(100 + i))) << policy << i;
  }
}

// A read is a use: the entry read goes to the back of the LRU order.
TEST(SsdTierTest, AReadKeepsTheEntryItRead) {
  ScopedTempDir dir;
  ManualClock clock;
  auto tier = SsdTier::Open(EightOnDemand(dir.path(), clock, "lru")).value();
  const std::vector<std::byte> p = RandomBytes(kSsdBlockBytes, 14);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
    clock.Advance(Seconds(1));
  }
  std::vector<std::byte> out(p.size());
  ASSERT_TRUE(tier->Read({Key(0), out}).ok());
  clock.Advance(Seconds(1));
  ASSERT_TRUE(tier->Write({Key(100), p, 1, 1}).ok());
  EXPECT_TRUE(tier->Contains(Key(0)));
  EXPECT_FALSE(tier->Contains(Key(1)));
}

// The eviction order is kept as entries are written, read, touched, erased,
// expired, evicted and restored: random operations, checked after each.
TEST(SsdTierTest, TheEvictionOrderFollowsEveryChange) {
  for (const char* policy : {"lru", "deadline"}) {
    ScopedTempDir dir;
    ManualClock clock;
    SsdTierOptions o = Options(dir.path(), 48 * kSsdBlockBytes);
    o.clock = &clock;
    o.sync = false;
    o.ttl = Seconds(12);
    o.high_watermark = 0.9;
    o.low_watermark = 0.7;
    o.eviction_policy = policy;
    std::mt19937_64 rng(5);
    const std::vector<std::byte> p = RandomBytes(kSsdBlockBytes, 15);
    std::vector<std::byte> out(p.size());
    uint64_t evictions = 0, expired = 0;
    for (int reopen = 0; reopen < 2; ++reopen) {
      auto tier = SsdTier::Open(o).value();
      ASSERT_TRUE(tier->EvictionOrderConsistentForTesting()) << policy << " after open";
      for (int step = 0; step < 1500; ++step) {
        const SsdKey key = Key(rng() % 120);
        switch (rng() % 7) {
          case 0:
          case 1: {
            std::vector<SsdWrite> batch{{key, p, 1, 1}, {Key(rng() % 120), p, 1, 1}};
            (void)tier->WriteBatch(batch);
            break;
          }
          case 2:
            (void)tier->Read({key, out});
            break;
          case 3:
            tier->Touch(key, SsdTouch::kUse, static_cast<uint32_t>(rng() % 6));
            break;
          case 4:
            tier->Touch(key, SsdTouch::kRenew, static_cast<uint32_t>(rng() % 6));
            break;
          case 5:
            (void)tier->Erase(key);
            break;
          default:
            (void)tier->RunMaintenance();
            break;
        }
        clock.Advance(static_cast<Nanos>(rng() % 200) * kNanosPerMilli);
        ASSERT_TRUE(tier->EvictionOrderConsistentForTesting()) << policy << " step " << step;
      }
      evictions += tier->Stats().evictions;
      expired += tier->Stats().ttl_expired;
    }
    // Every path was taken.
    EXPECT_GT(evictions, 0u) << policy;
    EXPECT_GT(expired, 0u) << policy;
  }
}

// 24 blocks come back again and again, each time after 71 other writes and
// uses, while one-off blocks stream through a tier of 64 entries. Every
// block leaves DRAM (a renewal) right after it is written or served, as in
// a two-tier store whose DRAM tier is small. Returns the share of the last
// quarter's returns that the tier still held.
double ReturningBlocksHeld(const std::string& dir, const std::string& policy) {
  SsdTierOptions o = Options(dir, 64 * kSsdBlockBytes);
  o.high_watermark = o.low_watermark = 1.0;  // evict on demand
  o.sync = false;
  o.eviction_policy = policy;
  auto opened = SsdTier::Open(o);
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (!opened.ok()) return -1;
  std::unique_ptr<SsdTier> tier = std::move(opened).value();
  const std::vector<std::byte> p = RandomBytes(kSsdBlockBytes, 9);
  auto write_and_leave = [&](std::initializer_list<uint64_t> ids) {
    std::vector<SsdWrite> writes;
    for (uint64_t i : ids) writes.push_back({Key(i), p, 1, 1});
    for (const Status& st : tier->WriteBatch(writes)) EXPECT_TRUE(st.ok()) << st.ToString();
    for (uint64_t i : ids) tier->Touch(Key(i), SsdTouch::kRenew);
  };
  constexpr int kRounds = 4000;
  int held = 0;
  int returns = 0;
  uint64_t one_off = 1000;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t hot = round % 24;
    const bool found = tier->Contains(Key(hot));
    if (found) {
      tier->Touch(Key(hot), SsdTouch::kUse);  // served from SSD, back in DRAM
      tier->Touch(Key(hot), SsdTouch::kRenew);
    } else {
      write_and_leave({hot});  // recomputed and written again
    }
    if (round >= kRounds * 3 / 4) {
      ++returns;
      held += found ? 1 : 0;
    }
    write_and_leave({one_off, one_off + 1});
    one_off += 2;
  }
  return static_cast<double>(held) / returns;
}

TEST(SsdTierTest, DeadlinePolicyHoldsReturningBlocksPastLruReach) {
  ScopedTempDir dir;
  // Each block returns after 71 other entries were written or used: LRU,
  // holding 64, never keeps it. The deadline policy learns that blocks with earlier uses
  // come back and one-offs do not, and spends the room on the former.
  EXPECT_EQ(ReturningBlocksHeld(dir.path() + "/lru", "lru"), 0.0);
  EXPECT_GT(ReturningBlocksHeld(dir.path() + "/deadline", "deadline"), 0.9);
}

TEST(SsdTierTest, DeadlinePolicyEvictsRestoredEntriesOldestFirst) {
  ScopedTempDir dir;
  ManualClock clock;
  const SsdTierOptions o = EightOnDemand(dir.path(), clock, "deadline");
  const std::vector<std::byte> p = RandomBytes(kSsdBlockBytes, 12);
  {
    auto tier = SsdTier::Open(o).value();
    for (uint64_t i = 8; i-- > 0;) {  // Key(7) is the oldest
      ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
      clock.Advance(Seconds(1));
    }
  }
  // The learned state is gone after a restart; the persisted access times
  // still order what was there before anything new.
  auto tier = SsdTier::Open(o).value();
  ASSERT_TRUE(tier->Write({Key(100), p, 1, 1}).ok());
  EXPECT_FALSE(tier->Contains(Key(7)));
  for (uint64_t i = 0; i < 7; ++i) EXPECT_TRUE(tier->Contains(Key(i))) << i;
  EXPECT_TRUE(tier->Contains(Key(100)));
}

TEST(SsdTierTest, ConcurrentReadersOfOneEntry) {
  ScopedTempDir dir;
  auto tier = SsdTier::Open(Options(dir.path())).value();
  const std::vector<std::byte> p = RandomBytes(227840, 5);
  ASSERT_TRUE(tier->Write({Key(1), p, 1, 1}).ok());
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  threads.reserve(6);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        std::vector<std::byte> out(p.size());
        if (tier->Read({Key(1), out}).ok() && out == p) good.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 60);
}

// An index that fails a delete (injected: RocksDB's errors are sticky). The
// eviction victims it was for stay served (the index still has them)
// instead of leaking their space, and nothing more is evicted or written.
// An entry deleted on purpose stays deleted: never served again.
TEST(SsdTierTest, AnIndexThatCannotDeleteKeepsItsVictimsAndItsDeletions) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path(), 4 * kSsdBlockBytes * 2);  // four 8 KiB entries
  o.high_watermark = o.low_watermark = 1.0;
  o.before_index_delete_hook = [] { return Unavailable("injected: index write failed"); };
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(8000, 41);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
  EXPECT_FALSE(tier->Write({Key(4), p, 1, 1}).ok());       // its eviction fails: no room
  EXPECT_TRUE(tier->EvictionOrderConsistentForTesting());  // the victims are back in it
  std::vector<std::byte> out(p.size());
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(tier->Read({Key(i), out}).ok()) << i;
    EXPECT_EQ(out, p);
  }
  EXPECT_EQ(tier->Stats().entries, 4u);
  EXPECT_EQ(tier->Stats().used_bytes, 4 * SsdIoBytes(p.size()));
  EXPECT_EQ(tier->RunMaintenance(), 0u);
  EXPECT_FALSE(tier->Write({Key(5), p, 1, 1}).ok());
  EXPECT_EQ(tier->Erase(Key(1)).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->Read({Key(1), out}).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier->Read({Key(2), out}).ok());
}

// An entry erased while an eviction of it deletes it from the index: if
// that delete fails, the victim is not served again (the eviction's
// failure path puts victims back), and its delete is retried, so a restart
// does not bring it back either.
TEST(SsdTierTest, AnEntryErasedDuringItsFailedEvictionStaysErased) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 4 * kSsdBlockBytes * 2);  // four 8 KiB entries
  o.clock = &clock;
  o.high_watermark = o.low_watermark = 1.0;
  std::promise<void> reached, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> deletes{0};
  o.before_index_delete_hook = [&]() -> Status {
    if (deletes.fetch_add(1) != 0) return Status::Ok();
    reached.set_value();
    released.wait();
    return Unavailable("injected: index write failed");
  };
  const std::vector<std::byte> p = RandomBytes(8000, 43);
  std::vector<std::byte> out(p.size());
  {
    auto tier = SsdTier::Open(o).value();
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
      clock.Advance(Seconds(1));  // Key(0) is the least recent
    }
    std::thread writer([&] { (void)tier->Write({Key(4), p, 1, 1}); });  // evicts Key(0)
    reached.get_future().wait();
    (void)tier->Erase(Key(0));
    release.set_value();
    writer.join();
    EXPECT_FALSE(tier->Contains(Key(0)));
    EXPECT_EQ(tier->Read({Key(0), out}).code(), StatusCode::kNotFound);
    EXPECT_TRUE(tier->Read({Key(1), out}).ok());
  }  // closing retries the delete
  auto tier = SsdTier::Open(o).value();
  EXPECT_FALSE(tier->Contains(Key(0)));
  EXPECT_TRUE(tier->Contains(Key(1)));
}

// An erase the index could not record stays pending: never served, erasing
// again is not "not found" until the index has it, and it is retried when
// the index recovers, or at close, so a restart does not bring it back.
TEST(SsdTierTest, AnEraseTheIndexMissedIsRetriedNotResurrected) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  bool fail = false;
  o.before_index_delete_hook = [&] {
    return fail ? Unavailable("injected: index write failed") : Status::Ok();
  };
  const std::vector<std::byte> p = RandomBytes(8000, 51);
  {
    auto tier = SsdTier::Open(o).value();
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(tier->Write({Key(i), p, 1, 1}).ok());
    fail = true;
    EXPECT_EQ(tier->Erase(Key(1)).code(), StatusCode::kUnavailable);
    EXPECT_FALSE(tier->Contains(Key(1)));
    fail = false;
    EXPECT_EQ(tier->Erase(Key(1)).code(), StatusCode::kUnavailable);  // not recorded yet
    clock.Advance(o.write_retry_interval);
    EXPECT_TRUE(tier->Erase(Key(1)).ok());  // the index recovered and recorded it
    EXPECT_EQ(tier->Erase(Key(1)).code(), StatusCode::kNotFound);
    EXPECT_EQ(tier->Stats().used_bytes, 2 * SsdIoBytes(p.size()));
    fail = true;
    EXPECT_EQ(tier->Erase(Key(2)).code(), StatusCode::kUnavailable);
    fail = false;
  }  // closing retries the delete of Key(2)
  auto tier = SsdTier::Open(o).value();
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_FALSE(tier->Contains(Key(2)));
  EXPECT_TRUE(tier->Contains(Key(3)));
  EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(p.size()));
}

// A failed index put (a full disk under RocksDB, say) stops writes, not for
// good: write_retry_interval later the index is reopened, and writes,
// eviction and TTL expiry go on. The failed entries' extents are reused
// once the index durably lacks them.
TEST(SsdTierTest, AFailedIndexWriteRecoversAfterTheRetryInterval) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  bool fail = false;
  o.before_index_put_hook = [&] {
    return fail ? Unavailable("injected: no space for the index") : Status::Ok();
  };
  const std::vector<std::byte> p = RandomBytes(8000, 52);
  {
    auto tier = SsdTier::Open(o).value();
    ASSERT_TRUE(tier->Write({Key(1), p, 1, 1}).ok());
    fail = true;
    EXPECT_EQ(tier->Write({Key(2), p, 1, 1}).code(), StatusCode::kUnavailable);
    fail = false;
    EXPECT_FALSE(tier->Contains(Key(2)));
    EXPECT_FALSE(tier->Stats().writes_enabled);
    EXPECT_EQ(tier->Write({Key(3), p, 1, 1}).code(), StatusCode::kUnavailable);  // stopped
    clock.Advance(o.write_retry_interval);
    ASSERT_TRUE(tier->Write({Key(3), p, 1, 1}).ok());
    EXPECT_TRUE(tier->Stats().writes_enabled);
    ASSERT_TRUE(tier->Erase(Key(1)).ok());
    EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(p.size()));  // Key(2)'s extent is free again
    clock.Advance(o.ttl);
    EXPECT_EQ(tier->RunMaintenance(), 1u);  // Key(3) expired
  }
  auto tier = SsdTier::Open(o).value();
  EXPECT_EQ(tier->Stats().entries, 0u);
}

// Writes Key(1), lets it expire and has `rewrite` put it again with an
// index put that fails after it may have landed (`fail_put` set meanwhile);
// the index then recovers with a write of Key(2), which may reuse the freed
// extents, and the tier restarts. Key(1) must stay gone, Key(2) intact.
void CheckAFailedRewriteStaysDeleted(
    SsdTierOptions o, ManualClock& clock,
    const std::function<Status(SsdTier&, std::span<const std::byte>, std::atomic<bool>&)>&
        rewrite) {
  std::atomic<bool> fail_put{false};
  o.after_index_put_hook = [&] {
    return fail_put ? Unavailable("injected: the index sync failed") : Status::Ok();
  };
  const std::vector<std::byte> v1 = RandomBytes(8000, 60), v2 = RandomBytes(8000, 61),
                               v3 = RandomBytes(8000, 62);
  {
    auto tier = SsdTier::Open(o).value();
    ASSERT_TRUE(tier->Write({Key(1), v1, 1, 1}).ok());
    clock.Advance(o.ttl);
    const Status put = rewrite(*tier, v2, fail_put);
    EXPECT_EQ(put.code(), StatusCode::kUnavailable) << put.ToString();
    EXPECT_FALSE(tier->Contains(Key(1)));
    clock.Advance(o.write_retry_interval);
    ASSERT_TRUE(tier->Write({Key(2), v3, 1, 1}).ok());  // the index recovers first
    EXPECT_EQ(tier->Stats().entries, 1u);
    EXPECT_EQ(tier->Stats().used_bytes, SsdIoBytes(v3.size()));
  }
  o.after_index_put_hook = nullptr;
  o.before_index_delete_hook = nullptr;
  auto tier = SsdTier::Open(o).value();
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->Stats().entries, 1u);
  std::vector<std::byte> out(v3.size());
  ASSERT_TRUE(tier->Read({Key(2), out}).ok());
  EXPECT_EQ(out, v3);
}

// A put that reached the index but reported failure (a failed sync), over
// an expired entry of the same key still in memory. Its retried delete must
// cover the key: neither the old entry nor the new one may come back after
// a restart, since both extents are free again (here the new one is reused
// at once by another key).
TEST(SsdTierTest, AFailedPutOverAnExpiredEntryIsDeletedNotResurrected) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 16 * kSsdBlockBytes);
  o.clock = &clock;
  // No maintenance runs: the expired entry is still in memory at the put.
  CheckAFailedRewriteStaysDeleted(o, clock, [](SsdTier& tier, auto v2, std::atomic<bool>& fail) {
    fail = true;
    Status put = tier.Write({Key(1), v2, 1, 1});
    fail = false;
    return put;
  });
}

// The same, with maintenance retiring the expired entry just before the
// put (it takes it out of memory first) and its own index delete failing
// after it: it must not put the old record back in memory, where it would
// pass for a rewrite and spare the key the delete the failed put waits for.
TEST(SsdTierTest, AFailedEvictionDoesNotShieldAFailedPutFromItsDelete) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path(), 16 * kSsdBlockBytes);
  o.clock = &clock;
  std::promise<void> retired, put_done;
  std::shared_future<void> put_finished = put_done.get_future().share();
  std::atomic<int> deletes{0};
  o.before_index_delete_hook = [&] {
    if (deletes.fetch_add(1) == 0) {  // maintenance's: hold it until the put failed
      retired.set_value();
      put_finished.wait();
    }
    return Status::Ok();
  };
  CheckAFailedRewriteStaysDeleted(o, clock, [&](SsdTier& tier, auto v2, std::atomic<bool>& fail) {
    std::thread maintenance([&] { tier.RunMaintenance(); });
    retired.get_future().wait();
    fail = true;
    Status put = tier.Write({Key(1), v2, 1, 1});
    fail = false;
    put_done.set_value();
    maintenance.join();
    return put;
  });
}

// An access-time hint that fails to persist is only a lost hint: the index
// goes on taking deletes and writes.
TEST(SsdTierTest, AFailedAccessTimeHintLeavesTheIndexWorking) {
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = Options(dir.path());
  o.clock = &clock;
  o.access_persist_interval = 0;  // every read persists its access time
  bool fail = false;
  o.before_index_put_hook = [&] {
    return fail ? Unavailable("injected: index write failed") : Status::Ok();
  };
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(8000, 53);
  ASSERT_TRUE(tier->Write({Key(1), p, 1, 1}).ok());
  ASSERT_TRUE(tier->Write({Key(2), p, 1, 1}).ok());
  fail = true;
  std::vector<std::byte> out(p.size());
  ASSERT_TRUE(tier->Read({Key(1), out}).ok());
  fail = false;
  EXPECT_TRUE(tier->Erase(Key(2)).ok());
  EXPECT_TRUE(tier->Write({Key(3), p, 1, 1}).ok());
  EXPECT_TRUE(tier->Stats().writes_enabled);
}

// A read the device answers short (here: the data file cut under the entry)
// drops the entry, as a checksum mismatch does: it reads as a miss, is no
// longer found, and stays gone after a restart.
TEST(SsdTierTest, AShortReadDropsTheEntry) {
  ScopedTempDir dir;
  SsdTierOptions o = Options(dir.path());
  const std::vector<std::byte> a = RandomBytes(5000, 54), b = RandomBytes(10000, 55);
  {
    auto tier = SsdTier::Open(o).value();
    ASSERT_TRUE(tier->Write({Key(1), a, 1, 1}).ok());
    ASSERT_TRUE(tier->Write({Key(2), b, 1, 1}).ok());
    const std::optional<SsdEntryMeta> meta1 = tier->Lookup(Key(1));
    const std::optional<SsdEntryMeta> meta2 = tier->Lookup(Key(2));
    ASSERT_TRUE(meta1.has_value() && meta2.has_value());
    ASSERT_EQ(meta1->file, meta2->file);
    ASSERT_LT(meta1->offset, meta2->offset);
    ASSERT_EQ(::truncate(tier->DataFilePathForTesting(meta2->file).c_str(),
                         static_cast<off_t>(meta2->offset + kSsdBlockBytes)),
              0);
    std::vector<std::byte> out(b.size());
    EXPECT_EQ(tier->Read({Key(2), out}).code(), StatusCode::kNotFound);
    EXPECT_FALSE(tier->Contains(Key(2)));
    EXPECT_EQ(tier->Read({Key(2), out}).code(), StatusCode::kNotFound);
    std::vector<std::byte> out1(a.size());
    ASSERT_TRUE(tier->Read({Key(1), out1}).ok());  // the neighbour is untouched
    EXPECT_EQ(out1, a);
  }
  auto tier = SsdTier::Open(o).value();
  EXPECT_FALSE(tier->Contains(Key(2)));
  EXPECT_TRUE(tier->Contains(Key(1)));
}

// A 16 MiB tier whose data files sit on `tmpfs` and whose index sits in
// `dir`, off the file system the test fills.
SsdTierOptions OnTmpfs(const ScopedTmpfs& tmpfs, const ScopedTempDir& dir, ManualClock* clock) {
  SsdTierOptions o = Options(tmpfs.path(), 16 << 20);
  o.index_dir = dir.path() + "/index";
  o.clock = clock;
  return o;
}

// Data files on a 1 MiB tmpfs (mounted throughout, so the tier sees it),
// 256 KiB kept free: a batch goes only if the blocks it writes for the
// first time leave that much, so the tier never eats into it; an extent
// written before costs nothing and is reused even so.
TEST(SsdTierTest, MinFreeBytesCountsWhatABatchNewlyWrites) {
  ScopedTmpfs tmpfs(1 << 20);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  ScopedTempDir dir;
  auto free_bytes = [&] { return FreeBytes(tmpfs.path()); };
  ManualClock clock;
  SsdTierOptions o = OnTmpfs(tmpfs, dir, &clock);
  o.min_free_bytes = 256 << 10;
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(300000, 56);  // 296 KiB on disk
  uint64_t stored = 0;
  Status last;
  for (uint64_t i = 0; i < 4; ++i) {
    last = tier->Write({Key(i), p, 1, 1});
    EXPECT_GE(free_bytes(), o.min_free_bytes) << i;
    if (!last.ok()) break;
    ++stored;
  }
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last.ToString();
  EXPECT_EQ(stored, 2u);  // 1 MiB - 2 x 296 KiB leaves too little for a third
  EXPECT_FALSE(tier->Stats().writes_enabled);
  EXPECT_EQ(tier->Stats().entries, stored);
  ASSERT_TRUE(tier->Erase(Key(0)).ok());
  clock.Advance(o.write_retry_interval);
  const uint64_t before = free_bytes();
  ASSERT_TRUE(tier->Write({Key(10), p, 1, 1}).ok());  // into Key(0)'s extent
  EXPECT_EQ(free_bytes(), before);
  std::vector<std::byte> out(p.size());
  ASSERT_TRUE(tier->Read({Key(10), out}).ok());
  EXPECT_EQ(out, p);
  tier.reset();  // close before unmounting
}

// Two batches at once on a 1 MiB tmpfs, 256 KiB kept free: room for one
// 440 KiB entry, not two. The first, admitted and held before it writes,
// has its room reserved, so the second is refused instead of being checked
// against free space the first is about to take. A batch gives its
// reservation back when its writes end, whether they failed or not.
TEST(SsdTierTest, ConcurrentBatchesCannotBothTakeTheSameFreeSpace) {
  ScopedTmpfs tmpfs(1 << 20);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = OnTmpfs(tmpfs, dir, &clock);
  o.min_free_bytes = 256 << 10;
  std::promise<void> admitted, resume;
  std::shared_future<void> resumed = resume.get_future().share();
  std::atomic<int> admissions{0};
  o.before_data_write_hook = [&] {
    if (admissions.fetch_add(1) > 0) return;  // only the first batch waits
    admitted.set_value();
    resumed.wait();
  };
  auto tier = SsdTier::Open(o).value();
  const std::vector<std::byte> p = RandomBytes(450000, 58);  // 440 KiB on disk
  Status first;
  std::thread writer([&] { first = tier->Write({Key(1), p, 1, 1}); });
  const bool held =
      admitted.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  const Status second = held ? tier->Write({Key(2), p, 1, 1}) : Status::Ok();
  resume.set_value();
  writer.join();
  ASSERT_TRUE(held) << "the first batch never passed the free-space check: " << first.ToString();
  EXPECT_TRUE(first.ok()) << first.ToString();
  EXPECT_EQ(second.code(), StatusCode::kUnavailable) << second.ToString();
  EXPECT_GE(FreeBytes(tmpfs.path()), o.min_free_bytes);
  EXPECT_EQ(tier->Stats().entries, 1u);
  // Refused for the other batch's sake alone: that batch fails, writes go on.
  EXPECT_TRUE(tier->Stats().writes_enabled);

  // 584 KiB free now. A 200 KiB batch fits only if neither the first
  // batch's reservation nor that of one whose writes failed is still held.
  const std::vector<std::byte> small = RandomBytes(200 << 10, 59);
  clock.Advance(o.write_retry_interval);
  tier->FailNextSubmitsForTesting(-EIO);
  EXPECT_EQ(tier->Write({Key(3), small, 1, 1}).code(), StatusCode::kUnavailable);
  clock.Advance(o.write_retry_interval);
  EXPECT_TRUE(tier->Write({Key(4), small, 1, 1}).ok());
  EXPECT_GE(FreeBytes(tmpfs.path()), o.min_free_bytes);
  tier.reset();  // close before unmounting
}

// Data files on a 1 MiB tmpfs with a 16 MiB configured tier (the index on
// the disk): writes hit ENOSPC, stop, and everything already stored keeps
// being served. (Index and data on one full file system: ssd_store_test.)
TEST(SsdTierTest, DiskFullStopsWritesAndKeepsServingReads) {
  ScopedTmpfs tmpfs(1 << 20);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  ScopedTempDir dir;
  ManualClock clock;
  SsdTierOptions o = OnTmpfs(tmpfs, dir, &clock);
  o.min_free_bytes = 0;  // run into ENOSPC itself, not the free-space check
  auto opened = SsdTier::Open(o);
  // Detached at once: the open data file keeps the tmpfs alive, and nothing
  // stays mounted whatever happens next.
  tmpfs.Detach();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<SsdTier> tier = std::move(opened).value();
  const std::vector<std::byte> p = RandomBytes(100000, 6);
  uint64_t stored = 0;
  Status last;
  for (uint64_t i = 0; i < 40; ++i) {
    last = tier->Write({Key(i), p, 1, 1});
    if (!last.ok()) break;
    ++stored;
  }
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last.ToString();
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, 40u);
  SsdTierStats st = tier->Stats();
  EXPECT_FALSE(st.writes_enabled);
  EXPECT_GE(st.write_failures, 1u);
  EXPECT_EQ(st.entries, stored);  // the failed write left nothing behind
  EXPECT_EQ(st.used_bytes, stored * SsdIoBytes(p.size()));
  // Stopped: refused without touching the disk.
  EXPECT_EQ(tier->Write({Key(1000), p, 1, 1}).code(), StatusCode::kUnavailable);
  std::vector<std::byte> out(p.size());
  for (uint64_t i = 0; i < stored; ++i) {
    ASSERT_TRUE(tier->Read({Key(i), out}).ok()) << i;
    EXPECT_EQ(out, p);
  }
  clock.Advance(o.write_retry_interval);
  ASSERT_TRUE(tier->Erase(Key(0)).ok());  // room again: the retry succeeds
  EXPECT_TRUE(tier->Write({Key(2000), p, 1, 1}).ok());
  EXPECT_TRUE(tier->Stats().writes_enabled);
}

}  // namespace
}  // namespace strata

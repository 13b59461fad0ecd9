// The SSD tier on its own: round trips, crash safety between data and index,
// checksum failures, TTL, watermarks, eviction order, restart accounting.
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
#include "ssd_tier_test_util.h"
#include "strata/layout.h"
#include "temp_dir.h"
#include "test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::ScopedTempDir;
using testing::ScopedTmpfs;
using testing::ssd::AlignedBuffer;
using testing::ssd::EightOnDemand;
using testing::ssd::FreeBytes;
using testing::ssd::Key;
using testing::ssd::ListAll;
using testing::ssd::Options;

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

}  // namespace
}  // namespace strata

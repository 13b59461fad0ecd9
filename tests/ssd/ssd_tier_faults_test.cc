// The SSD tier when its index or its disk fails: injected RocksDB errors
// (deletes, puts, access-time hints), short reads, a full file system.
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
using testing::ssd::FreeBytes;
using testing::ssd::Key;
using testing::ssd::ListAll;
using testing::ssd::Options;

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

// Many threads commit, match, fetch, delete, abort and run maintenance on
// one small store (so eviction is constant) while invariants are checked:
// every byte a fetch reports ready is exactly what was committed, a leased
// entry is never lost, and occupancy is exact when the dust settles.
// Bounded: a fixed number of operations per thread.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "strata/cache_store.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::MakePayload;
using testing::TestStore;
using testing::TinyGlobalLayout;
using testing::Tokens;

constexpr int kWorkers = 4;
constexpr int kOpsPerWorker = 1500;
constexpr int kPrompts = 24;

TEST(ConcurrencyTest, StressKeepsInvariants) {
  // ~40 tiny blocks of room for prompts of up to 8 blocks: heavy eviction.
  TestStore t(40 * 512, 0.9, 0.7);
  // Prompts share prefixes (same first blocks, then diverge).
  std::vector<std::vector<uint32_t>> prompts;
  for (int p = 0; p < kPrompts; ++p) {
    auto tokens = Tokens(32, 1000 + p % 4);  // 4 families share their first blocks
    auto tail = Tokens(32, 2000 + p);
    std::copy(tail.begin(), tail.begin() + 4 * (p % 5), tokens.end() - 4 * (p % 5));
    prompts.push_back(tokens);
  }
  std::atomic<uint64_t> verified_blocks{0}, leased_fetches{0}, failures{0};
  std::atomic<bool> stop_maintenance{false};

  auto worker = [&](int id) {
    std::mt19937 rng(id);
    for (int op = 0; op < kOpsPerWorker; ++op) {
      const auto& tokens = prompts[rng() % prompts.size()];
      const bool lease = rng() % 2 == 0;
      auto m = t.store->Match(t.writer, t.Request(tokens, lease ? Minutes(10) : 0));
      if (!m.ok()) {
        failures++;
        continue;
      }
      const auto keys = t.Keys(tokens, t.writer);
      // Fetch the hit and check every verified block byte for byte.
      std::vector<std::vector<std::byte>> bufs(m->blocks.size());
      FetchRequest req;
      req.match = &*m;
      for (size_t b = 0; b < bufs.size(); ++b) {
        bufs[b].resize(m->blocks[b].payload_bytes);
        req.block_buffers.emplace_back(bufs[b]);
      }
      FetchOutcome out = t.store->Fetch(t.writer, req).Wait();
      if (lease) {
        // A live lease means nothing it covers may go missing.
        if (!out.status.ok() || out.blocks_ready != m->blocks.size()) {
          ADD_FAILURE() << "leased fetch: " << out.status.ToString() << " ready "
                        << out.blocks_ready << "/" << m->blocks.size();
          failures++;
        }
        leased_fetches++;
      }
      for (uint32_t b = 0; b < out.blocks_ready; ++b) {
        if (bufs[b] != MakePayload(TinyGlobalLayout(), keys[b].Prefix64()).bytes) failures++;
        verified_blocks++;
      }
      if (lease && rng() % 4 != 0) {
        if (!t.store->Abort(t.writer, m->lease).ok()) failures++;
      }  // else: left for maintenance to expire or shutdown to release
      // Commit what was missing; sometimes reserve and walk away instead.
      const size_t hit = m->blocks.size();
      if (hit < keys.size()) {
        if (rng() % 8 == 0) {
          CommitBlock cb{keys[hit], StateKind::kGlobalKv, testing::kTinyGlobalLayout,
                         TinyGlobalLayout().PayloadBytes(), std::nullopt};
          if (hit > 0) cb.parent = keys[hit - 1];
          auto r = t.store->Reserve(t.writer, testing::TestModel(), std::span(&cb, 1));
          if (r.ok() && r->write_lease != 0 && rng() % 2 == 0) {
            (void)t.store->Abort(t.writer, r->write_lease);
          }
        } else {
          auto r = t.CommitBlocks(tokens, hit, std::min(keys.size(), hit + 1 + rng() % 4));
          if (!r.ok() && r.status().code() != StatusCode::kResourceExhausted) {
            ADD_FAILURE() << "commit: " << r.status().ToString();
            failures++;
          }
        }
      }
      if (rng() % 50 == 0 && !keys.empty()) {
        (void)t.store->Delete(t.writer, keys[rng() % keys.size()], StateKind::kGlobalKv);
      }
    }
  };
  std::thread maintenance([&] {
    while (!stop_maintenance.load()) {
      t.clock.Advance(10 * kNanosPerMilli);  // write leases (30 s) expire now and then
      t.store->RunMaintenance();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> threads;
  threads.reserve(kWorkers);
  for (int i = 0; i < kWorkers; ++i) threads.emplace_back(worker, i);
  for (auto& th : threads) th.join();
  stop_maintenance = true;
  maintenance.join();

  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(verified_blocks.load(), 0u);
  EXPECT_GT(leased_fetches.load(), 0u);
  Status st = t.store->CheckInvariantsForTesting();
  EXPECT_TRUE(st.ok()) << st.ToString();
  // Let every lease run out: the store drains to committed entries only.
  t.clock.Advance(Hours(2));
  t.store->RunMaintenance();
  EXPECT_EQ(t.store->Stats().read_leases, 0u);
  EXPECT_EQ(t.store->Stats().write_leases, 0u);
  EXPECT_EQ(t.store->Stats().reserved_entries, 0u);
  EXPECT_EQ(t.store->Stats().deleting_entries, 0u);
  st = t.store->CheckInvariantsForTesting();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LE(t.store->Stats().used_bytes, t.store->Stats().capacity_bytes);
}

// Readers without a lease race deletes and re-commits of the very keys they
// read: a reader must never see a recycled entry, and no pin may be lost.
TEST(ConcurrencyTest, FetchRacesDeleteAndRecommit) {
  TestStore t(64 * 512, 1.0, 1.0);
  const auto tokens = Tokens(8, 77);
  const auto keys = t.Keys(tokens, t.writer);
  ASSERT_TRUE(t.CommitBlocks(tokens, 0, 2).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, served{0};
  std::thread reader([&] {
    std::vector<std::byte> buf(TinyGlobalLayout().PayloadBytes());
    const auto expect = MakePayload(TinyGlobalLayout(), keys[0].Prefix64()).bytes;
    while (!stop.load()) {
      MatchResult m;
      m.block_tokens = testing::kTinyBlockTokens;
      m.blocks.push_back({keys[0], Tier::kDram, testing::kTinyGlobalLayout, buf.size()});
      FetchRequest req;
      req.match = &m;
      req.block_buffers = {buf};
      const FetchOutcome out = t.store->Fetch(t.writer, req).Wait();
      if (out.blocks_ready == 1) {
        served++;
        if (buf != expect) bad++;
      }
    }
  });
  for (int i = 0; i < 3000; ++i) {
    (void)t.store->Delete(t.writer, keys[0], StateKind::kGlobalKv);
    auto r = t.CommitBlocks(tokens, 0, 2);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0u);
  Status st = t.store->CheckInvariantsForTesting();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(t.store->Stats().deleting_entries, 0u);
}

}  // namespace
}  // namespace strata

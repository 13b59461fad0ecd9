// Measures, in one run and on the same bytes:
//  - fetch of a fully cached 131,072-token prompt (512 blocks of 227,840 B
//    of global KV, verified layer group by layer group) vs single-threaded
//    memcpy of the same number of bytes between buffers of the same size;
//  - commit (reserve, copy, verify, publish) of those blocks vs memcpy;
//  - match of that prompt (hashing included) vs hashing the tokens alone.
#include "store_bench.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench_util.h"
#include "strata/cache_store.h"
#include "strata/chain_key.h"
#include "strata/layout.h"

namespace strata::bench {
namespace {

// A buffer with every page touched, so first-touch faults stay out of timings.
std::vector<std::byte> Touched(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i += 4096) v[i] = std::byte{1};
  return v;
}

double Gbps(uint64_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

}  // namespace

int RunStoreBench(const StoreBenchOptions& o) {
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const uint64_t payload = layout.PayloadBytes();
  const uint32_t blocks = o.prompt_tokens / layout.block_tokens;
  const uint64_t total = payload * blocks;

  CacheStoreOptions so;
  so.dram.capacity_bytes = total * 2 + (64ull << 20);
  so.maintenance_interval = 0;
  auto opened = CacheStore::Open(so);
  if (!opened.ok()) {
    std::fprintf(stderr, "strata-bench store: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<CacheStore> store = std::move(opened).value();
  const Principal caller{"bench", Role::kAdmin};
  const ModelId model = ModelFingerprint{"bench-weights", "byte-tokenizer", "none", 1, "fp4"}.Id();

  std::fprintf(stderr, "strata-bench store: %u blocks x %llu B = %.1f MiB, arena %.1f MiB%s\n",
               blocks, static_cast<unsigned long long>(payload), total / 1048576.0,
               so.dram.capacity_bytes / 1048576.0,
               store->Stats().huge_pages ? " (huge pages)" : "");

  // The sample workload: one long prompt, random tokens, random KV bytes.
  std::mt19937_64 rng(42);
  std::vector<uint32_t> tokens(o.prompt_tokens);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % 129280);
  const ChainRoot root{caller.ns, model, ""};
  const std::vector<ChainKey> keys =
      ChainKeys::ForPrompt(root, tokens, layout.block_tokens).value();
  std::vector<std::byte> source = Touched(total);
  std::vector<uint64_t> checksums(blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    std::byte* p = source.data() + b * payload;
    for (uint64_t i = layout.HeaderBytes(); i + 8 <= payload; i += 8) {
      const uint64_t r = rng();
      std::memcpy(p + i, &r, 8);
    }
    checksums[b] = SealPayload(layout, layout.block_tokens, {p, payload}).value();
  }
  std::vector<CommitPayload> commit(blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    commit[b].block = {keys[b], StateKind::kGlobalKv, layout.id, payload, std::nullopt};
    if (b > 0) commit[b].block.parent = keys[b - 1];
    commit[b].bytes = {source.data() + b * payload, payload};
    commit[b].checksum = checksums[b];
  }
  std::vector<std::byte> dest = Touched(total);

  // memcpy baseline: the same bytes, block by block, one thread.
  std::vector<double> memcpy_s;
  for (int r = 0; r < o.fetch_rounds; ++r) {
    const double t0 = NowSeconds();
    for (uint32_t b = 0; b < blocks; ++b) {
      std::memcpy(dest.data() + b * payload, source.data() + b * payload, payload);
    }
    memcpy_s.push_back(NowSeconds() - t0);
  }

  // Commit: in batches of 64 blocks (a prefill chunk), parents first.
  std::vector<double> commit_s;
  for (int r = 0; r < o.commit_rounds; ++r) {
    if (r > 0) (void)store->Delete(caller, keys[0], StateKind::kGlobalKv);  // cascades
    const double t0 = NowSeconds();
    for (uint32_t b = 0; b < blocks; b += 64) {
      const uint32_t n = std::min<uint32_t>(64, blocks - b);
      auto res = store->Commit(caller, model, std::span(commit).subspan(b, n));
      if (!res.ok() || res->published != n) {
        std::fprintf(stderr, "commit failed: %s\n",
                     res.ok() ? "not all published" : res.status().ToString().c_str());
        return 1;
      }
    }
    commit_s.push_back(NowSeconds() - t0);
    Progress("commit rounds", r + 1, o.commit_rounds);
  }

  // Fetch: match once under a lease, then fetch the whole prefix each round.
  MatchRequest mreq;
  mreq.model_id = model;
  mreq.tokens = tokens;
  mreq.block_tokens = layout.block_tokens;
  mreq.take_lease = true;
  mreq.lease_ttl = Minutes(5);
  auto leased = store->Match(caller, mreq);
  if (!leased.ok() || leased->blocks.size() != blocks) {
    std::fprintf(stderr, "match did not hit every block\n");
    return 1;
  }
  FetchRequest freq;
  freq.match = &*leased;
  for (uint32_t b = 0; b < blocks; ++b)
    freq.block_buffers.emplace_back(dest.data() + b * payload, payload);
  std::vector<double> fetch_s;
  for (int r = 0; r < o.fetch_rounds; ++r) {
    const double t0 = NowSeconds();
    const FetchOutcome out = store->Fetch(caller, freq).Wait();
    fetch_s.push_back(NowSeconds() - t0);
    if (!out.status.ok() || out.blocks_ready != blocks) {
      std::fprintf(stderr, "fetch failed: %s\n", out.status.ToString().c_str());
      return 1;
    }
    Progress("fetch rounds", r + 1, o.fetch_rounds);
  }
  if (std::memcmp(dest.data(), source.data(), total) != 0) {
    std::fprintf(stderr, "fetched bytes differ from committed bytes\n");
    return 1;
  }
  (void)store->Abort(caller, leased->lease);

  // Match (no lease, as a router would) vs hashing the same tokens alone.
  mreq.take_lease = false;
  std::vector<double> match_us, hash_us;
  for (int r = 0; r < o.match_rounds; ++r) {
    double t0 = NowSeconds();
    auto m = store->Match(caller, mreq);
    match_us.push_back((NowSeconds() - t0) * 1e6);
    if (!m.ok() || m->blocks.size() != blocks) {
      std::fprintf(stderr, "match lost blocks\n");
      return 1;
    }
    t0 = NowSeconds();
    auto k = ChainKeys::ForPrompt(root, tokens, layout.block_tokens);
    hash_us.push_back((NowSeconds() - t0) * 1e6);
    if (!k.ok()) return 1;
    if ((r + 1) % 50 == 0 || r + 1 == o.match_rounds)
      Progress("match rounds", r + 1, o.match_rounds);
  }

  const double memcpy_gbps = Gbps(total, Median(memcpy_s));
  const double fetch_gbps = Gbps(total, Median(fetch_s));
  const double commit_gbps = Gbps(total, Median(commit_s));
  const double match_p50 = Median(match_us), match_p99 = Percentile(match_us, 0.99);
  const double hash_p50 = Median(hash_us), hash_p99 = Percentile(hash_us, 0.99);
  const double fetch_ratio = fetch_gbps / memcpy_gbps;
  const double match_ratio = match_p50 / hash_p50;

  if (o.json) {
    JsonObject j;
    j.Add("blocks", blocks);
    j.Add("block_bytes", static_cast<double>(payload));
    j.Add("fetch_gbps", fetch_gbps);
    j.Add("commit_gbps", commit_gbps);
    j.Add("memcpy_gbps", memcpy_gbps);
    j.Add("fetch_vs_memcpy", fetch_ratio);
    j.Add("commit_vs_memcpy", commit_gbps / memcpy_gbps);
    j.Add("match_p50_us", match_p50);
    j.Add("match_p99_us", match_p99);
    j.Add("hash_p50_us", hash_p50);
    j.Add("hash_p99_us", hash_p99);
    j.Add("match_vs_hash_p50", match_ratio);
    j.AddBool("target_fetch_met", fetch_ratio >= 0.8);
    j.AddBool("target_match_met", match_ratio <= 1.2);
    std::printf("%s\n", j.Dump().c_str());
    return 0;
  }
  Table t;
  t.Add("blocks x bytes", std::to_string(blocks) + " x " + std::to_string(payload),
        "global KV, 256 tokens/block, 890 B/token + header");
  t.Add("memcpy (baseline)", Fixed(memcpy_gbps, 2) + " GB/s", "one thread, same bytes");
  t.Add("fetch", Fixed(fetch_gbps, 2) + " GB/s",
        "x" + Fixed(fetch_ratio, 2) + " of memcpy (target >= 0.80) " +
            (fetch_ratio >= 0.8 ? "MET" : "MISSED"));
  t.Add("commit", Fixed(commit_gbps, 2) + " GB/s",
        "x" + Fixed(commit_gbps / memcpy_gbps, 2) + " of memcpy (reserve+copy+verify+publish)");
  t.Add("hash only p50 / p99", Fixed(hash_p50, 1) + " / " + Fixed(hash_p99, 1) + " us",
        "SHA-256 chain keys of " + std::to_string(o.prompt_tokens) + " tokens");
  t.Add("match p50 / p99", Fixed(match_p50, 1) + " / " + Fixed(match_p99, 1) + " us",
        "x" + Fixed(match_ratio, 2) + " of hashing (target <= 1.20) " +
            (match_ratio <= 1.2 ? "MET" : "MISSED"));
  t.Print("strata-bench store (in-process, DRAM tier)");
  return 0;
}

}  // namespace strata::bench

// Measures, in one run on one file system:
//  - SsdTier writes (data, fdatasync, index) of `block_bytes` payloads,
//    sequential placement, vs fio --rw=write;
//  - SsdTier reads, checksum-verified, in write order and in random order,
//    vs fio --rw=read / --rw=randread;
//  - store-level promotion: fetch of an SSD-only block (SSD read into the
//    DRAM arena, verify, copy out), p50/p99, next to a DRAM-hit fetch.
// fio gets the same block size, queue depth, io_uring and O_DIRECT.
#include "ssd_bench.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "bench_util.h"
#include "ssd/ssd_tier.h"
#include "strata/cache_store.h"
#include "strata/chain_key.h"
#include "strata/layout.h"

namespace strata::bench {
namespace {

double Gbps(uint64_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte, FreeDeleter>;
AlignedBytes AlignedAlloc(size_t n) {
  return AlignedBytes(static_cast<std::byte*>(std::aligned_alloc(kSsdBlockBytes, n)));
}

SsdKey BenchKey(uint64_t i) {
  SsdKey k;
  k.ns = "bench";
  for (size_t b = 0; b < 8; ++b) k.chain.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  return k;
}

// Runs fio and returns its bandwidth in GB/s for `rw`, or a negative value.
double RunFio(const SsdBenchOptions& o, const std::string& rw, uint64_t bytes, uint64_t bs) {
  const std::string file = o.dir + "/fio.dat";
  const std::string cmd = o.fio + " --name=strata --filename=" + file +
                          " --size=" + std::to_string(bytes) + " --bs=" + std::to_string(bs) +
                          " --iodepth=" + std::to_string(o.queue_depth) +
                          " --fallocate=none --ioengine=io_uring --direct=1 --rw=" + rw +
                          " --numjobs=1 --norandommap --randrepeat=0 --output-format=json 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    std::fprintf(stderr, "fio (%s, bs %llu) failed:\n%s\n", rw.c_str(),
                 static_cast<unsigned long long>(bs), out.substr(0, 2000).c_str());
    return -1;
  }
  // jobs[0].read.bw_bytes or jobs[0].write.bw_bytes (bytes/s).
  // ("rw" : "write" in the job options must not be taken for the section.)
  const std::string section =
      rw.find("write") != std::string::npos ? "\"write\" : {" : "\"read\" : {";
  const size_t at = out.find(section);
  const size_t bw = at == std::string::npos ? at : out.find("\"bw_bytes\"", at);
  const size_t colon = bw == std::string::npos ? bw : out.find(':', bw);
  if (colon == std::string::npos) return -1;
  return std::strtod(out.c_str() + colon + 1, nullptr) / 1e9;
}

// fio with the I/O SsdTier issues per block: the block rounded up to 4 KiB
// (227,840 B -> 229,376 B), at 4 KiB-aligned offsets, on a sparse file like
// SsdTier's data files (--fallocate=none). fio's bytes/s count the padding
// too, so the ratio slightly favours fio. (fio at bs=227,840 itself is no
// baseline on ext4: O_DIRECT writes that end mid-block are serialised, and
// it writes at a fraction of the device's speed.)
double Fio(const SsdBenchOptions& o, const std::string& rw, uint64_t bytes, uint64_t* bs_used) {
  *bs_used = SsdIoBytes(o.block_bytes);
  return RunFio(o, rw, bytes, *bs_used);
}

struct TierResults {
  double write_gbps = 0, read_seq_gbps = 0, read_rand_gbps = 0;
};

Result<TierResults> BenchTier(const SsdBenchOptions& o, uint64_t blocks) {
  TierResults r;
  SsdTierOptions to;
  to.dir = o.dir + "/tier";
  to.capacity_bytes = blocks * SsdIoBytes(o.block_bytes) * 11 / 10 + (64 << 20);
  to.queue_depth = o.queue_depth;
  to.rings = 1;
  to.io_buffer_bytes = SsdIoBytes(o.block_bytes);
  auto opened = SsdTier::Open(to);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<SsdTier> tier = std::move(opened).value();

  // Writes: distinct random payloads per batch slot, so every block differs
  // in what it checksums.
  const uint32_t batch = o.batch;
  // Aligned sources with 4 KiB-rounded room: written in place, as the
  // store's write-back does from its arena.
  const uint64_t slot = SsdIoBytes(o.block_bytes);
  AlignedBytes src = AlignedAlloc(slot * batch);
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < slot * batch; ++i) src.get()[i] = static_cast<std::byte>(rng());
  const double w0 = NowSeconds();
  for (uint64_t i = 0; i < blocks; i += batch) {
    std::vector<SsdWrite> writes;
    for (uint64_t j = i; j < std::min<uint64_t>(blocks, i + batch); ++j) {
      const std::span<const std::byte> payload(src.get() + (j - i) * slot, o.block_bytes);
      writes.push_back({BenchKey(j), payload, j, kV41GlobalKvLayoutId, slot});
    }
    for (const Status& st : tier->WriteBatch(writes)) {
      if (!st.ok()) return st;
    }
  }
  r.write_gbps = Gbps(blocks * o.block_bytes, NowSeconds() - w0);

  // Reads into aligned buffers (direct, no bounce copy), verified.
  AlignedBytes dst = AlignedAlloc(slot * batch);
  auto read_all = [&](const std::vector<uint64_t>& order) -> Result<double> {
    const double t0 = NowSeconds();
    for (uint64_t i = 0; i < order.size(); i += batch) {
      std::vector<SsdRead> reads;
      for (uint64_t j = i; j < std::min<uint64_t>(order.size(), i + batch); ++j) {
        reads.push_back({BenchKey(order[j]), {dst.get() + (j - i) * slot, slot}});
      }
      for (const Status& st : tier->ReadBatch(reads)) {
        if (!st.ok()) return st;
      }
    }
    return Gbps(order.size() * o.block_bytes, NowSeconds() - t0);
  };
  std::vector<uint64_t> order(blocks);
  for (uint64_t i = 0; i < blocks; ++i) order[i] = i;
  auto seq = read_all(order);
  if (!seq.ok()) return seq.status();
  r.read_seq_gbps = *seq;
  std::shuffle(order.begin(), order.end(), rng);
  auto rnd = read_all(order);
  if (!rnd.ok()) return rnd.status();
  r.read_rand_gbps = *rnd;
  return r;
}

struct PromoteResults {
  double p50_us = 0, p99_us = 0, dram_p50_us = 0, dram_p99_us = 0;
  double cold_prompt_gbps = 0;  // match + fetch of whole SSD-only prompts
};

// Cold prompts: chains of this many blocks, each fetched whole from the SSD.
constexpr size_t kColdPrompts = 4;
constexpr size_t kColdPromptBlocks = 64;

// V4.1 blocks committed through a store, written back, the store reopened
// (DRAM empty), then each block fetched: its first fetch promotes it.
Result<PromoteResults> BenchPromote(const SsdBenchOptions& o) {
  const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  const uint64_t payload = layout.PayloadBytes();
  CacheStoreOptions so;
  const uint64_t blocks = o.promote_blocks + kColdPrompts * kColdPromptBlocks;
  so.dram.capacity_bytes = (blocks + 16) * SsdIoBytes(payload) + (16 << 20);
  so.maintenance_interval = 0;
  SsdTierOptions ssd;
  ssd.dir = o.dir + "/store";
  ssd.capacity_bytes = blocks * SsdIoBytes(payload) * 2 + (64 << 20);
  ssd.queue_depth = o.queue_depth;
  so.ssd = ssd;
  const Principal caller{"bench", Role::kAdmin};
  const ModelId model = ModelFingerprint{"bench-weights", "byte-tokenizer", "none", 1, "fp4"}.Id();
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint32_t>> prompts(o.promote_blocks,
                                             std::vector<uint32_t>(layout.block_tokens));
  for (auto& p : prompts) {
    for (auto& t : p) t = static_cast<uint32_t>(rng() % 129280);
  }
  std::vector<std::vector<uint32_t>> cold(
      kColdPrompts, std::vector<uint32_t>(kColdPromptBlocks * layout.block_tokens));
  for (auto& p : cold) {
    for (auto& t : p) t = static_cast<uint32_t>(rng() % 129280);
  }
  {
    auto opened = CacheStore::Open(so);
    if (!opened.ok()) return opened.status();
    std::unique_ptr<CacheStore> store = std::move(opened).value();
    std::vector<std::byte> bytes(payload);
    // Every prompt is a chain (the single-block ones of one block).
    for (const auto* list : {&prompts, &cold}) {
      for (const auto& p : *list) {
        auto keys = ChainKeys::ForPrompt({caller.ns, model, ""}, p, layout.block_tokens);
        if (!keys.ok()) return keys.status();
        for (size_t b = 0; b < keys->size(); ++b) {
          for (size_t i = layout.HeaderBytes(); i < bytes.size(); ++i) {
            bytes[i] = static_cast<std::byte>(rng());
          }
          const uint64_t sum = SealPayload(layout, layout.block_tokens, bytes).value();
          CommitPayload cp{{keys->at(b), StateKind::kGlobalKv, layout.id, payload,
                            b > 0 ? std::optional<ChainKey>(keys->at(b - 1)) : std::nullopt},
                           bytes,
                           sum};
          auto r = store->Commit(caller, model, std::span(&cp, 1));
          if (!r.ok()) return r.status();
        }
      }
    }
    store->FlushWriteBack();
  }
  auto opened = CacheStore::Open(so);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<CacheStore> store = std::move(opened).value();
  // Whole cold prompts first: a leased match that promotes its SSD-only
  // blocks (what a node does for a remote caller), then the fetch.
  std::vector<std::vector<std::byte>> prompt_out(kColdPromptBlocks,
                                                 std::vector<std::byte>(payload));
  const double cold_start = NowSeconds();
  for (const auto& p : cold) {
    auto keys = ChainKeys::ForPrompt({caller.ns, model, ""}, p, layout.block_tokens);
    if (!keys.ok()) return keys.status();
    MatchKeysRequest req;
    req.model_id = model;
    req.root = ChainKeys::Root({caller.ns, model, ""});
    req.keys = *keys;
    req.block_tokens = layout.block_tokens;
    req.want_swa = false;
    req.take_lease = true;
    req.promote_ssd = true;
    auto m = store->MatchKeys(caller, req);
    if (!m.ok()) return m.status();
    if (m->blocks.size() != kColdPromptBlocks) return Internal("a cold prompt did not match whole");
    FetchRequest fr;
    fr.match = &*m;
    for (auto& b : prompt_out) fr.block_buffers.emplace_back(b);
    const FetchOutcome f = store->Fetch(caller, fr).Wait();
    if (!f.status.ok()) return f.status;
    (void)store->Abort(caller, m->lease);
  }
  const double cold_seconds = NowSeconds() - cold_start;
  std::vector<std::byte> out(payload);
  std::vector<double> promote_us, dram_us;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& p : prompts) {
      MatchRequest req;
      req.model_id = model;
      req.tokens = p;
      req.block_tokens = layout.block_tokens;
      req.want_swa = false;
      auto m = store->Match(caller, req);
      if (!m.ok()) return m.status();
      if (m->blocks.size() != 1) return Internal("a committed block did not match");
      FetchRequest fr;
      fr.match = &*m;
      fr.block_buffers = {out};
      const double t0 = NowSeconds();
      const FetchOutcome f = store->Fetch(caller, fr).Wait();
      const double us = (NowSeconds() - t0) * 1e6;
      if (!f.status.ok()) return f.status;
      (pass == 0 ? promote_us : dram_us).push_back(us);
    }
  }
  PromoteResults r;
  r.p50_us = Median(promote_us);
  r.p99_us = Percentile(promote_us, 0.99);
  r.dram_p50_us = Median(dram_us);
  r.dram_p99_us = Percentile(dram_us, 0.99);
  r.cold_prompt_gbps =
      static_cast<double>(kColdPrompts * kColdPromptBlocks * payload) / cold_seconds / 1e9;
  return r;
}

}  // namespace

int RunSsdBench(const SsdBenchOptions& o) {
  std::error_code ec;
  std::filesystem::remove_all(o.dir, ec);
  std::filesystem::create_directories(o.dir, ec);
  if (ec) {
    std::fprintf(stderr, "strata-bench ssd: cannot create %s: %s\n", o.dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  const uint64_t blocks = std::max<uint64_t>(1, (o.size_mib << 20) / o.block_bytes);
  const uint64_t bytes = blocks * o.block_bytes;
  std::fprintf(stderr, "strata-bench ssd: %llu blocks x %llu B = %.0f MiB per pattern, qd %u, %s\n",
               static_cast<unsigned long long>(blocks),
               static_cast<unsigned long long>(o.block_bytes), bytes / 1048576.0, o.queue_depth,
               o.dir.c_str());

  // Rounds alternate SsdTier and fio so that drift in the device (cloud
  // disks vary a lot) hits both alike; medians are reported.
  std::vector<double> t_write, t_seq, t_rand, f_write, f_seq, f_rand;
  uint64_t fio_bs = 0;
  for (int round = 0; round < o.rounds; ++round) {
    auto tier = BenchTier(o, blocks);
    std::filesystem::remove_all(o.dir + "/tier", ec);
    if (!tier.ok()) {
      std::fprintf(stderr, "strata-bench ssd: %s\n", tier.status().ToString().c_str());
      return 1;
    }
    const double fw = Fio(o, "write", bytes, &fio_bs);
    const double fr = Fio(o, "read", bytes, &fio_bs);
    const double frr = Fio(o, "randread", bytes, &fio_bs);
    std::filesystem::remove(o.dir + "/fio.dat", ec);
    if (fw < 0 || fr < 0 || frr < 0) {
      std::fprintf(stderr, "strata-bench ssd: fio did not run (see above)\n");
      return 1;
    }
    t_write.push_back(tier->write_gbps);
    t_seq.push_back(tier->read_seq_gbps);
    t_rand.push_back(tier->read_rand_gbps);
    f_write.push_back(fw);
    f_seq.push_back(fr);
    f_rand.push_back(frr);
    Progress("rounds", round + 1, o.rounds);
  }
  TierResults median;
  median.write_gbps = Median(t_write);
  median.read_seq_gbps = Median(t_seq);
  median.read_rand_gbps = Median(t_rand);
  const TierResults* tier = &median;
  const double fio_write = Median(f_write), fio_read = Median(f_seq), fio_randread = Median(f_rand);
  auto promote = BenchPromote(o);
  std::filesystem::remove_all(o.dir, ec);
  if (!promote.ok()) {
    std::fprintf(stderr, "strata-bench ssd: %s\n", promote.status().ToString().c_str());
    return 1;
  }
  // read_gbps is the random-order read (a cache's access pattern).
  const double read_ratio = tier->read_rand_gbps / fio_randread;
  const double read_seq_ratio = tier->read_seq_gbps / fio_read;
  const double write_ratio = tier->write_gbps / fio_write;
  const bool read_met = read_ratio >= 0.9, write_met = write_ratio >= 0.9;

  if (o.json) {
    JsonObject j;
    j.Add("block_bytes", static_cast<double>(o.block_bytes));
    j.Add("fio_block_bytes", static_cast<double>(fio_bs));
    j.Add("queue_depth", o.queue_depth);
    j.Add("bytes_per_pattern", static_cast<double>(bytes));
    j.Add("read_gbps", tier->read_rand_gbps);
    j.Add("fio_read_gbps", fio_randread);
    j.Add("read_vs_fio", read_ratio);
    j.Add("read_seq_gbps", tier->read_seq_gbps);
    j.Add("fio_read_seq_gbps", fio_read);
    j.Add("read_seq_vs_fio", read_seq_ratio);
    j.Add("write_gbps", tier->write_gbps);
    j.Add("fio_write_gbps", fio_write);
    j.Add("write_vs_fio", write_ratio);
    j.Add("cold_prompt_gbps", promote->cold_prompt_gbps);
    j.Add("cold_prompt_vs_fio_randread", promote->cold_prompt_gbps / fio_randread);
    j.Add("promote_p50_us", promote->p50_us);
    j.Add("promote_p99_us", promote->p99_us);
    j.Add("dram_fetch_p50_us", promote->dram_p50_us);
    j.Add("dram_fetch_p99_us", promote->dram_p99_us);
    j.AddBool("target_read_met", read_met);
    j.AddBool("target_write_met", write_met);
    std::printf("%s\n", j.Dump().c_str());
    return 0;
  }
  Table t;
  t.Add("block / fio bs", std::to_string(o.block_bytes) + " / " + std::to_string(fio_bs),
        "queue depth " + std::to_string(o.queue_depth) + ", io_uring, O_DIRECT");
  t.Add("fio randread (baseline)", Fixed(fio_randread, 2) + " GB/s", "");
  t.Add("SsdTier random read", Fixed(tier->read_rand_gbps, 2) + " GB/s",
        "x" + Fixed(read_ratio, 2) + " of fio (target >= 0.90) " + (read_met ? "MET" : "MISSED") +
            ", checksum-verified");
  t.Add("fio read (baseline)", Fixed(fio_read, 2) + " GB/s", "");
  t.Add("SsdTier sequential read", Fixed(tier->read_seq_gbps, 2) + " GB/s",
        "x" + Fixed(read_seq_ratio, 2) + " of fio, checksum-verified");
  t.Add("fio write (baseline)", Fixed(fio_write, 2) + " GB/s", "no fsync");
  t.Add("SsdTier write", Fixed(tier->write_gbps, 2) + " GB/s",
        "x" + Fixed(write_ratio, 2) + " of fio (target >= 0.90) " + (write_met ? "MET" : "MISSED") +
            ", fdatasync + index per " + std::to_string(o.batch) + " blocks");
  t.Add("cold prompt fetch", Fixed(promote->cold_prompt_gbps, 2) + " GB/s",
        "x" + Fixed(promote->cold_prompt_gbps / fio_randread, 2) + " of fio randread; " +
            std::to_string(kColdPromptBlocks) + "-block prompts: leased match promotes, fetch");
  t.Add("promote p50 / p99", Fixed(promote->p50_us, 1) + " / " + Fixed(promote->p99_us, 1) + " us",
        "fetch of an SSD-only block through the store");
  t.Add("DRAM fetch p50 / p99",
        Fixed(promote->dram_p50_us, 1) + " / " + Fixed(promote->dram_p99_us, 1) + " us",
        "the same blocks, now in DRAM");
  t.Print("strata-bench ssd (SsdTier vs fio, same file system, same run)");
  return 0;
}

}  // namespace strata::bench

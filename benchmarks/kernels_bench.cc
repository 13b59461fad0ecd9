// Measures, in one run, each kernel on V4.1-sized shapes (d_model 256,
// 512-value KV entries, 128-value indexer keys, window 128, 16 experts
// top-2 + shared) and prints its throughput next to a baseline from the
// same run:
//  - memory-bound kernels (formats, block copy): GB/s of bytes read plus
//    bytes written, vs memcpy's read + write traffic on the same machine;
//  - compute-bound kernels (indexer, attention, MoE): GFLOP/s (a multiply
//    and an add count 2), vs a peak estimate: the same 8-lane dot product
//    on L1-resident vectors.
// CPU numbers are single-threaded (the kernels are). With --gpu, the CUDA
// kernels against cudaMemcpy device-to-device bandwidth and the device's
// FP32 peak from its attributes (multiprocessors x lanes x clock x 2).
#include "kernels_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "strata/kernels/attention.h"
#include "strata/kernels/block_copy.h"
#include "strata/kernels/formats.h"
#include "strata/kernels/indexer.h"
#include "strata/kernels/moe.h"
#if STRATA_KERNELS_HAVE_CUDA
#include "strata/kernels/cuda.h"
#endif

namespace strata::bench {
namespace {

namespace k = strata::kernels;

struct Row {
  std::string key;   // JSON key
  std::string name;  // table label
  double value;      // GB/s or GFLOP/s
  bool flops;        // GFLOP/s (else GB/s)
  std::string shape;
};

// Median seconds of `rounds` calls after one warm-up call.
double TimeMedian(int rounds, const std::function<void()>& fn) {
  fn();
  std::vector<double> s;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = NowSeconds();
    fn();
    s.push_back(NowSeconds() - t0);
  }
  return Median(s);
}

std::vector<float> Randn(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> QuantizedRandom(const k::BlockFormat& f, size_t rows, uint64_t seed) {
  std::vector<uint8_t> b(rows * f.Bytes());
  const std::vector<float> x = Randn(rows * f.values, seed);
  k::Quantize(f, x.data(), rows, b.data());
  return b;
}

// The attention benchmark's inputs, shared by the CPU and GPU runs: 4,096
// global entries, a full ring, `tokens` queries near position 5,000 each
// selecting kTopK entries.
struct AttentionInputs {
  std::vector<uint8_t> global, ring;
  std::vector<float> q;
  std::vector<int64_t> pos;
  std::vector<int32_t> idx;
};

AttentionInputs MakeAttentionInputs(uint32_t tokens);

volatile float g_sink;

int Print(const KernelsBenchOptions& o, const std::string& title, const std::string& device,
          double copy_gbps, const std::string& copy_note, double peak_gflops,
          const std::string& peak_note, const std::vector<Row>& rows) {
  if (o.json) {
    JsonObject j;
    j.Add("device", device);
    j.Add("copy_gbps", copy_gbps);
    if (peak_gflops > 0) j.Add("peak_gflops_estimate", peak_gflops);
    for (const Row& r : rows) {
      j.Add(r.key + (r.flops ? "_gflops" : "_gbps"), r.value);
      j.Add(r.key + "_vs_baseline", r.value / (r.flops ? peak_gflops : copy_gbps));
    }
    std::printf("%s\n", j.Dump().c_str());
    return 0;
  }
  Table t;
  t.Add("copy (baseline)", Fixed(copy_gbps, 2) + " GB/s", copy_note);
  if (peak_gflops > 0) t.Add("FP32 peak estimate", Fixed(peak_gflops, 2) + " GFLOP/s", peak_note);
  for (const Row& r : rows) {
    const double base = r.flops && peak_gflops > 0 ? peak_gflops : copy_gbps;
    t.Add(r.name, Fixed(r.value, 2) + (r.flops ? " GFLOP/s" : " GB/s"),
          "x" + Fixed(r.value / base, 2) + " of " +
              (r.flops && peak_gflops > 0 ? "peak est." : "copy") + "; " + r.shape);
  }
  t.Print(title + " (" + device + ")");
  return 0;
}

// Shapes shared by the CPU and GPU runs.
constexpr uint32_t kHeads = 8, kTopK = 512, kWindow = 128, kSlots = 134;
constexpr uint32_t kIdxHeads = 4, kIdxKeys = 32768;
constexpr uint32_t kD = 256, kExperts = 16, kHidden = 512;

AttentionInputs MakeAttentionInputs(uint32_t tokens) {
  AttentionInputs in{QuantizedRandom(k::kMainKv, 4096, 7), QuantizedRandom(k::kSwaFp8, kSlots, 8),
                     Randn(size_t{tokens} * kHeads * k::kHeadDim, 9), std::vector<int64_t>(tokens),
                     std::vector<int32_t>(size_t{tokens} * kTopK)};
  for (uint32_t t = 0; t < tokens; ++t) {
    in.pos[t] = 5000 + t % 7;
    for (uint32_t j = 0; j < kTopK; ++j)
      in.idx[t * kTopK + j] = static_cast<int32_t>(j * 8 + t % 8);
  }
  return in;
}

double AttentionFlops(uint32_t tokens) {
  return static_cast<double>(tokens) * kHeads * (kTopK + kWindow) * k::kHeadDim * 4;  // q.k and p.v
}
double IndexerFlops(uint32_t tokens) {
  return static_cast<double>(tokens) * kIdxKeys * kIdxHeads * k::kIndexerDim * 2;
}
double MoeFlops(uint32_t tokens) {
  return static_cast<double>(tokens) * 3 /* 2 routed + shared */ * 3 * 2.0 * kD * kHidden;
}

int RunCpu(const KernelsBenchOptions& o) {
  std::vector<Row> rows;
  // Baselines.
  const size_t copy_bytes = 64u << 20;
  std::vector<uint8_t> a(copy_bytes, 1), b(copy_bytes, 2);
  const double copy_s = TimeMedian(o.rounds, [&] { std::memcpy(b.data(), a.data(), copy_bytes); });
  const double copy_gbps = 2.0 * copy_bytes / copy_s / 1e9;
  std::vector<float> va = Randn(1024, 1), vb = Randn(1024, 2);
  const int dot_iters = 100000;
  const double dot_s = TimeMedian(o.rounds, [&] {
    float total = 0;
    for (int it = 0; it < dot_iters; ++it) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (size_t i = 0; i < 1024; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += va[i + j] * vb[i + j];
      }
      total += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      asm volatile("" : : "r"(va.data()) : "memory");  // each iteration must really run
    }
    g_sink = total;
  });
  const double peak = 2.0 * 1024 * dot_iters / dot_s / 1e9;

  // Formats.
  for (const auto& named :
       {std::pair{"fp4_main", k::kMainKv}, std::pair{"mxfp8_swa", k::kSwaFp8}}) {
    // Plain copies, not structured bindings: lambdas below capture them.
    const char* name = named.first;
    const auto fmt = named.second;
    const size_t n = 8192;
    const std::vector<float> x = Randn(n * fmt.values, 3);
    std::vector<uint8_t> q(n * fmt.Bytes());
    std::vector<float> y(x.size());
    const double bytes = n * (fmt.values * 4.0 + fmt.Bytes());
    const std::string shape =
        std::to_string(n) + " entries of " + std::to_string(fmt.Bytes()) + " B";
    rows.push_back(
        {std::string("quantize_") + name, std::string("quantize ") + name,
         bytes / TimeMedian(o.rounds, [&] { k::Quantize(fmt, x.data(), n, q.data()); }) / 1e9,
         false, shape});
    rows.push_back(
        {std::string("dequantize_") + name, std::string("dequantize ") + name,
         bytes / TimeMedian(o.rounds, [&] { k::Dequantize(fmt, q.data(), n, y.data()); }) / 1e9,
         false, shape});
  }

  // Indexer: scores, and the Full-layer selection.
  {
    const uint32_t tokens = 4;
    const std::vector<uint8_t> keys = QuantizedRandom(k::kIndexerKey, kIdxKeys, 4);
    const std::vector<float> q = Randn(tokens * kIdxHeads * k::kIndexerDim, 5),
                             w = Randn(tokens * kIdxHeads, 6);
    const std::vector<uint64_t> visible(tokens, kIdxKeys);
    const std::vector<k::IndexerKeys> seqs = {{keys.data(), kIdxKeys}};
    const k::IndexerArgs args{tokens, kIdxHeads, q.data(), w.data(), nullptr, visible.data(), seqs};
    std::vector<float> scores(size_t{tokens} * kIdxKeys);
    const std::string shape = std::to_string(tokens) + " tokens x " + std::to_string(kIdxKeys) +
                              " keys x " + std::to_string(kIdxHeads) + " heads";
    rows.push_back(
        {"indexer_scores", "indexer scores",
         IndexerFlops(tokens) /
             TimeMedian(o.rounds, [&] { k::IndexerScores(args, scores.data(), kIdxKeys); }) / 1e9,
         true, shape});
    const k::IndexerConfig cfg;
    std::vector<int32_t> cand(tokens * cfg.candidate_blocks), top(tokens * cfg.topk);
    rows.push_back(
        {"indexer_select_full", "indexer Full select",
         IndexerFlops(tokens) /
             TimeMedian(o.rounds,
                        [&] { k::IndexerSelectFull(args, cfg, cand.data(), top.data()); }) /
             1e9,
         true, shape + ", pool 256 blocks, top-512 (scoring FLOPs)"});
  }

  // Attention: top-512 global + window 128, 8 heads.
  {
    const uint32_t tokens = 16;
    const AttentionInputs in = MakeAttentionInputs(tokens);
    const std::vector<uint8_t>&global = in.global, &ring = in.ring;
    const std::vector<float>& q = in.q;
    const std::vector<int64_t>& pos = in.pos;
    const std::vector<int32_t>& idx = in.idx;
    const std::vector<k::SequenceKv> kv = {{global.data(), 4096, ring.data(), kSlots, 0}};
    std::vector<float> out(q.size()), lse(tokens * kHeads);
    const k::AttentionArgs args{tokens,  kHeads,     kTopK,      kWindow, 0.044f,     q.data(),
                                nullptr, pos.data(), idx.data(), kv,      out.data(), lse.data()};
    rows.push_back(
        {"attention", "sparse + SWA attention",
         AttentionFlops(tokens) / TimeMedian(o.rounds, [&] { k::SparseSwaAttention(args); }) / 1e9,
         true, std::to_string(tokens) + " tokens x 8 heads, top-512 FP4 + 128 MXFP8 keys"});
  }

  // MoE: route + grouped experts + shared + combine.
  {
    const uint32_t tokens = 64;
    std::vector<std::vector<float>> mats;
    std::vector<k::ExpertWeights> experts;
    for (uint32_t e = 0; e <= kExperts; ++e) {
      for (int m = 0; m < 3; ++m)
        mats.push_back(Randn(size_t{kD} * kHidden, 10 + 3 * e + m, 0.05f));
    }
    for (uint32_t e = 0; e <= kExperts; ++e)
      experts.push_back(
          {mats[3 * e].data(), mats[3 * e + 1].data(), mats[3 * e + 2].data(), kHidden});
    const std::vector<float> x = Randn(size_t{tokens} * kD, 11),
                             wr = Randn(kExperts * kD, 12, 0.05f);
    std::vector<int32_t> ids(tokens * 2);
    std::vector<float> gates(tokens * 2), out(size_t{tokens} * kD);
    const double s = TimeMedian(o.rounds, [&] {
      k::Route({kExperts, 2, k::RouterScore::kSoftmax, true, 1.0f}, x.data(), tokens, kD, wr.data(),
               nullptr, ids.data(), gates.data());
      k::MoeForward({tokens,
                     kD,
                     2,
                     x.data(),
                     ids.data(),
                     gates.data(),
                     {experts.data(), kExperts},
                     &experts[kExperts],
                     out.data()});
    });
    rows.push_back(
        {"moe", "MoE (route + experts + shared)", MoeFlops(tokens) / s / 1e9, true,
         std::to_string(tokens) + " tokens, d 256, hidden 512, 16 experts top-2 + shared"});
  }

  // Block copy: 256 global-KV blocks of the V4.1 layout, gather then scatter.
  {
    const std::vector<uint64_t> page_bytes = {256 * 356, 128 * 356, 256 * 356};
    const uint32_t blocks = 256, header = 128;
    const uint64_t stride = header + 227840;
    std::vector<std::vector<uint8_t>> pool;
    std::vector<uint8_t*> base;
    for (uint64_t pb : page_bytes) {
      pool.emplace_back(blocks * pb, 3);
      base.push_back(pool.back().data());
    }
    std::vector<uint32_t> pages(blocks);
    for (uint32_t i = 0; i < blocks; ++i) pages[i] = (i * 37) % blocks;
    std::vector<uint8_t> payload(blocks * stride, 0);
    const k::PagedPool p{base, page_bytes};
    const k::PayloadBuffers buf{payload.data(), stride, header};
    const double bytes = 2.0 * blocks * 227840;
    rows.push_back({"block_gather", "block gather (pool -> payload)",
                    bytes / TimeMedian(o.rounds, [&] { k::GatherBlocks(p, pages, buf); }) / 1e9,
                    false, "256 blocks x 227,840 B, 3 layer groups"});
    rows.push_back({"block_scatter", "block scatter (payload -> pool)",
                    bytes / TimeMedian(o.rounds, [&] { k::ScatterBlocks(buf, pages, p); }) / 1e9,
                    false, "256 blocks x 227,840 B, 3 layer groups"});
  }
  return Print(o, "strata-bench kernels: CPU kernels, one thread", "cpu", copy_gbps,
               "memcpy of 64 MiB, read + write traffic", peak,
               "8-lane dot in L1, 1,024 floats, cache-resident", rows);
}

#if STRATA_KERNELS_HAVE_CUDA
template <typename T>
using Dev = k::cuda::DeviceArray<T>;

int RunGpu(const KernelsBenchOptions& o) {
  std::string why;
  if (!k::cuda::DeviceAvailable(&why)) {
    std::fprintf(stderr, "strata-bench kernels --gpu: no CUDA device: %s\n", why.c_str());
    return 1;
  }
  const int iters = std::max(o.rounds, 20);
  std::vector<Row> rows;
  const size_t copy_bytes = 512u << 20;
  Dev<uint8_t> ca(copy_bytes), cb(copy_bytes);
  const double copy_ms =
      k::cuda::TimeMs([&] { k::cuda::CopyOnDevice(cb.get(), ca.get(), copy_bytes); }, iters);
  const double copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;

  for (const auto& named :
       {std::pair{"fp4_main", k::kMainKv}, std::pair{"mxfp8_swa", k::kSwaFp8}}) {
    // Plain copies, not structured bindings: lambdas below capture them.
    const char* name = named.first;
    const auto fmt = named.second;
    const size_t n = 1 << 17;
    const std::vector<float> x = Randn(n * fmt.values, 3);
    Dev<float> dx(x.data(), x.size()), dy(x.size());
    Dev<uint8_t> dq(n * fmt.Bytes());
    const double bytes = n * (fmt.values * 4.0 + fmt.Bytes());
    const std::string shape = std::to_string(n) + " entries";
    const double qms =
        k::cuda::TimeMs([&] { k::cuda::Quantize(fmt, dx.get(), n, dq.get()); }, iters);
    const double dms =
        k::cuda::TimeMs([&] { k::cuda::Dequantize(fmt, dq.get(), n, dy.get()); }, iters);
    rows.push_back({std::string("quantize_") + name, std::string("quantize ") + name,
                    bytes / qms / 1e6, false, shape});
    rows.push_back({std::string("dequantize_") + name, std::string("dequantize ") + name,
                    bytes / dms / 1e6, false, shape});
  }
  {
    const uint32_t tokens = 64;
    const std::vector<uint8_t> keys = QuantizedRandom(k::kIndexerKey, kIdxKeys, 4);
    const std::vector<float> q = Randn(tokens * kIdxHeads * k::kIndexerDim, 5),
                             w = Randn(tokens * kIdxHeads, 6);
    const std::vector<uint64_t> visible(tokens, kIdxKeys);
    Dev<uint8_t> dkeys(keys.data(), keys.size());
    const k::IndexerKeys seq{dkeys.get(), kIdxKeys};
    Dev<k::IndexerKeys> dseq(&seq, 1);
    Dev<float> dq(q.data(), q.size()), dw(w.data(), w.size()), dscores(size_t{tokens} * kIdxKeys);
    Dev<uint64_t> dvis(visible.data(), visible.size());
    Dev<int32_t> dtop(tokens * 512);
    const k::IndexerArgs args{tokens,  kIdxHeads,  dq.get(),       dw.get(),
                              nullptr, dvis.get(), {dseq.get(), 1}};
    const double ms =
        k::cuda::TimeMs([&] { k::cuda::IndexerScores(args, dscores.get(), kIdxKeys); }, iters);
    rows.push_back({"indexer_scores", "indexer scores", IndexerFlops(tokens) / ms / 1e6, true,
                    std::to_string(tokens) + " tokens x 32768 keys x 4 heads"});
    const double tms = k::cuda::TimeMs(
        [&] {
          k::cuda::TopKRows(dscores.get(), tokens, kIdxKeys, nullptr, kIdxKeys, 512, dtop.get());
        },
        iters);
    const k::IndexerConfig cfg;
    Dev<uint8_t> scratch(k::cuda::IndexerScratchBytes(tokens, kIdxKeys, cfg));
    Dev<int32_t> dcand(tokens * cfg.candidate_blocks);
    const double fms = k::cuda::TimeMs(
        [&] {
          k::cuda::IndexerSelectFull(args, cfg, kIdxKeys, dcand.get(), dtop.get(), scratch.get());
        },
        iters);
    rows.push_back({"indexer_select_full", "indexer Full select", IndexerFlops(tokens) / fms / 1e6,
                    true, "pool 256 blocks, top-512 (scoring FLOPs)"});
    rows.push_back({"topk_rows", "top-512 of 32768 (exact)",
                    static_cast<double>(tokens) * kIdxKeys * 4 / tms / 1e6, false,
                    std::to_string(tokens) + " rows; GB/s of one pass over the scores"});
  }
  {
    const uint32_t tokens = 512;
    const AttentionInputs in = MakeAttentionInputs(tokens);
    const std::vector<uint8_t>&global = in.global, &ring = in.ring;
    const std::vector<float>& q = in.q;
    const std::vector<int64_t>& pos = in.pos;
    const std::vector<int32_t>& idx = in.idx;
    Dev<uint8_t> dg(global.data(), global.size()), dr(ring.data(), ring.size());
    const k::SequenceKv kv{dg.get(), 4096, dr.get(), kSlots, 0};
    Dev<k::SequenceKv> dkv(&kv, 1);
    Dev<float> dq(q.data(), q.size()), dout(q.size());
    Dev<int64_t> dpos(pos.data(), pos.size());
    Dev<int32_t> didx(idx.data(), idx.size());
    const k::AttentionArgs args{tokens,     kHeads,         kTopK,      kWindow,
                                0.044f,     dq.get(),       nullptr,    dpos.get(),
                                didx.get(), {dkv.get(), 1}, dout.get(), nullptr};
    const double ms = k::cuda::TimeMs([&] { k::cuda::SparseSwaAttention(args); }, iters);
    rows.push_back({"attention", "sparse + SWA attention", AttentionFlops(tokens) / ms / 1e6, true,
                    std::to_string(tokens) + " tokens x 8 heads, top-512 + 128 keys"});
  }
  {
    const uint32_t tokens = 512;
    std::vector<std::unique_ptr<Dev<float>>> mats;
    std::vector<k::ExpertWeights> experts;
    for (uint32_t e = 0; e <= kExperts; ++e) {
      for (int m = 0; m < 3; ++m) {
        const std::vector<float> h = Randn(size_t{kD} * kHidden, 10 + 3 * e + m, 0.05f);
        mats.push_back(std::make_unique<Dev<float>>(h.data(), h.size()));
      }
      experts.push_back(
          {mats[3 * e]->get(), mats[3 * e + 1]->get(), mats[3 * e + 2]->get(), kHidden});
    }
    Dev<k::ExpertWeights> dexperts(experts.data(), experts.size());
    const std::vector<float> x = Randn(size_t{tokens} * kD, 11),
                             wr = Randn(kExperts * kD, 12, 0.05f);
    Dev<float> dx(x.data(), x.size()), dwr(wr.data(), wr.size()), dgates(tokens * 2),
        dout(x.size());
    Dev<int32_t> dids(tokens * 2);
    const k::MoeArgs args{tokens,
                          kD,
                          2,
                          dx.get(),
                          dids.get(),
                          dgates.get(),
                          {dexperts.get(), kExperts},
                          dexperts.get() + kExperts,
                          dout.get()};
    Dev<uint8_t> scratch(k::cuda::MoeScratchBytes(args));
    const double ms = k::cuda::TimeMs(
        [&] {
          k::cuda::Route({kExperts, 2, k::RouterScore::kSoftmax, true, 1.0f}, dx.get(), tokens, kD,
                         dwr.get(), nullptr, dids.get(), dgates.get());
          k::cuda::MoeForward(args, kHidden, scratch.get());
        },
        iters);
    rows.push_back({"moe", "MoE (route + experts + shared)", MoeFlops(tokens) / ms / 1e6, true,
                    std::to_string(tokens) + " tokens, d 256, hidden 512"});
  }
  {
    const std::vector<uint64_t> page_bytes = {256 * 356, 128 * 356, 256 * 356};
    const uint32_t blocks = 512, header = 128;
    const uint64_t stride = header + 227840;
    std::vector<std::unique_ptr<Dev<uint8_t>>> pool;
    std::vector<uint8_t*> base;
    for (uint64_t pb : page_bytes) {
      pool.push_back(std::make_unique<Dev<uint8_t>>(blocks * pb));
      base.push_back(pool.back()->get());
    }
    std::vector<uint32_t> pages(blocks);
    for (uint32_t i = 0; i < blocks; ++i) pages[i] = (i * 37) % blocks;
    Dev<uint32_t> dpages(pages.data(), pages.size());
    Dev<uint8_t> payload(blocks * stride);
    const k::PagedPool p{base, page_bytes};
    const k::PayloadBuffers buf{payload.get(), stride, header};
    const double ms =
        k::cuda::TimeMs([&] { k::cuda::GatherBlocks(p, dpages.get(), blocks, buf); }, iters);
    rows.push_back({"block_gather", "block gather (pool -> payload)",
                    2.0 * blocks * 227840 / ms / 1e6, false, "512 blocks x 227,840 B"});
  }
  return Print(o, "strata-bench kernels --gpu: CUDA kernels", k::cuda::DeviceName(), copy_gbps,
               "cudaMemcpy device-to-device of 512 MiB, read + write traffic",
               k::cuda::PeakFp32Gflops(), "multiprocessors x FP32 lanes x boost clock x 2", rows);
}
#endif

}  // namespace

int RunKernelsBench(const KernelsBenchOptions& o) {
  if (o.rounds < 1 || o.rounds > 1000) {
    std::fprintf(stderr, "strata-bench kernels: --rounds must be in 1..1000\n");
    return 2;
  }
  if (o.gpu) {
#if STRATA_KERNELS_HAVE_CUDA
    return RunGpu(o);
#else
    std::fprintf(stderr, "strata-bench kernels --gpu: the CUDA kernels were not built\n");
    return 1;
#endif
  }
  return RunCpu(o);
}

}  // namespace strata::bench

// CUDA-vs-CPU checks, shared by the GoogleTest suite (cuda_test.cc) and the
// standalone GPU runner (benchmarks/gpu/gpu_main.cc, which needs no
// GoogleTest on a bare GPU machine). Each check returns "" on success or a
// description of the first mismatch. Needs a CUDA build and a device.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "strata/kernels/attention.h"
#include "strata/kernels/block_copy.h"
#include "strata/kernels/cuda.h"
#include "strata/kernels/formats.h"
#include "strata/kernels/indexer.h"
#include "strata/kernels/moe.h"

namespace strata::kernels::cuda_checks {

using cuda::DeviceArray;
using testing::RandomFloats;
using testing::RandomQuantized;

template <typename T>
std::vector<T> ToHost(const DeviceArray<T>& d) {
  std::vector<T> h(d.size());
  d.ToHost(h.data());
  return h;
}

// "" when |got - want| <= rel * (1 + |want|) everywhere (and infinities match).
inline std::string Near(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, double rel) {
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = std::isinf(want[i]) ? got[i] == want[i]
                                        : std::fabs(double{got[i]} - want[i]) <=
                                              rel * (1 + std::fabs(double{want[i]}));
    if (!ok) {
      std::ostringstream s;
      s << what << "[" << i << "]: CUDA " << got[i] << " vs CPU " << want[i];
      return s.str();
    }
  }
  return "";
}

inline std::string Same(const std::string& what, const void* got, const void* want, size_t bytes) {
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  for (size_t i = 0; i < bytes; ++i) {
    if (g[i] != w[i]) {
      return what + ": CUDA and CPU bytes differ, first at byte " + std::to_string(i) + " of " +
             std::to_string(bytes) + " (" + std::to_string(g[i]) + " vs " + std::to_string(w[i]) +
             ")";
    }
  }
  return "";
}

// Quantize and dequantize, all three formats, with Inf and NaN: bit-exact.
// The two 24-value formats (groups of 6) take the CUDA kernels' generic path.
inline std::string CheckFormats() {
  for (const BlockFormat& fmt : {kMainKv, kIndexerKey, kSwaFp8, BlockFormat{Element::kE2m1, 24, 6},
                                 BlockFormat{Element::kE4m3, 24, 6}}) {
    const size_t rows = 33;
    std::vector<float> x = RandomFloats(rows * fmt.values, 100 + fmt.values);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::ldexp(x[i], static_cast<int>(i / fmt.group % 60) - 30);
    }
    x[5] = std::numeric_limits<float>::infinity();
    x[fmt.values + 3] = std::numeric_limits<float>::quiet_NaN();
    x[2 * fmt.values + 6] = -std::numeric_limits<float>::quiet_NaN();
    std::vector<uint8_t> cpu(rows * fmt.Bytes());
    Quantize(fmt, x.data(), rows, cpu.data());
    DeviceArray<float> dx(x.data(), x.size());
    DeviceArray<uint8_t> dq(cpu.size());
    cuda::Quantize(fmt, dx.get(), rows, dq.get());
    const std::vector<uint8_t> gpu = ToHost(dq);
    const std::string name = std::to_string(fmt.values) + "/" + std::to_string(fmt.group);
    if (auto e = Same("quantize " + name, gpu.data(), cpu.data(), cpu.size()); !e.empty()) {
      return e;
    }
    std::vector<float> back(x.size());
    Dequantize(fmt, cpu.data(), rows, back.data());
    DeviceArray<float> dback(x.size());
    cuda::Dequantize(fmt, dq.get(), rows, dback.get());
    const std::vector<float> gpu_back = ToHost(dback);
    if (auto e = Same("dequantize " + name, gpu_back.data(), back.data(), back.size() * 4);
        !e.empty()) {
      return e;
    }
  }
  return "";
}

// Attention under bounded replay vs the CPU (float tolerance), and the CUDA
// kernel's own batch invariance (bit-exact).
inline std::string CheckAttention() {
  constexpr uint32_t kHeads = 4, kTopK = 32, kWindow = 128, kSlots = 134, kTokens = 4;
  const auto global = RandomQuantized(kMainKv, 500, 1);
  const auto ring = RandomQuantized(kSwaFp8, kSlots, 2);
  const std::vector<float> q = RandomFloats(kTokens * kHeads * kHeadDim, 3);
  std::vector<int64_t> pos;
  std::vector<int32_t> topk;
  std::mt19937_64 rng(testing::TestSeed());
  for (uint32_t t = 0; t < kTokens; ++t) {
    pos.push_back(1003 + t);  // replay starts at 1003
    for (uint32_t j = 0; j < kTopK; ++j) {
      topk.push_back(j % 5 == 4 ? -1 : static_cast<int32_t>(j * 15 + rng() % 15));
    }
  }
  std::vector<float> cpu_out(kTokens * kHeads * kHeadDim), cpu_lse(kTokens * kHeads);
  const std::vector<SequenceKv> kv = {{global.bytes.data(), 500, ring.bytes.data(), kSlots, 1003}};
  const AttentionArgs a{kTokens, kHeads,     kTopK,       kWindow, 0.05f,          q.data(),
                        nullptr, pos.data(), topk.data(), kv,      cpu_out.data(), cpu_lse.data()};
  SparseSwaAttention(a);

  DeviceArray<uint8_t> dg(global.bytes.data(), global.bytes.size());
  DeviceArray<uint8_t> dr(ring.bytes.data(), ring.bytes.size());
  const SequenceKv dkv_host{dg.get(), 500, dr.get(), kSlots, 1003};
  DeviceArray<SequenceKv> dkv(&dkv_host, 1);
  DeviceArray<float> dq(q.data(), q.size()), dout(cpu_out.size()), dlse(cpu_lse.size());
  DeviceArray<int64_t> dpos(pos.data(), pos.size());
  DeviceArray<int32_t> dtopk(topk.data(), topk.size());
  AttentionArgs d = a;
  d.q = dq.get();
  d.positions = dpos.get();
  d.topk_idx = dtopk.get();
  d.seqs = {dkv.get(), 1};
  d.out = dout.get();
  d.lse = dlse.get();
  cuda::SparseSwaAttention(d);
  const std::vector<float> out = ToHost(dout), lse = ToHost(dlse);
  if (auto e = Near("attention out", out, cpu_out, 1e-4); !e.empty()) return e;
  if (auto e = Near("attention lse", lse, cpu_lse, 1e-4); !e.empty()) return e;

  DeviceArray<float> dout1(out.size());
  for (uint32_t t = 0; t < kTokens; ++t) {  // one token at a time: the same bits
    AttentionArgs one = d;
    one.tokens = 1;
    one.q += t * kHeads * kHeadDim;
    one.positions += t;
    one.topk_idx += t * kTopK;
    one.out = dout1.get() + t * kHeads * kHeadDim;
    one.lse = nullptr;
    cuda::SparseSwaAttention(one);
  }
  const std::vector<float> out1 = ToHost(dout1);
  return Same("attention batch vs single token", out1.data(), out.data(), out.size() * 4);
}

// Indexer scores (tolerance), then pooling and top-k on those scores
// (bit-exact, with many ties).
inline std::string CheckIndexer() {
  constexpr uint32_t kTokens = 5, kHeads = 4, kN = 3000, kK = 100;
  const auto keys = RandomQuantized(kIndexerKey, kN, 10);
  const std::vector<float> q = RandomFloats(kTokens * kHeads * kIndexerDim, 11);
  const std::vector<float> w = RandomFloats(kTokens * kHeads, 12);
  const std::vector<uint64_t> visible = {3000, 2999, 1234, 80, 7};
  const std::vector<IndexerKeys> seqs = {{keys.bytes.data(), kN}};
  const IndexerArgs a{kTokens, kHeads, q.data(), w.data(), nullptr, visible.data(), seqs};
  std::vector<float> cpu(kTokens * kN);
  IndexerScores(a, cpu.data(), kN);

  DeviceArray<uint8_t> dkeys(keys.bytes.data(), keys.bytes.size());
  const IndexerKeys dseq_host{dkeys.get(), kN};
  DeviceArray<IndexerKeys> dseq(&dseq_host, 1);
  DeviceArray<float> dq(q.data(), q.size()), dw(w.data(), w.size()), dscores(cpu.size());
  DeviceArray<uint64_t> dvis(visible.data(), visible.size());
  IndexerArgs d = a;
  d.q = dq.get();
  d.weights = dw.get();
  d.visible = dvis.get();
  d.seqs = {dseq.get(), 1};
  cuda::IndexerScores(d, dscores.get(), kN);
  std::vector<float> gpu = ToHost(dscores);
  if (auto e = Near("indexer scores", gpu, cpu, 1e-4); !e.empty()) return e;

  for (float& s : gpu) s = std::isinf(s) ? s : std::round(s);  // force ties
  DeviceArray<float> drounded(gpu.data(), gpu.size());
  const uint64_t nb = (kN + 7) / 8;
  DeviceArray<float> dpooled(kTokens * nb);
  cuda::BlockMaxPool(drounded.get(), kTokens, kN, kN, 8, dpooled.get(), nb);
  const std::vector<float> pooled = ToHost(dpooled);
  DeviceArray<int32_t> dtop(kTokens * kK);
  cuda::TopKRows(drounded.get(), kTokens, kN, dvis.get(), kN, kK, dtop.get());
  const std::vector<int32_t> top = ToHost(dtop);
  for (uint32_t t = 0; t < kTokens; ++t) {
    std::vector<float> want_pool(nb);
    BlockMaxPool(&gpu[t * kN], kN, 8, want_pool.data());
    if (auto e = Same("block-max pool", want_pool.data(), &pooled[t * nb], nb * 4); !e.empty()) {
      return e;
    }
    std::vector<int32_t> want(kK);
    TopK(&gpu[t * kN], visible[t], kK, want.data());
    if (auto e = Same("top-k", want.data(), &top[t * kK], kK * 4); !e.empty()) return e;
  }
  return "";
}

// The pool and top-k of the spec from given scores (the CPU reference of
// IndexerSelectFull / IndexerReindex, fed with the device's own scores).
inline std::vector<int32_t> PoolTopK(const float* row, uint64_t vis, const int32_t* cand,
                                     const IndexerConfig& cfg) {
  std::vector<int32_t> pool;
  std::vector<float> pool_scores;
  for (uint32_t c = 0; c < cfg.candidate_blocks && cand[c] >= 0; ++c) {
    for (uint64_t j = uint64_t(cand[c]) * cfg.block; j < (uint64_t(cand[c]) + 1) * cfg.block; ++j) {
      if (j < vis) pool.push_back(static_cast<int32_t>(j)), pool_scores.push_back(row[j]);
    }
  }
  std::vector<int32_t> top(cfg.topk);
  const uint32_t kept = TopK(pool_scores.data(), pool.size(), cfg.topk, top.data());
  for (uint32_t j = 0; j < kept; ++j) top[j] = pool[top[j]];
  return top;
}

// Full, Reindex and Reuse selection on the device against the CPU pipeline run on
// the device's scores: candidate blocks and top-k bit-exact.
inline std::string CheckIndexerSelect() {
  constexpr uint32_t kTokens = 6, kHeads = 4, kN = 5000;
  const IndexerConfig cfg{8, 32, 100};
  const auto keys = RandomQuantized(kIndexerKey, kN, 40);
  const std::vector<uint64_t> visible = {5000, 4999, 3333, 801, 64, 9};
  DeviceArray<uint8_t> dkeys(keys.bytes.data(), keys.bytes.size());
  const IndexerKeys dseq_host{dkeys.get(), kN};
  DeviceArray<IndexerKeys> dseq(&dseq_host, 1);
  DeviceArray<uint64_t> dvis(visible.data(), visible.size());
  DeviceArray<uint8_t> scratch(cuda::IndexerScratchBytes(kTokens, kN, cfg));
  DeviceArray<int32_t> dcand(kTokens * cfg.candidate_blocks), dtop(kTokens * cfg.topk);
  std::vector<int32_t> cand;
  for (int layer = 0; layer < 2; ++layer) {  // 0: Full, 1: Reindex on layer 0's pool
    const std::vector<float> q = RandomFloats(kTokens * kHeads * kIndexerDim, 41 + 2 * layer);
    const std::vector<float> w = RandomFloats(kTokens * kHeads, 42 + 2 * layer);
    DeviceArray<float> dq(q.data(), q.size()), dw(w.data(), w.size()), dscores(kTokens * kN);
    const IndexerArgs d{kTokens, kHeads, dq.get(), dw.get(), nullptr, dvis.get(), {dseq.get(), 1}};
    cuda::IndexerScores(d, dscores.get(), kN);
    const std::vector<float> scores = ToHost(dscores);
    if (layer == 0) {
      cuda::IndexerSelectFull(d, cfg, kN, dcand.get(), dtop.get(), scratch.get());
      cand = ToHost(dcand);
    } else {
      // Reindex into a scratch array, then Reuse copies it into dtop.
      DeviceArray<int32_t> re(kTokens * cfg.topk);
      cuda::IndexerReindex(d, cfg, dcand.get(), re.get(), scratch.get());
      cuda::IndexerReuse(re.get(), kTokens, cfg.topk, dtop.get());
    }
    const std::vector<int32_t> top = ToHost(dtop);
    for (uint32_t t = 0; t < kTokens; ++t) {
      const float* row = &scores[t * kN];
      const int32_t* c = &cand[t * cfg.candidate_blocks];
      if (layer == 0) {
        std::vector<float> pooled((visible[t] + 7) / 8);
        BlockMaxPool(row, visible[t], 8, pooled.data());
        std::vector<int32_t> want(cfg.candidate_blocks);
        TopK(pooled.data(), pooled.size(), cfg.candidate_blocks, want.data());
        if (auto e = Same("Full candidates", c, want.data(), want.size() * 4); !e.empty()) return e;
      }
      const std::vector<int32_t> want = PoolTopK(row, visible[t], c, cfg);
      const char* what = layer == 0 ? "Full top-k" : "Reindex top-k";
      if (auto e = Same(what, &top[t * cfg.topk], want.data(), want.size() * 4); !e.empty())
        return e;
    }
  }
  return "";
}

// Router (ids exact, gates within tolerance) and the MoE FFN on the CPU's
// routing (tolerance).
inline std::string CheckMoe() {
  constexpr uint32_t kD = 256, kE = 16, kH = 128, kT = 9, kK = 2;
  const std::vector<float> x = RandomFloats(kT * kD, 20), wr = RandomFloats(kE * kD, 21, 0.06f);
  std::vector<std::vector<float>> mats;
  for (uint32_t i = 0; i < 3 * (kE + 1); ++i) mats.push_back(RandomFloats(kH * kD, 30 + i, 0.06f));
  std::vector<ExpertWeights> host, dev;
  std::vector<std::unique_ptr<DeviceArray<float>>> dmats;
  dmats.reserve(mats.size());
  for (const auto& m : mats)
    dmats.push_back(std::make_unique<DeviceArray<float>>(m.data(), m.size()));
  for (uint32_t e = 0; e <= kE; ++e) {
    host.push_back({mats[3 * e].data(), mats[3 * e + 1].data(), mats[3 * e + 2].data(), kH});
    dev.push_back({dmats[3 * e]->get(), dmats[3 * e + 1]->get(), dmats[3 * e + 2]->get(), kH});
  }
  const RouterConfig cfg{kE, kK, RouterScore::kSoftmax, true, 1.0f};
  std::vector<int32_t> ids(kT * kK);
  std::vector<float> gates(kT * kK), out(kT * kD);
  Route(cfg, x.data(), kT, kD, wr.data(), nullptr, ids.data(), gates.data());
  MoeForward(
      {kT, kD, kK, x.data(), ids.data(), gates.data(), {host.data(), kE}, &host[kE], out.data()});

  DeviceArray<float> dx(x.data(), x.size()), dwr(wr.data(), wr.size());
  DeviceArray<float> dgates(gates.size()), dout(out.size());
  DeviceArray<int32_t> dids(ids.size());
  DeviceArray<ExpertWeights> dexperts(dev.data(), dev.size());
  cuda::Route(cfg, dx.get(), kT, kD, dwr.get(), nullptr, dids.get(), dgates.get());
  const std::vector<int32_t> gpu_ids = ToHost(dids);
  if (auto e = Same("router ids", gpu_ids.data(), ids.data(), ids.size() * 4); !e.empty()) return e;
  if (auto e = Near("router gates", ToHost(dgates), gates, 1e-5); !e.empty()) return e;
  DeviceArray<int32_t> cpu_ids(ids.data(), ids.size());
  DeviceArray<float> cpu_gates(gates.data(), gates.size());
  const MoeArgs d{kT,
                  kD,
                  kK,
                  dx.get(),
                  cpu_ids.get(),
                  cpu_gates.get(),
                  {dexperts.get(), kE},
                  dexperts.get() + kE,
                  dout.get()};
  DeviceArray<uint8_t> scratch(cuda::MoeScratchBytes(d));
  cuda::MoeForward(d, kH, scratch.get());
  return Near("moe out", ToHost(dout), out, 1e-4);
}

// Gather and scatter of V4.1-sized groups plus an odd-sized one: bit-exact.
inline std::string CheckBlockCopy() {
  const std::vector<uint64_t> page_bytes = {256 * 356, 128 * 356, 100};  // 100: no 16-byte words
  const uint32_t pages = 6;
  std::vector<std::vector<uint8_t>> host_pages;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dev_pages;
  std::vector<uint8_t*> host_base, dev_base;
  std::mt19937_64 rng(testing::TestSeed());
  for (uint64_t b : page_bytes) {
    host_pages.emplace_back(pages * b);
    for (uint8_t& v : host_pages.back()) v = static_cast<uint8_t>(rng());
    dev_pages.push_back(
        std::make_unique<DeviceArray<uint8_t>>(host_pages.back().data(), pages * b));
    host_base.push_back(host_pages.back().data());
    dev_base.push_back(dev_pages.back()->get());
  }
  const std::vector<uint32_t> blocks = {4, 1, 5};
  const uint64_t stride = 64 + 256 * 356 + 128 * 356 + 100 + 12;
  std::vector<uint8_t> cpu(blocks.size() * stride, 0);
  GatherBlocks({host_base, page_bytes}, blocks, {cpu.data(), stride, 64});
  DeviceArray<uint32_t> dblocks(blocks.data(), blocks.size());
  const std::vector<uint8_t> zeros(cpu.size(), 0);
  DeviceArray<uint8_t> dpay(zeros.data(), zeros.size());
  cuda::GatherBlocks({dev_base, page_bytes}, dblocks.get(), 3, {dpay.get(), stride, 64});
  const std::vector<uint8_t> gpu = ToHost(dpay);
  if (auto e = Same("gather", gpu.data(), cpu.data(), cpu.size()); !e.empty()) return e;
  for (auto& d : dev_pages) {
    const std::vector<uint8_t> z(d->size(), 0);
    cuda::CopyToDevice(d->get(), z.data(), z.size());
  }
  cuda::ScatterBlocks({dpay.get(), stride, 64}, dblocks.get(), 3, {dev_base, page_bytes});
  for (size_t g = 0; g < page_bytes.size(); ++g) {
    const std::vector<uint8_t> back = ToHost(*dev_pages[g]);
    for (uint32_t b : blocks) {
      const size_t off = b * page_bytes[g];
      if (auto e = Same("scatter", &back[off], &host_pages[g][off], page_bytes[g]); !e.empty()) {
        return e;
      }
    }
  }
  return "";
}

struct NamedCheck {
  const char* name;
  std::string (*run)();
};
inline const NamedCheck kChecks[] = {
    {"formats", CheckFormats}, {"attention", CheckAttention},
    {"indexer", CheckIndexer}, {"indexer_select", CheckIndexerSelect},
    {"moe", CheckMoe},         {"block_copy", CheckBlockCopy}};

}  // namespace strata::kernels::cuda_checks

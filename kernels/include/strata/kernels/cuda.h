// CUDA implementations of the kernels (built when nvcc is present; link
// strata::kernels_cuda). Same arguments and semantics as the CPU versions
// in the sibling headers, which are the reference; the CPU and CUDA results
// agree bit for bit for quantization, top-k and block copy, and to float
// rounding elsewhere (the device's expf/logf differ from the host's in the
// last bits). Each CUDA kernel is itself deterministic and batch-invariant:
// one row per thread block, a fixed reduction order, no atomics.
//
// Every pointer handed to these functions is a device pointer, including
// the arrays behind spans (AttentionArgs::seqs, IndexerArgs::seqs, the page
// and base arrays). Calls are asynchronous on `stream` (null: the default
// stream). This header needs no CUDA headers, so plain C++ can include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "strata/kernels/attention.h"
#include "strata/kernels/block_copy.h"
#include "strata/kernels/formats.h"
#include "strata/kernels/indexer.h"
#include "strata/kernels/moe.h"

struct CUstream_st;

namespace strata::kernels::cuda {

using Stream = CUstream_st*;

// True when a CUDA device can be used; otherwise `why` says why not.
bool DeviceAvailable(std::string* why);
std::string DeviceName();
// FP32 FMA peak of device 0 from its attributes (multiprocessors x lanes x
// boost clock x 2): the benchmarks' ceiling for arithmetic-bound kernels.
double PeakFp32Gflops();

// Plumbing for tests and benchmarks. CUDA errors abort with a message: a
// failed allocation or copy here is an environment problem, not a result.
void* Malloc(size_t bytes);
void Free(void* p);
void CopyToDevice(void* dst, const void* src, size_t bytes);
void CopyToHost(void* dst, const void* src, size_t bytes);
void CopyOnDevice(void* dst, const void* src, size_t bytes);
void Synchronize();
// Mean milliseconds per call of `fn` over `iters` calls after one warm-up,
// timed with CUDA events on the default stream.
double TimeLaunchesMs(void (*launch)(void*), void* ctx, int iters);
template <typename Fn>
double TimeMs(Fn&& fn, int iters) {
  using F = std::remove_reference_t<Fn>;
  return TimeLaunchesMs([](void* c) { (*static_cast<F*>(c))(); },
                        const_cast<void*>(static_cast<const void*>(&fn)), iters);
}

// A device array of T owning its memory (one spare byte, so that an empty
// array still gets a valid allocation).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n), p_(static_cast<T*>(Malloc(n * sizeof(T) + 1))) {}
  DeviceArray(const T* host, size_t n) : DeviceArray(n) { CopyToDevice(p_, host, n * sizeof(T)); }
  ~DeviceArray() { Free(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void ToHost(T* host) const { CopyToHost(host, p_, n_ * sizeof(T)); }

 private:
  size_t n_;
  T* p_;
};

// ---- Formats
void Quantize(const BlockFormat& fmt, const float* x, size_t rows, uint8_t* out,
              Stream s = nullptr);
void Dequantize(const BlockFormat& fmt, const uint8_t* in, size_t rows, float* x,
                Stream s = nullptr);

// ---- Attention (the compact form; the masked form exists only on the CPU)
void SparseSwaAttention(const AttentionArgs& args, Stream s = nullptr);

// ---- Indexer
void IndexerScores(const IndexerArgs& args, float* scores, uint64_t row_stride, Stream s = nullptr);
void BlockMaxPool(const float* scores, uint32_t rows, uint64_t n, uint64_t row_stride,
                  uint32_t block, float* pooled, uint64_t pooled_stride, Stream s = nullptr);
// Row r: the k best of scores[r * row_stride .. + counts[r]) (counts may be
// null: n each), in the CPU TopK's order and output form.
void TopKRows(const float* scores, uint32_t rows, uint64_t n, const uint64_t* counts,
              uint64_t row_stride, uint32_t k, int32_t* out, Stream s = nullptr);

// The Full and Reindex layers (indexer.h) on the device, with identical
// selections given identical scores. max_visible >= every visible[t].
// scratch: a device buffer of IndexerScratchBytes(tokens, max_visible, cfg)
// bytes (Reindex needs less; the same size is always enough).
size_t IndexerScratchBytes(uint32_t tokens, uint64_t max_visible, const IndexerConfig& cfg);
void IndexerSelectFull(const IndexerArgs& args, const IndexerConfig& cfg, uint64_t max_visible,
                       int32_t* candidates, int32_t* topk, void* scratch, Stream s = nullptr);
void IndexerReindex(const IndexerArgs& args, const IndexerConfig& cfg, const int32_t* candidates,
                    int32_t* topk, void* scratch, Stream s = nullptr);
// The Reuse layer: the source layer's indices, copied on the stream.
void IndexerReuse(const int32_t* source_topk, size_t tokens, uint32_t k, int32_t* topk,
                  Stream s = nullptr);

// ---- MoE
void Route(const RouterConfig& cfg, const float* x, uint32_t tokens, uint32_t d_model,
           const float* w_router, const float* bias, int32_t* expert_ids, float* gates,
           Stream s = nullptr);
// args.experts and args.shared point to device arrays of ExpertWeights whose
// matrices are device pointers; max_hidden bounds their `hidden`. scratch
// is a device buffer of MoeScratchBytes(args) bytes.
size_t MoeScratchBytes(const MoeArgs& args);
void MoeForward(const MoeArgs& args, uint32_t max_hidden, void* scratch, Stream s = nullptr);

// ---- Block copy: PagedPool's spans are host arrays holding device base
// pointers; `pages` is a device array. One launch per layer group.
void GatherBlocks(const PagedPool& pool, const uint32_t* pages, uint32_t blocks,
                  const PayloadBuffers& payloads, Stream s = nullptr);
void ScatterBlocks(const PayloadBuffers& payloads, const uint32_t* pages, uint32_t blocks,
                   const PagedPool& pool, Stream s = nullptr);

}  // namespace strata::kernels::cuda

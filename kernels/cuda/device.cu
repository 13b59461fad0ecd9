// CUDA device plumbing: availability, name and FP32 peak of the device,
// memory, copies and event timing for the tests and benchmarks (cuda.h).
// No op lives here; each op has its own file (formats.cu, attention.cu, ...).

#include <string>

#include "cuda_util.cuh"
#include "strata/kernels/cuda.h"

namespace strata::kernels::cuda {

bool DeviceAvailable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device present";
    return false;
  }
  return true;
}

std::string DeviceName() {
  cudaDeviceProp p{};
  STRATA_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

double PeakFp32Gflops() {
  int sms = 0, khz = 0, major = 0, minor = 0;
  STRATA_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  STRATA_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  // FP32 lanes per multiprocessor: 64 on sm_60/70/80, 128 on sm_86 and later.
  const int lanes = (major > 8 || (major == 8 && minor > 0)) ? 128 : 64;
  return 2.0 * sms * lanes * (khz * 1e3) / 1e9;  // one FMA = 2 FLOPs per lane per clock
}

void* Malloc(size_t bytes) {
  void* p = nullptr;
  STRATA_CUDA(cudaMalloc(&p, bytes));
  return p;
}
void Free(void* p) { STRATA_CUDA(cudaFree(p)); }
void CopyToDevice(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void CopyToHost(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void CopyOnDevice(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void Synchronize() { STRATA_CUDA(cudaDeviceSynchronize()); }

double TimeLaunchesMs(void (*launch)(void*), void* ctx, int iters) {
  cudaEvent_t start, stop;
  STRATA_CUDA(cudaEventCreate(&start));
  STRATA_CUDA(cudaEventCreate(&stop));
  launch(ctx);  // warm-up
  STRATA_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) launch(ctx);
  STRATA_CUDA(cudaEventRecord(stop));
  STRATA_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  STRATA_CUDA(cudaEventElapsedTime(&ms, start, stop));
  STRATA_CUDA(cudaEventDestroy(start));
  STRATA_CUDA(cudaEventDestroy(stop));
  return ms / iters;
}

}  // namespace strata::kernels::cuda

// CUDA kernels against the CPU reference (checks in cuda_checks.h):
// bit-exact for quantization, pooling, top-k, router ids and block copy;
// within float tolerance for attention, indexer scores and MoE (device
// expf/logf differ in the last bits); and the CUDA attention's own batch
// invariance. Every test skips with "no CUDA device: ..." when the CUDA
// kernels were not built or no GPU is present.
#include <gtest/gtest.h>

#include <string>

#if STRATA_KERNELS_HAVE_CUDA
#include "cuda_checks.h"
#endif

namespace strata::kernels {
namespace {

#if STRATA_KERNELS_HAVE_CUDA

#define REQUIRE_GPU()                                                            \
  do {                                                                           \
    std::string why;                                                             \
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

TEST(CudaTest, FormatsMatchCpuBitExactly) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckFormats(), "");
}
TEST(CudaTest, AttentionMatchesCpuAndIsBatchInvariant) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckAttention(), "");
}
TEST(CudaTest, IndexerMatchesCpu) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckIndexer(), "");
}
TEST(CudaTest, IndexerSelectMatchesCpu) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckIndexerSelect(), "");
}
TEST(CudaTest, MoeMatchesCpu) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckMoe(), "");
}
TEST(CudaTest, BlockCopyMatchesCpu) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda_checks::CheckBlockCopy(), "");
}

#else  // !STRATA_KERNELS_HAVE_CUDA

TEST(CudaTest, CpuOnlyBuild) {
  GTEST_SKIP() << "no CUDA device: the CUDA kernels were not built (no nvcc at configure time, "
                  "or STRATA_WITH_CUDA=OFF)";
}

#endif

}  // namespace
}  // namespace strata::kernels

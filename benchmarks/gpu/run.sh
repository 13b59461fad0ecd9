#!/usr/bin/env bash
# Builds the CUDA kernels and, in one go on a GPU machine (H100/H200 class,
# well under 5 minutes), runs
#   1. the CUDA-vs-CPU correctness checks (tests/kernels/cuda_checks.h, the
#      same checks as the kernels_cuda_test GoogleTest suite), then
#   2. the kernel timings (`strata-bench kernels --gpu`): achieved GB/s and
#      GFLOP/s next to the device's measured device-to-device copy bandwidth.
# It compiles with nvcc and g++ directly, so it needs neither CMake nor the
# store's dependencies (a bare GPU box may lack them). Output goes to
# $BUILD (default build-gpu/): gpu_run.txt (table) and kernels_gpu.json.
# Record the figures with the device and date in benchmarks/gpu/RESULTS.md.
#
#   benchmarks/gpu/run.sh            # CUDA_ARCH=90 to skip detection
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build-gpu}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC="${NVCC:-$CUDA_HOME/bin/nvcc}"
CXX="${CXX:-g++}"
mkdir -p "$BUILD"

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
fi
ARCH="${CUDA_ARCH:-}"
if [[ -z "$ARCH" ]]; then
  ARCH="$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null || true) | head -1 | tr -d ' .')"
  ARCH="${ARCH:-90}"
fi
echo "building for sm_$ARCH in $BUILD"

start=$(date +%s)
FLAGS=(-std=c++20 -O2 -DNDEBUG -DSTRATA_KERNELS_HAVE_CUDA=1 -I"$ROOT/kernels/include"
       -I"$ROOT/tests/kernels" -I"$ROOT/benchmarks" -I"$ROOT/cachestore/include")
# Objects of an older layout (the single kernels.cu.o) would be linked twice.
rm -f "$BUILD"/*.o
pids=()
# Kernel sources get -ffp-contract=off, as in the CMake build.
for src in "$ROOT"/kernels/src/*.cc; do
  "$CXX" "${FLAGS[@]}" -ffp-contract=off -c "$src" -o "$BUILD/$(basename "$src").o" & pids+=($!)
done
# bench_util.cc prints JSON through strata/json_text.h (cachestore util).
for src in "$ROOT"/benchmarks/kernels_bench.cc "$ROOT"/benchmarks/bench_util.cc \
           "$ROOT"/benchmarks/gpu/gpu_main.cc "$ROOT"/cachestore/src/util/json_text.cc; do
  "$CXX" "${FLAGS[@]}" -I"$CUDA_HOME/include" -c "$src" -o "$BUILD/$(basename "$src").o" & pids+=($!)
done
# The CUDA kernels, one file per op (kernels/cuda/*.cu).
for src in "$ROOT"/kernels/cuda/*.cu; do
  "$NVCC" -std=c++20 -O2 -DNDEBUG --fmad=false --expt-relaxed-constexpr -arch="sm_$ARCH" \
    -I"$ROOT/kernels/include" -c "$src" -o "$BUILD/$(basename "$src").o" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$CXX" -o "$BUILD/strata-gpu-check" "$BUILD"/*.o -L"$CUDA_HOME/lib64" -lcudart -lpthread
echo "built in $(( $(date +%s) - start )) s"

"$BUILD/strata-gpu-check" | tee "$BUILD/gpu_run.txt"
"$BUILD/strata-gpu-check" --json --skip-checks | tee "$BUILD/kernels_gpu.json"
echo "total $(( $(date +%s) - start )) s; figures in $BUILD/gpu_run.txt and $BUILD/kernels_gpu.json"

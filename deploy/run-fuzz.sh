#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 and runs each for a bounded
# time (FUZZ_SECONDS, default 30) from its seed corpus in tests/fuzz/corpus.
# New inputs go to a scratch copy; the repository is left untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-30}
CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" -G Ninja -DSTRATA_FUZZ=ON \
  -DSTRATA_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" --target fuzz_requests fuzz_payload
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in fuzz_requests fuzz_payload; do
  mkdir -p "$scratch/$target"
  cp tests/fuzz/corpus/$target/* "$scratch/$target/" 2>/dev/null || true
  echo "== $target for ${SECONDS_EACH}s"
  "$BUILD_DIR/tests/fuzz/$target" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    "$scratch/$target" 2>&1 | grep -E "^(Done|stat::|==|SUMMARY)|ERROR" || true
  # A crash leaves its input behind and a non-zero status: fail loudly.
  if ls crash-* leak-* timeout-* oom-* >/dev/null 2>&1; then
    echo "$target found a failing input:"; ls crash-* leak-* timeout-* oom-* 2>/dev/null
    exit 1
  fi
done

#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs the
# dependencies, builds, and runs every test with ctest.
# STRATA_SANITIZE=address,undefined|thread picks a sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
SANITIZE=${STRATA_SANITIZE:-}
BUILD_DIR=${BUILD_DIR:-build${SANITIZE:+-${SANITIZE//,/-}}}
cmake -S . -B "$BUILD_DIR" -G Ninja -DSTRATA_SANITIZE="$SANITIZE"
cmake --build "$BUILD_DIR"
if [ "$SANITIZE" = thread ]; then
  # UCX's memory hooks (libucm) crash under TSan's interceptors.
  export UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
  export TSAN_OPTIONS=${TSAN_OPTIONS:-report_signal_unsafe=0 suppressions=$PWD/tests/tsan.supp}
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"

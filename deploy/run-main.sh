#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: installs the
# dependencies, builds, and runs the in-process store on a sample workload
# (a 131,072-token prompt of V4.1-sized global KV), printing its table.
# Extra arguments go to `strata-bench store` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja
cmake --build "$BUILD_DIR" --target strata-bench
"$BUILD_DIR"/benchmarks/strata-bench store "$@"

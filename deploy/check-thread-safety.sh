#!/usr/bin/env bash
# clang's thread-safety analysis over the store (docs/architecture.md, lock
# order): every ABSL_GUARDED_BY member read or written without its lock, and
# every call of an ABSL_EXCLUSIVE_LOCKS_REQUIRED function without the lock,
# is an error. Compile only (-fsyntax-only): no linking, no running. Uses
# build/compile_commands.json (configures the build directory when it is
# missing; installs clang-14 when it is). ONLY=<regex> checks a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
command -v clang++-14 >/dev/null || bash deploy/install-deps.sh
if [ ! -f "$BUILD_DIR/compile_commands.json" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja >/dev/null
fi
# The generated protobuf headers must exist for the sources to parse.
cmake --build "$BUILD_DIR" --target strata_proto strata_etcd_proto >/dev/null
commands=$(mktemp)
trap 'rm -f "$commands"' EXIT
cmake -DBUILD_DIR="$BUILD_DIR" -DOUT="$commands" -DONLY="${ONLY:-}" -P cmake/ThreadSafetyCommands.cmake
echo "thread-safety analysis: $(wc -l < "$commands") files"
if ! xargs -d '\n' -P "$(nproc)" -n 1 sh -c < "$commands"; then
  echo "thread-safety analysis failed (see the errors above)" >&2
  exit 1
fi
echo "thread-safety analysis: clean"

#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: installs the
# dependencies, builds, starts a strata-node on loopback (no external
# service), and runs strata-worker against it on the bundled multi-turn
# sample workload (deploy/sample.workload, made by strata-mkworkload),
# printing per-request TTFT, hits, the hit ratio and cold vs warm TTFT.
# Extra arguments go to strata-worker (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja
cmake --build "$BUILD_DIR" --target strata-node strata-worker strata-mkworkload

work=$(mktemp -d)
node_pid=""
cleanup() {
  if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
    kill -TERM "$node_pid"
    wait "$node_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The bundled workload; regenerate with: strata-mkworkload -o deploy/sample.workload
workload=deploy/sample.workload
[ -f "$workload" ] || { "$BUILD_DIR"/worker/strata-mkworkload -o "$work/sample.workload"; workload="$work/sample.workload"; }

echo "== starting strata-node (deploy/strata-node.yaml, demo tokens)" >&2
"$BUILD_DIR"/cachestore/strata-node --config deploy/strata-node.yaml \
  --set listen=127.0.0.1:0 --set http_listen=127.0.0.1:0 >"$work/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 300); do
  grep -q "listening grpc=" "$work/node.log" && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.log" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/.*listening grpc=\([0-9]*\).*/\1/p' "$work/node.log")
[ -n "$port" ] || { echo "strata-node did not start" >&2; cat "$work/node.log" >&2; exit 1; }
echo "== strata-worker on $workload against strata://127.0.0.1:$port" >&2
"$BUILD_DIR"/worker/strata-worker --store "strata://127.0.0.1:$port" --token demo-write \
  --workload "$workload" "$@"

#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: installs the
# dependencies, builds, starts a strata-node on loopback (no external
# service) and a serving strata-worker attached to it (`strata-worker
# serve`, the OpenAI-style HTTP API), then drives the bundled multi-turn
# sample workload (deploy/sample.workload, made by strata-mkworkload)
# through HTTP, printing per-request TTFT, hits (and how much of them the
# worker's HBM tier held), the hit ratio and cold vs warm TTFT. Then one
# request with curl, and a SIGTERM drain of the worker.
# Extra arguments go to `strata-worker send` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja
cmake --build "$BUILD_DIR" --target strata-node strata-worker strata-mkworkload

work=$(mktemp -d)
node_pid=""
worker_pid=""
cleanup() {
  for pid in $worker_pid $node_pid; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# wait_listening PID LOG KIND NAME: prints the port of LOG's "listening
# KIND=PORT" line once PID writes it (60 s at most).
wait_listening() {
  for _ in $(seq 600); do
    grep -q "listening $3=" "$2" && break
    kill -0 "$1" 2>/dev/null || { cat "$2" >&2; return 1; }
    sleep 0.1
  done
  local p
  p=$(sed -n "s/.*listening $3=\([0-9]*\).*/\1/p" "$2")
  [ -n "$p" ] || { echo "$4 did not start" >&2; cat "$2" >&2; return 1; }
  echo "$p"
}

# The bundled workload; regenerate with: strata-mkworkload -o deploy/sample.workload
workload=deploy/sample.workload
[ -f "$workload" ] || { "$BUILD_DIR"/worker/strata-mkworkload -o "$work/sample.workload"; workload="$work/sample.workload"; }

echo "== starting strata-node (deploy/strata-node.yaml, demo tokens)" >&2
"$BUILD_DIR"/cachestore/strata-node --config deploy/strata-node.yaml \
  --set listen=127.0.0.1:0 --set http_listen=127.0.0.1:0 >"$work/node.log" 2>&1 &
node_pid=$!
port=$(wait_listening "$node_pid" "$work/node.log" grpc strata-node)
echo "== strata-worker serve, attached to strata://127.0.0.1:$port" >&2
"$BUILD_DIR"/worker/strata-worker serve --listen 127.0.0.1:0 \
  --store "strata://127.0.0.1:$port" --token demo-write >"$work/worker.log" 2>&1 &
worker_pid=$!
http=$(wait_listening "$worker_pid" "$work/worker.log" http strata-worker)

echo "== $workload through http://127.0.0.1:$http/v1/completions" >&2
"$BUILD_DIR"/worker/strata-worker send --endpoint "127.0.0.1:$http" --workload "$workload" "$@"

echo "== one request with curl" >&2
curl -sS "http://127.0.0.1:$http/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "System: you are a cache-aware assistant.", "max_tokens": 8, "seed": 1}' >&2
echo >&2
echo "== SIGTERM: the worker drains, then the node" >&2
kill -TERM "$worker_pid"
wait "$worker_pid"
worker_pid=""
tail -n 2 "$work/worker.log" >&2

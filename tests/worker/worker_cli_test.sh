#!/usr/bin/env bash
# strata-worker end to end on a tiny two-turn workload, in process: the
# second turn hits, and --metrics-file writes the strata_worker_* metrics
# that say so; --metrics-listen starts the endpoint (HttpEndpointTest checks
# what it serves); bad paths and addresses fail before the run.
set -euo pipefail
worker=$1
mkworkload=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$mkworkload" -o "$work/w" --conversations 1 --turns 2 --system-bytes 600 --turn-bytes 300 \
  --max-new 4 >/dev/null
"$worker" --store inproc:// --workload "$work/w" --metrics-file "$work/metrics.txt" \
  --metrics-listen 127.0.0.1:0 >"$work/out.txt" 2>"$work/err.txt"
cat "$work/out.txt"
grep -q 'metrics on http://127.0.0.1:[1-9][0-9]*/metrics' "$work/err.txt" ||
  { echo "no metrics address on stderr:"; cat "$work/err.txt"; exit 1; }
check() {
  grep -qE "$1" "$work/metrics.txt" || { echo "missing: $1"; cat "$work/metrics.txt"; exit 1; }
}
check '^strata_worker_requests_total\{outcome="finished"\} 2$'
check '^strata_worker_hit_tokens_total [1-9][0-9]*$'
check '^strata_worker_swa_states_total\{result="hit"\} 1$'
check '^strata_worker_ttft_seconds_count 2$'
# A metrics file that cannot be written is an error, not a silent loss.
if "$worker" --store inproc:// --workload "$work/w" --metrics-file "$work/no/such/dir/m" \
  >/dev/null 2>"$work/err2.txt"; then
  echo "an unwritable --metrics-file was accepted"
  exit 1
fi
grep -q "cannot write the metrics" "$work/err2.txt" ||
  { echo "unexpected error text:"; cat "$work/err2.txt"; exit 1; }
# So is a listen address that is not host:port.
if "$worker" --store inproc:// --workload "$work/w" --metrics-listen nonsense \
  >/dev/null 2>"$work/err3.txt"; then
  echo "a bad --metrics-listen was accepted"
  exit 1
fi
grep -q "must be host:port" "$work/err3.txt" ||
  { echo "unexpected error text:"; cat "$work/err3.txt"; exit 1; }
# --json escapes what the workload names: a quote and a control byte in a
# conversation name stay inside their JSON string.
printf 'strata-workload 1\nturn\ta"b\001c\t2\thello\n' >"$work/odd"
"$worker" --store inproc:// --workload "$work/odd" --json >"$work/odd.json" 2>/dev/null
grep -qF '"conversation":"a\"b\u0001c"' "$work/odd.json" ||
  { echo "conversation name not escaped:"; cat -v "$work/odd.json"; exit 1; }
# A workload whose last turn would outgrow the prompt limit is refused when
# it is made (the worker refuses such a file before any turn runs: WorkloadTest).
if "$mkworkload" -o "$work/long" --conversations 1 --turns 2 --system-bytes 600000 \
  --turn-bytes 300000 >/dev/null 2>"$work/err4.txt"; then
  echo "strata-mkworkload wrote a workload the worker cannot run"
  exit 1
fi
grep -q "above the worker's limit" "$work/err4.txt" ||
  { echo "unexpected error text:"; cat "$work/err4.txt"; exit 1; }
# The main job's path: `strata-worker serve` (the HBM tier on, no store),
# the same workload sent through HTTP with `strata-worker send`: the second
# turn hits the HBM tier; SIGTERM drains and exits 0.
"$worker" serve --listen 127.0.0.1:0 --store none >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 600); do
  grep -q "listening http=" "$work/serve.log" && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done
http=$(sed -n 's/.*listening http=\([0-9]*\).*/\1/p' "$work/serve.log")
"$worker" send --endpoint "127.0.0.1:$http" --workload "$work/w" --json >"$work/send.json"
grep -qE '"turn":2,"prompt_tokens":[0-9]+,"hit_tokens":[1-9][0-9]*,"hbm_hit_tokens":[1-9]' \
  "$work/send.json" || { echo "turn 2 did not hit the HBM tier:"; cat "$work/send.json"; exit 1; }
if "$worker" send --endpoint "127.0.0.1:1" --workload "$work/w" >/dev/null 2>"$work/err5.txt"; then
  echo "send to a closed port succeeded"
  exit 1
fi
kill -TERM "$serve_pid"
wait "$serve_pid" || { echo "serve did not exit 0 after SIGTERM:"; cat "$work/serve.log"; exit 1; }
grep -q "drained; 2 requests finished" "$work/serve.log" || { cat "$work/serve.log"; exit 1; }
echo "worker CLI metrics: ok"

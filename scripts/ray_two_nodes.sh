#!/usr/bin/env bash
# A two-node Ray cluster on this machine (`ray start --head` and `ray start --address=...` on
# localhost, one CPU each) and a search on it: scripts/ray_two_nodes.py runs the search on
# actors spread over both nodes, one of them killed mid-candidate, and checks the answer
# against the serial search. python/tests/test_scale_out.py runs this; by hand:
#   PATH=target/venv/bin:$PATH bash scripts/ray_two_nodes.sh model.onnx
# The cluster's processes are this script's: each `ray start --block` leads a process group
# of its own, ended (SIGTERM, then SIGKILL) on exit, whatever happened.
set -euo pipefail
model=${1:?usage: ray_two_nodes.sh MODEL.onnx}
here=$(cd "$(dirname "$0")" && pwd)
py=$(command -v python)
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
logs=$(mktemp -d)
echo "logs in $logs" >&2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 3
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  [ -n "${KEEP_LOGS:-}" ] || rm -rf "$logs"
}
trap cleanup EXIT
# Ray 2.60's `ray start` turns token authentication on, and `ray start --head` refuses to
# start without a token (it does not make one, where `ray.init()` writes ~/.ray/auth_token):
# the cluster gets its own token, in the environment every process here inherits, so the
# script needs nothing in ~/.ray (a fresh machine has no token there).
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$("$py" -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_TOKEN
common=(--num-cpus=1 --disable-usage-stats --block)
setsid ray start --head --port="$port" --include-dashboard=false "${common[@]}" >"$logs/head.log" 2>&1 &
pids+=($!)
wait_for() { # NODES: until the cluster has that many live nodes (at most 120 s)
  for _ in $(seq 120); do
    n=$(timeout 30 "$py" - "$address" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, logging_level="ERROR")
print(sum(1 for n in ray.nodes() if n["Alive"]))
PY
)
    [ "${n:-0}" -ge "$1" ] && return 0
    sleep 1
  done
  echo "the cluster did not reach $1 node(s)" >&2
  tail -20 "$logs"/*.log >&2
  return 1
}
# The head's address as Ray announces it (the machine's own IP, which Ray picks).
address=""
for _ in $(seq 120); do
  address=$(sed -n "s/.*ray start --address='\([^']*\)'.*/\1/p" "$logs/head.log" | head -n 1)
  [ -n "$address" ] && break
  sleep 1
done
[ -n "$address" ] || { echo "the head did not start" >&2; tail -20 "$logs/head.log" >&2; exit 1; }
wait_for 1
setsid ray start --address="$address" "${common[@]}" >"$logs/worker.log" 2>&1 &
pids+=($!)
wait_for 2
echo "two-node cluster at $address"
"$py" "$here/ray_two_nodes.py" --address "$address" --model "$model"

#!/bin/bash
# Do the two cores slow each other down? Each engine on one thread on CPU A alone, then two
# copies of it at once on CPUs A and B, then each alone on CPU A beside a memory hog on CPU B
# (a loop copying 256 MiB: the contention another tenant's streaming job puts on the shared
# cache and memory), then both engines' two-thread runs, ROUNDS times. Equal alone / twin
# times mean no shared-core or bandwidth limit at this size: a two-thread loss is then the
# engine's own parallel loops; the hog rows say how much each engine loses to a busy
# neighbour (docs/benchmarks.md, profile recipe).
#
# Usage: bench/twins.sh LATENCY_BIN DIR NAME   (DIR/NAME.onnx and DIR/NAME/input_K.pb, as
#        bench/run.sh and kit.py write them; the kit's bin/latency works too)
#   env: CPUS=A,B (default 0,1), ROUNDS (default 2), PYTHON (default python3, with onnxruntime)
set -euo pipefail
[ $# -eq 3 ] || { sed -n 2,9p "$0"; exit 2; }
bin=$1 dir=$2 name=$3
here=$(cd "$(dirname "$0")" && pwd)
IFS=, read -r a b <<<"${CPUS:-0,1}"
py=${PYTHON:-python3}
median() { "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['median_ms'])"; }
mx() { taskset -c "$1" env RAYON_NUM_THREADS="$2" "$bin" --fp32-only "$dir" "$name" | median; }
ort() { taskset -c "$1" "$py" "$here/ort_latency.py" "$dir" "$2" "$name" | median; }
# `$@` on CPU A while CPU B copies 256 MiB over and over (numpy's copy: streaming loads and
# stores, as a neighbour's data-loading or memcpy-bound job).
beside_hog() {
  taskset -c "$b" "$py" -c 'import numpy as np
a = np.ones(1 << 26, np.float32); b = np.empty_like(a)
while True: np.copyto(b, a)' &
  local hog=$!
  sleep 1
  "$@"
  kill "$hog"
  wait "$hog" 2>/dev/null || true
}
"$bin" --core-round-trip
for r in $(seq "${ROUNDS:-2}"); do
  echo "round $r: mixprec alone $(mx "$a" 1) ms; ORT alone $(ort "$a" 1) ms"
  ta=$(mktemp) tb=$(mktemp)
  mx "$a" 1 >"$ta" & mx "$b" 1 >"$tb" & wait
  echo "round $r: mixprec twins $(cat "$ta") / $(cat "$tb") ms"
  ort "$a" 1 >"$ta" & ort "$b" 1 >"$tb" & wait
  echo "round $r: ORT twins $(cat "$ta") / $(cat "$tb") ms"
  rm -f "$ta" "$tb"
  echo "round $r: beside a memory hog: mixprec $(beside_hog mx "$a" 1) ms; ORT $(beside_hog ort "$a" 1) ms"
  echo "round $r: two threads: mixprec $(mx "$a,$b" 2) ms; ORT $(ort "$a,$b" 2) ms"
done

#!/bin/bash
# Do the two cores slow each other down? Each engine on one thread on CPU A alone, then two
# copies of it at once on CPUs A and B, then both engines' two-thread runs, ROUNDS times.
# Equal alone / twin times mean no shared-core or bandwidth limit at this size: a two-thread
# loss is then the engine's own parallel loops (docs/benchmarks.md, profile recipe).
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
"$bin" --core-round-trip
for r in $(seq "${ROUNDS:-2}"); do
  echo "round $r: mixprec alone $(mx "$a" 1) ms; ORT alone $(ort "$a" 1) ms"
  ta=$(mktemp) tb=$(mktemp)
  mx "$a" 1 >"$ta" & mx "$b" 1 >"$tb" & wait
  echo "round $r: mixprec twins $(cat "$ta") / $(cat "$tb") ms"
  ort "$a" 1 >"$ta" & ort "$b" 1 >"$tb" & wait
  echo "round $r: ORT twins $(cat "$ta") / $(cat "$tb") ms"
  rm -f "$ta" "$tb"
  echo "round $r: two threads: mixprec $(mx "$a,$b" 2) ms; ORT $(ort "$a,$b" 2) ms"
done

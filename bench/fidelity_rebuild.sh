#!/usr/bin/env bash
# Rebuilds the SmolLM2 exports of bench/fidelity.sh on the GPU machine, for a transfer that
# cannot carry them (330 MB each; the workplace's device tool carries 64 MiB a call): from the
# GGUF (98 MB), scripts/smollm2_to_onnx.py's plain-op export is derived again, and each
# DIR/device/smollm2_*/ folder's plan (plan.txt, written by prepare) is converted with the same
# mixprec; the export must have the sha256 that prepare wrote (model_fp16.sha256), else it stops.
# The rotary tables are not recomputed but taken from smollm2_tables.npz (prepare's, 4 MB):
# numpy's float32 power, cos and sin may round differently on another CPU (SIMD paths); the
# dequantized weights are products and sums in float32, the same everywhere.
#
#   bash DIR/device/fidelity_rebuild.sh GGUF MIXPREC      (python3 with numpy, onnx and gguf)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gguf=${1:?usage: fidelity_rebuild.sh GGUF MIXPREC}
mix=${2:?usage: fidelity_rebuild.sh GGUF MIXPREC}
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" - "$here/smollm2_to_onnx.py" "$gguf" "$tmp/plain" "$here/smollm2_tables.npz" <<'EOF'
import os
import sys

import numpy as np
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(sys.argv[1]))
import smollm2_to_onnx as conv  # noqa: E402

reader = conv.GGUFReader(sys.argv[2])
cfg = conv.read_config(reader)
model = conv.build_plain(cfg, conv.read_weights(reader, cfg))
tables = np.load(sys.argv[4])
for t in model.graph.initializer:
    if t.name in tables.files:
        mine, theirs = numpy_helper.to_array(t), tables[t.name]
        print(f"{t.name}: {int(np.sum(mine != theirs))} of {mine.size} values differ here; prepare's taken")
        t.CopyFrom(numpy_helper.from_array(theirs, t.name))
conv.save(model, sys.argv[3], check=False)
EOF
for d in "$here"/smollm2_*/; do
    [ -f "$d/plan.txt" ] || continue
    mapfile -t plan <"$d/plan.txt"
    "$mix" convert "$tmp/plain/model.onnx" "${plan[@]}" -o "$d/model_fp16.onnx" >/dev/null 2>"$d/convert.log"
    (cd "$d" && sha256sum -c --quiet model_fp16.sha256) || { echo "$d: the rebuilt export differs" >&2; exit 1; }
    echo "rebuilt $(basename "$d") (sha256 as prepared)"
done

#!/usr/bin/env bash
# A model with >= 3 GB of external-data weights (a chain of 12 MatMuls with 8192x8192 float32
# weights, written to disk one weight at a time, never the whole model in Python memory), then
# wall time and peak RSS (/usr/bin/time -v) of:
#   mixprec inspect           (targets: <= 3 s, <= 300 MB)
#   mixprec run  (FP32)       (target: peak RSS <= 1.3x the weight bytes)
#   mixprec run --fp16        (target: <= 1.6x)
#   mixprec convert --fp16    (must complete; its float16 output is under 2 GiB: one file)
#   mixprec convert, one layer float16 (the output is over 2 GiB: written with external
#                             data, then reloaded by mixprec inspect)
# LAYERS=N and DIM=D change the size. Needs about 2x the weight bytes of free disk.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MIXPREC_PYTHON:-$(bash scripts/setup-python.sh)}
layers=${LAYERS:-12}
dim=${DIM:-8192}
dir=target/bigmodel
mkdir -p "$dir"
cargo build --release --quiet
bin=${CARGO_TARGET_DIR:-target}/release/mixprec
if [ ! -f "$dir/big.onnx" ] || [ "$(cat "$dir/.size" 2>/dev/null)" != "$layers x $dim" ]; then
  "$py" - "$dir" "$layers" "$dim" <<'PY'
import os, sys
import numpy as np
import onnx
from onnx import helper, TensorProto
out, layers, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = "big.weights"
inits, nodes, offset = [], [], 0
with open(os.path.join(out, data), "wb") as f:
    for i in range(layers):
        rng = np.random.default_rng(i)
        w = (rng.standard_normal((dim, dim), dtype=np.float32) / np.sqrt(dim)).astype(np.float32)
        b = w.tobytes()
        f.write(b)
        t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[dim, dim],
                        data_location=TensorProto.EXTERNAL)
        for k, v in (("location", data), ("offset", str(offset)), ("length", str(len(b)))):
            e = t.external_data.add(); e.key, e.value = k, v
        offset += len(b)
        inits.append(t)
        prev = "x" if i == 0 else f"h{i-1}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"MatMul_{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i}" if i < layers - 1 else "y"], name=f"Tanh_{i}"))
        del w, b
g = helper.make_graph(nodes, "big",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dim])],
                      initializer=inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="mixprec-bench")
with open(os.path.join(out, "big.onnx"), "wb") as f:
    f.write(m.SerializeToString())
print(f"weights: {offset / 1e9:.2f} GB")
PY
  echo "$layers x $dim" > "$dir/.size"
fi
weights=$(stat -c %s "$dir/big.weights")
measure() {
  local name=$1; shift
  local log="$dir/$name.time"
  local rc=0
  /usr/bin/time -v "$@" >"$dir/$name.out" 2>"$log" || rc=$?
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$log" | awk '{print $NF}')
  printf "%-18s exit %-3s wall %-9s peak RSS %7.0f MB  (%.2fx weights)\n" "$name" "$rc" "$wall" \
    "$(echo "$rss / 1024" | bc -l)" "$(echo "$rss * 1024 / $weights" | bc -l)"
  if [ "$rc" != 0 ]; then grep -m1 "error" "$dir/$name.out" "$log" || true; fi
}
echo "weights: $(echo "$weights / 1000000000" | bc -l | cut -c1-5) GB in $dir/big.weights"
measure inspect $bin inspect "$dir/big.onnx"
measure run-fp32 $bin run "$dir/big.onnx" --input-shapes x:[1,$dim]
measure run-fp16 $bin run "$dir/big.onnx" --input-shapes x:[1,$dim] --fp16
rm -f "$dir/big_fp16.onnx"*
measure convert-fp16 $bin convert "$dir/big.onnx" --fp16 -o "$dir/big_fp16.onnx"
rm -f "$dir/big_mixed.onnx"*
measure convert-mixed $bin convert "$dir/big.onnx" --layer-precisions MatMul_0:float16 -o "$dir/big_mixed.onnx"
ls -l "$dir"/big_fp16.onnx* "$dir"/big_mixed.onnx* 2>/dev/null | awk '{print "  " $5 " bytes  " $NF}'
measure inspect-mixed $bin inspect "$dir/big_mixed.onnx"

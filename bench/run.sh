#!/usr/bin/env bash
# Latency of mixprec's FP32 interpreter vs ONNX Runtime (CPU) on the benchmark-size CNN
# (1x3x224x224) and transformer encoder (2 layers, seq 128, d 256), same thread count,
# after warm-up; prints the median latency of each and the ratio mixprec/ORT.
# THREADS=N overrides the thread count (default 2, the CI machine's core count).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
py=$(bash scripts/setup-python.sh)
dir=target/bench-models
"$py" scripts/gen_models.py --out "$dir" --size bench --only cnn,transformer >/dev/null
cargo build --release --bench latency --quiet 2>/dev/null || cargo build --release --benches
mix=$(RAYON_NUM_THREADS=$threads cargo bench --quiet --bench latency -- "$dir" cnn transformer)
ort=$("$py" bench/ort_latency.py "$dir" "$threads" cnn transformer)
"$py" - "$threads" <<PY
import json, sys
mix = {j["model"]: j for j in map(json.loads, """$mix""".strip().splitlines())}
ort = {j["model"]: j for j in map(json.loads, """$ort""".strip().splitlines())}
print(f"threads={sys.argv[1]}")
print(f"{'model':<12} {'mixprec ms':>11} {'onnxruntime ms':>15} {'ratio':>7}")
for m in mix:
    print(f"{m:<12} {mix[m]['median_ms']:>11.3f} {ort[m]['median_ms']:>15.3f} {mix[m]['median_ms']/ort[m]['median_ms']:>7.2f}")
PY

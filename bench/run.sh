#!/usr/bin/env bash
# Latency of mixprec's FP32 interpreter vs ONNX Runtime (CPU) on the benchmark-size CNN
# (1x3x224x224) and transformer encoder (2 layers, seq 128, d 256), same thread count,
# after warm-up; prints the median latency of each and the ratio mixprec/ORT, and the emulated
# all-FP16 and all-INT8 runs of mixprec against its own FP32 run; the last column is the ratio
# of the two engines' fastest runs (steadier than the medians' on a shared machine).
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
print(f"{'model':<12} {'mixprec ms':>11} {'onnxruntime ms':>15} {'mixprec/ORT':>12} {'mixprec fp16 ms':>16} {'fp16/fp32':>10} {'int8/fp32':>10} {'min ratio':>10}")
for m in mix:
    a, o, h, q = mix[m]['median_ms'], ort[m]['median_ms'], mix[m]['fp16_median_ms'], mix[m]['int8_median_ms']
    q = f"{q/a:>10.2f}" if q else f"{'-':>10}"
    # The ratio of the fastest runs: steadier than the medians' on a machine shared with others.
    least = mix[m]['min_ms'] / ort[m]['min_ms']
    print(f"{m:<12} {a:>11.3f} {o:>15.3f} {a/o:>12.2f} {h:>16.3f} {h/a:>10.2f} {q} {least:>10.2f}")
PY

#!/usr/bin/env bash
# The real-model corpus (tests/fixtures/real_models.json, fetched by scripts/real_models.sh):
# per model, does it load; FP32 max error against ONNX Runtime on the same inputs; FP32 median
# latency of mixprec and ORT and their ratio (benches/latency.rs and bench/ort_latency.py, as
# bench/run.sh); the emulated all-float16 run's verdict under the task-level criterion and its
# error against FP32; debug precision --fp16 --mode minimal with the strict and the task-level
# criterion: answer size (layers), evaluations and wall time of the command. Not in CI.
# THREADS=N overrides the thread count (default 2, the CI machine's core count).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
py=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON=$py
cache=$(bash scripts/real_models.sh | tail -n 1)
cargo build --release --quiet
cargo build --release --bench latency --quiet 2>/dev/null || cargo build --release --benches
bin=${CARGO_TARGET_DIR:-target}/release/mixprec
"$py" bench/corpus.py "$bin" "$cache" target/bench-corpus "$threads"

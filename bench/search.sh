#!/usr/bin/env bash
# The precision search on the benchmark-size planted models (a 224x224 ResNet-like CNN and a
# 2-layer transformer, seq 128, d 256, each with a planted FP16 fault): per mode, evaluations,
# layer executions with the incremental cache vs re-running every candidate in full, wall
# time with and without the cache, and wall time as a multiple of one FP32 inference. Then
# the search as users run it (`debug precision`, bench/search_jobs.py) with --jobs 1 and 2:
# evaluations against issue 10's bound, sets evaluated ahead, wall time, peak RSS against a
# plain run, on the planted models and (when scripts/real_models.sh has fetched it) the
# real-model corpus. THREADS=N overrides the thread count (default 2, the CI machine's).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
py=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON=$py
dir=target/bench-models
"$py" scripts/gen_models.py --out "$dir" --size bench --only planted_cnn,planted_transformer >/dev/null
RAYON_NUM_THREADS=$threads cargo bench --quiet --bench search -- "$dir" planted_cnn planted_transformer
cargo build --release --quiet
corpus=$(MIXPREC_PYTHON=$py bash scripts/real_models.sh 2>/dev/null | tail -n 1 || true)
"$py" bench/search_jobs.py "${CARGO_TARGET_DIR:-target}/release/mixprec" "$threads" "$dir" $corpus

#!/usr/bin/env bash
# The Python package against the CLI on the real-model corpus's searches (overhead of the
# in-process API, same answers) and a criterion callback's cost per evaluation: see
# bench/python_api.py. THREADS=N sets the thread count (default 2, the CI machine's);
# ROUNDS=N the alternating rounds (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
py=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON=$py
cargo build --release --quiet
PATH="$(dirname "$py"):$PATH" "$py" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --force-reinstall .
corpus=$(bash scripts/real_models.sh 2>/dev/null | tail -n 1)
RAYON_NUM_THREADS=$threads "$py" bench/python_api.py "${CARGO_TARGET_DIR:-target}/release/mixprec" \
  "$threads" "$corpus" "${ROUNDS:-3}"

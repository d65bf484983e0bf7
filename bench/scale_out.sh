#!/usr/bin/env bash
# A check-style search scaled out on Ray (docs/scale-out.md): every candidate is judged by a
# command that sleeps a fixed time (standing in for a TensorRT engine build) and then runs the
# candidate's mixed-precision model against the FP32 model; the search runs serially (no
# executor, jobs 1) and on 1, 2 and 4 Ray workers of a local Ray instance. Prints wall time
# against the serial search and the ideal (evaluations / workers x check time), and checks
# that every row has the same answer and trials. CHECK_SECONDS=S sets the sleep (default 1);
# MODE=M the search mode (default linear: one long run of probes; minimal needs only a few
# evaluations on the planted models).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup-python.sh)
export MIXPREC_PYTHON=$py PYO3_PYTHON=$py
PATH="$(dirname "$py"):$PATH" "$py" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --force-reinstall .
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/gen_models.py --out "$work" --only planted_cnn --no-ort >/dev/null
"$py" bench/scale_out.py "$work/planted_cnn.onnx" "${CHECK_SECONDS:-1}" "${MODE:-linear}"

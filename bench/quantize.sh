#!/usr/bin/env bash
# mixprec quantize against its peers (issue 13 item 4; by hand, not in CI): quantizes the
# benchmark models (scripts/gen_models.py's CNN and transformer at bench size), three CNNs
# of the real-model corpus and examples/*.onnx with ONNX Runtime's quantize_static (QDQ), NVIDIA ModelOpt
# (nvidia-modelopt[onnx]==0.47.0, CPU calibration) and `mixprec quantize --int8`, on the same
# calibration data, and prints per model and tool the quantized layers and the error against
# FP32 (cosine; top-1 agreement on classifiers), all run by ONNX Runtime with graph
# optimizations disabled. The last column runs `mixprec debug precision` on each tool's Q/DQ
# model against the FP32 model's outputs (criterion: cosine >= 0.9999; QDQ_SEARCH_ARGS replaces
# the arguments after the model, QDQ_SEARCH_ARGS=off skips it): layers to exclude, evaluations,
# seconds.
#
# The venv lives outside the repo: ${MIXPREC_BENCH_VENV:-~/.cache/mixprec/bench-quantize-venv}.
# CALIB=N / EVAL=N: calibration and evaluation samples (default 16 and 32).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MIXPREC_BENCH_VENV:-$HOME/.cache/mixprec/bench-quantize-venv}
# Pins: onnxruntime/numpy as scripts/requirements-test.txt, ModelOpt as issue 13 names it. onnx
# is left to ModelOpt (0.47.0 requires onnx 1.21, not the test venv's 1.22). ModelOpt also
# pulls onnxruntime-gpu, which shares the onnxruntime module: the CPU 1.32.0 wheel is
# reinstalled last so that `import onnxruntime` is the pinned runner.
pins=(onnxruntime==1.32.0 numpy==2.4.6 "nvidia-modelopt[onnx]==0.47.0")
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import modelopt.onnx.quantization, onnxruntime' 2>/dev/null; then
    echo "[I] setting up $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "${pins[@]}" >&2
    "$venv/bin/pip" install -q --force-reinstall --no-deps onnxruntime==1.32.0 >&2
fi
py="$venv/bin/python"
cargo build --release --quiet
bin=${CARGO_TARGET_DIR:-target}/release/mixprec
dir=target/bench-models
work=target/bench-quantize
"$py" scripts/gen_models.py --out "$dir" --size bench --only cnn,transformer --no-ort >/dev/null
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cores, $("$py" -c 'import onnxruntime, modelopt; print("onnxruntime", onnxruntime.__version__, "modelopt", modelopt.__version__)')"
# The real-model corpus's CNNs (YOLOv8n, PP-OCRv4 det, the angle classifier) with the corpus's
# input shapes and generators (tests/fixtures/real_models.json); CORPUS= leaves them out.
corpus=${CORPUS-nudenet-320n ppocrv4-det ppocr-mobile-v2-cls}
corpus_args=()
if [ -n "$corpus" ]; then
    cache=$(MIXPREC_PYTHON="$py" bash scripts/real_models.sh | tail -n 1)
    for c in $corpus; do corpus_args+=("corpus:$c"); done
fi
MIXPREC_PYTHON="$py" "$py" bench/quantize_compare.py --mixprec "$bin" --work "$work" --calib "${CALIB:-16}" --eval "${EVAL:-32}" \
    --corpus-cache "${cache:-}" "${corpus_args[@]}" \
    cnn="$dir/cnn.onnx" transformer="$dir/transformer.onnx" \
    mlp_example=examples/mlp.onnx needs_constraints_example=examples/needs_constraints.onnx \
    transformer_example=examples/transformer.onnx

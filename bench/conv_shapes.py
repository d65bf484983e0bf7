#!/usr/bin/env python3
"""Per-shape convolution probe: mixprec against ONNX Runtime on single Conv(+Relu) models.

Usage: conv_shapes.py LATENCY_BIN [ROUNDS] [SHAPE...]
  LATENCY_BIN  the `latency` bench binary (cargo build --release --bench latency; it is
               target/release/deps/latency-<hash>, or the kit's bin/latency)
  ROUNDS       alternating rounds, the best median of each engine kept (default 5)
  SHAPE        name=C,H,M,K,S,P (input channels, input height = width, output channels, square
               kernel, stride, padding; H and K may be HxW and KhxKw for a rectangular image or
               kernel); name=T:C,H,M,K,S,P a ConvTranspose (no Relu) of those; `vit-decoder`
               the ViT-S segmentation model's three ConvTransposes; `magika` Magika's one
               convolution (5x1 over 512x1 positions); a `*L` suffix (name=C,H,C,K,1,P*L:
               same channels and size in and out) makes a chain of L such Conv+Relu layers,
               each reading the previous one's output, as in a model (a lone layer's time
               includes ONNX Runtime's ~8 µs Python call and its layout reorders); `chains`
               the nudenet-sized chains of eight; default: the bench CNN's convolutions

Writes the models to a temporary folder, then prints per shape both engines' best median,
their GFLOP/s and the ratio, and the CPU. Each model is one Conv with bias and a Relu (fused
by both engines), or one ConvTranspose with bias; ONNX Runtime's time includes the NCHWc reorders it adds around a lone Conv,
so its in-graph convolutions are somewhat faster than these. Pin it (`taskset -c 0,1`) and
hold the build lock on a shared machine: a single run moves by 10-30 % there.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# The bench CNN's convolutions (scripts/gen_models.py): stem, 3x3 stride 1 and 2, 1x1 stride 2.
CNN = [
    "stem=3,224,32,7,2,3", "c1=32,56,32,3,1,1", "c3=32,56,64,3,2,1", "c4=64,28,64,3,1,1",
    "c5=32,56,64,1,2,0", "c6=64,28,128,3,2,1", "c7=128,14,128,3,1,1", "c9=128,14,256,3,2,1",
    "c10=256,7,256,3,1,1",
]
# The corpus ViT-S segmentation model's decoder: 4x4 stride-2 ConvTransposes doubling 14 -> 112.
VIT_DECODER = ["u1=T:384,14,256,4,2,1", "u2=T:256,28,128,4,2,1", "u3=T:128,56,64,4,2,1"]
# Magika v3.3's one convolution: 256 -> 512 channels, a 5x1 kernel over [512, 1] positions.
MAGIKA = ["magika=256,512x1,512,5x1,1,0"]
# Chains of eight 3x3 convolutions at nudenet's (YOLOv8n at 160x160) small sizes.
CHAINS = ["k128_5=128,5,128,3,1,1*8", "k64_10=64,10,64,3,1,1*8", "k128_10=128,10,128,3,1,1*8",
          "k64_20=64,20,64,3,1,1*8"]
PRESETS = {"vit-decoder": VIT_DECODER, "magika": MAGIKA, "chains": CHAINS}


def pair(v: str) -> tuple:
    """"7" -> (7, 7); "5x1" -> (5, 1)."""
    a, _, b = v.partition("x")
    return int(a), int(b or a)


def write(d: str, name: str, c: int, hw: tuple, m: int, khw: tuple, s: int, p: int,
          transpose: bool = False, layers: int = 1) -> float:
    """Writes d/name.onnx and d/name/input_0.pb; returns the model's MFLOP."""
    rng = np.random.default_rng(0)
    (h, wd), (kh, kw) = hw, khw
    attrs = dict(kernel_shape=[kh, kw], strides=[s, s], pads=[p] * 4)
    if transpose and layers > 1:
        sys.exit(f"{name}: chains are of Conv layers (no *L on a ConvTranspose)")
    if transpose:
        o = ((h - 1) * s + kh - 2 * p, (wd - 1) * s + kw - 2 * p)
        w = numpy_helper.from_array((rng.standard_normal((c, m, kh, kw)) * 0.1).astype(np.float32), "W")
        nodes = [helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], **attrs)]
        weights = [w, numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B")]
    else:
        o = ((h + 2 * p - kh) // s + 1, (wd + 2 * p - kw) // s + 1)
        if layers > 1 and (c != m or o != (h, wd)):
            sys.exit(f"{name}: a chain's layers keep their input's channels and size")
        nodes, weights = [], []
        for i in range(layers):
            # Weights scaled to keep the chain's values near unit size.
            w = rng.standard_normal((m, c, kh, kw)) / np.sqrt(c * kh * kw)
            weights += [numpy_helper.from_array(w.astype(np.float32), f"W{i}"),
                        numpy_helper.from_array(rng.standard_normal(m).astype(np.float32) * 0.1, f"B{i}")]
            x = "x" if i == 0 else f"y{i - 1}"
            y = "y" if i == layers - 1 else f"y{i}"
            nodes += [helper.make_node("Conv", [x, f"W{i}", f"B{i}"], [f"c{i}"], **attrs),
                      helper.make_node("Relu", [f"c{i}"], [y])]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, wd])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, *o])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, f"{name}.onnx"))
    os.makedirs(os.path.join(d, name), exist_ok=True)
    x = numpy_helper.from_array(rng.standard_normal((1, c, h, wd)).astype(np.float32))
    with open(os.path.join(d, name, "input_0.pb"), "wb") as f:
        f.write(x.SerializeToString())
    # A ConvTranspose multiplies every input position by every weight.
    return 2 * (h * wd if transpose else o[0] * o[1]) * m * c * kh * kw * layers / 1e6


def median_ms(cmd: list, env: dict) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[0])["median_ms"]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    latency = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    shapes = [s for a in sys.argv[3:] for s in PRESETS.get(a, [a])] or CNN
    ort_latency = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_latency.py")
    env = dict(os.environ, RAYON_NUM_THREADS=os.environ.get("RAYON_NUM_THREADS", "2"))
    threads = env["RAYON_NUM_THREADS"]
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"cpu: {cpu}; {threads} threads; onnxruntime via {sys.executable}; best of {rounds} rounds")
    with tempfile.TemporaryDirectory() as d:
        mflop = {}
        for spec in shapes:
            name, dims = spec.split("=")
            transpose = dims.startswith("T:")
            dims, _, layers = dims.partition("*")
            c, hw, m, khw, s, p = dims.removeprefix("T:").split(",")
            mflop[name] = write(d, name, int(c), pair(hw), int(m), pair(khw), int(s), int(p),
                                transpose=transpose, layers=int(layers or 1))
        best: dict = {}
        for _ in range(rounds):
            for name in mflop:
                for engine, cmd in (("mixprec", [latency, "--fp32-only", d, name]),
                                    ("ort", [sys.executable, ort_latency, d, threads, name])):
                    t = median_ms(cmd, env)
                    best[name, engine] = min(best.get((name, engine), t), t)
        print("| layer | MFLOP | mixprec ms | GFLOP/s | ORT ms | GFLOP/s | mixprec/ORT |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, mf in mflop.items():
            a, b = best[name, "mixprec"], best[name, "ort"]
            print(f"| {name} | {mf:.1f} | {a:.3f} | {mf / a:.0f} | {b:.3f} | {mf / b:.0f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()

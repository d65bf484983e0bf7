"""ONNX Runtime's figure for the kernel probe `cargo run --release --example skinny_gemm -- M`.

For each weight shape of the probe, one model holding enough MatMuls (each its own weight) to
exceed the last-level cache, run once per timing with 2 intra-op threads: each weight comes
from memory, as in a model's forward pass. Prints GFLOP/s per shape.

Usage: target/venv/bin/python bench/skinny_gemm_ort.py [M]   (default 16 rows)
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152), (2048, 2048), (2048, 5632)]


def gflops(m: int, k: int, n: int, folder: Path) -> tuple[float, int]:
    copies = max(1, -(-(256 << 20) // (k * n * 4)))
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{i}") for i in range(copies)]
    nodes = [helper.make_node("MatMul", ["a", f"w{i}"], [f"c{i}"]) for i in range(copies)]
    outputs = [helper.make_tensor_value_info(f"c{i}", TensorProto.FLOAT, [m, n]) for i in range(copies)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])], outputs, weights
    )
    path = folder / "mm.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        str(path),
        save_as_external_data=True,
        location="mm.data",
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    a = rng.standard_normal((m, k)).astype(np.float32)
    for _ in range(2):
        session.run(None, {"a": a})
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        session.run(None, {"a": a})
        best = min(best, (time.perf_counter() - start) / copies)
    return 2 * m * k * n / best / 1e9, copies


def main() -> None:
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    with tempfile.TemporaryDirectory() as folder:
        for k, n in SHAPES:
            rate, copies = gflops(m, k, n, Path(folder))
            print(f"ORT m={m} k={k} n={n}: {rate:.1f} GFLOP/s ({copies} weights)", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""CPU self-test of scripts/gpu_reference.py (not part of CI: run it by hand with a Python that
has torch, onnx and onnxruntime; every test that needs torch skips cleanly without it):

    python scripts/test_gpu_reference.py            # eager on the CPU vs ONNX Runtime
    GPUREF_TEST_COMPILE=1 python scripts/test_gpu_reference.py   # torch.compile too (slow)
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_reference as gr  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:
    ort = None

MODELS = ["cnn", "transformer", "mlp", "needs_constraints", "planted_cnn", "planted_transformer",
          "planted_square", "planted_addsub", "decomposed_ln"]


class JsonRoundTrip(unittest.TestCase):
    def test_run_results_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "out.json")
            a = np.arange(6, dtype=np.float16).reshape(2, 3)
            b = np.array([1.5, -2.0], np.float32)
            gr.save_run_results(p, "r", [([("a", a), ("b", b)], 0.5)])
            back = gr.load_run_results(p)
            self.assertEqual(list(back), ["r"])
            self.assertEqual(back["r"][0]["a"].dtype, np.float16)
            np.testing.assert_array_equal(back["r"][0]["a"], a)
            np.testing.assert_array_equal(back["r"][0]["b"], b)

    def test_wrong_class_is_rejected(self):
        with self.assertRaises(ValueError):
            gr._decode_array({"polygraphy_class": "RunResults"})


@unittest.skipIf(gr.torch is None or gr.onnx is None or ort is None, "needs torch, onnx and onnxruntime")
class ExecutorVsOnnxRuntime(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        subprocess.run([sys.executable, os.path.join(HERE, "gen_models.py"), "--out", cls.dir, "--no-ort",
                        "--only", ",".join(MODELS)], check=True, stdout=subprocess.DEVNULL)

    def run_model(self, name, mode):
        path = os.path.join(self.dir, f"{name}.onnx")
        model = gr.onnx.load(path)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        rng = np.random.RandomState(0)
        feeds = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 2 for d in i.shape]
            feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
        want = sess.run(None, feeds)
        ex = gr.Executor(model, "cpu")
        with gr.torch.no_grad():
            _, env = ex.eager(feeds)
            got = [env[n] for n in ex.output_names]
            if mode == "compile":
                ex.fold_constants(env)
                got = list(ex.compiled(None)(*[env[n] for n in ex.input_names]))
        for w, g in zip(want, got):
            g = gr.to_numpy(g)
            self.assertEqual(g.dtype, w.dtype, name)
            self.assertEqual(g.shape, w.shape, name)
            scale = max(float(np.max(np.abs(w))), 1e-30)
            self.assertLess(float(np.max(np.abs(g.astype(np.float64) - w))) / scale, 1e-4, name)

    def test_eager_matches_onnxruntime(self):
        for name in MODELS:
            with self.subTest(model=name):
                self.run_model(name, "eager")

    @unittest.skipUnless(os.environ.get("GPUREF_TEST_COMPILE"), "set GPUREF_TEST_COMPILE=1 (slow)")
    def test_compile_matches_onnxruntime(self):
        for name in ["cnn", "transformer", "mlp", "decomposed_ln"]:
            with self.subTest(model=name):
                self.run_model(name, "compile")

    def test_cast_keeps_graph_dtypes(self):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
        big = helper.make_tensor("big", TensorProto.FLOAT16, [], [65504.0])
        nodes = [
            helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
            helper.make_node("Add", ["xh", "big"], ["a"]),
            helper.make_node("Sub", ["a", "big"], ["s"]),
            helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT),
        ]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [big]),
                              opset_imports=[helper.make_opsetid("", 17)])
        ex = gr.Executor(m, "cpu")
        _, env = ex.eager({"x": np.array([1.0, 1.5, 2.0, -40.0], np.float32)})
        self.assertEqual(env["a"].dtype, gr.torch.float16)
        # Each op rounds to float16: 65504 + x is 65504 for small x (so the Sub gives 0) and 65504 - 40 rounds to 65472.
        np.testing.assert_array_equal(gr.to_numpy(env["y"]), np.array([0.0, 0.0, 0.0, -32.0], np.float32))

    def test_bfloat16_initializers_and_casts(self):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
        # bfloat16 bits of 1.0, 0.5 and 3.0 (raw, little-endian), and 1 + 2^-8 (rounds to 1 in bf16).
        w = helper.make_tensor("w", TensorProto.BFLOAT16, [3], np.array([0x3F80, 0x3F00, 0x4040], "<u2").tobytes(),
                               raw=True)
        nodes = [
            helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
            helper.make_node("Mul", ["xb", "w"], ["m"]),
            helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT),
        ]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
        ex = gr.Executor(m, "cpu")
        _, env = ex.eager({"x": np.array([1 + 2**-8, 2.0, 1.0], np.float32)})
        self.assertEqual(env["m"].dtype, gr.torch.bfloat16)
        np.testing.assert_array_equal(gr.to_numpy(env["y"]), np.array([1.0, 1.0, 3.0], np.float32))

    def test_dtype_check_catches_a_promotion(self):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])
        m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
        ex = gr.Executor(m, "cpu")
        feeds = {"x": np.array([1, -1, 2, 3], np.float16)}
        ex.eager(feeds)  # the honest op keeps float16
        ex.methods[0] = lambda n, i, a: gr.torch.relu(i[0]).float()
        with self.assertRaisesRegex(RuntimeError, "'r'.*float32.*float16"):
            ex.eager(feeds)

    def test_unsupported_op_names_the_node(self):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
        m = helper.make_model(helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g", [x],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
                              opset_imports=[helper.make_opsetid("", 17)])
        with self.assertRaisesRegex(gr.Unsupported, "'hm'.*Hardmax"):
            gr.Executor(m, "cpu")


if __name__ == "__main__":
    unittest.main()

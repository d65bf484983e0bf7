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


class FidelityInputsRecipe(unittest.TestCase):
    """bench/fidelity_inputs.py's recipe: the GPU machine draws mixprec's generated inputs again
    instead of receiving them (numpy only; MIXPREC=path also checks against mixprec's generator)."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(HERE, "..", "bench"))
        import fidelity_inputs
        cls.fi = fidelity_inputs

    def test_ranges(self):
        self.assertEqual(self.fi.parse_ranges("[0,1]"), {"": (0.0, 1.0)})
        self.assertEqual(self.fi.parse_ranges("a:[-1,2];b:[3,4]"), {"a": (-1.0, 2.0), "b": (3.0, 4.0)})

    def test_regen_round_trip(self):
        recipe = {"seed": 5, "sets": 3, "digest": "",
                  "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 3], "range": [-1.0, 1.0]},
                             {"name": "y", "dtype": "float16", "shape": [4], "range": [0.0, 2.0]}]}
        feeds = self.fi.regen_feeds(recipe)
        # Polygraphy's data loader: set i from RandomState(seed + i), inputs in order.
        rng = np.random.RandomState(6)
        np.testing.assert_array_equal(feeds[1]["x"], (rng.random_sample(6) * 2.0 - 1.0).astype(np.float32).reshape(2, 3))
        np.testing.assert_array_equal(feeds[1]["y"], (rng.random_sample(4) * 2.0).astype(np.float16))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "in.json")
            self.fi.write_feeds(p, feeds)
            back = self.fi.make_recipe(p, "x:[-1,1];y:[0,2]", 5)
            self.assertEqual(back["digest"], self.fi.digest(feeds))
            self.assertEqual(back["inputs"], recipe["inputs"])
            with self.assertRaises(SystemExit):  # another seed does not give the arrays back
                self.fi.make_recipe(p, "x:[-1,1];y:[0,2]", 6)

    @unittest.skipUnless(os.environ.get("MIXPREC"), "MIXPREC=path to a mixprec binary")
    def test_mixprec_generator(self):
        with tempfile.TemporaryDirectory() as d:
            model = os.path.join(d, "m.onnx")
            subprocess.run([sys.executable, os.path.join(HERE, "gen_models.py"), "--out", d, "--no-ort",
                            "--only", "cnn"], check=True, stdout=subprocess.DEVNULL)
            os.replace(os.path.join(d, "cnn.onnx"), model)
            p = os.path.join(d, "in.json")
            subprocess.run([os.environ["MIXPREC"], "run", model, "--val-range", "[-1,1]", "--seed", "3",
                            "--iterations", "3", "--save-inputs", p, "-q"], check=True, stdout=subprocess.DEVNULL)
            recipe = self.fi.make_recipe(p, "[-1,1]", 3)  # refuses when regen differs
            self.assertEqual(recipe["sets"], 3)


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

    def run_vs_ort(self, model, feeds, backend=None, tol=1e-6):
        """The executor (eager, or torch.compile with `backend`) against ONNX Runtime on one model."""
        from onnx import checker
        checker.check_model(model)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
        ex = gr.Executor(model, "cpu")
        with gr.torch.no_grad():
            _, env = ex.eager(feeds)
            got = [env[n] for n in ex.output_names]
            if backend is not None:
                ex.fold_constants(env)
                got = list(ex.compiled(None, backend=backend)(*[env[n] for n in ex.input_names]))
        for w, g in zip(want, got):
            g = gr.to_numpy(g)
            self.assertEqual(g.dtype, w.dtype)
            self.assertEqual(g.shape, w.shape)
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
            else:
                np.testing.assert_array_equal(g, w)

    def test_comparisons_and_logic(self):
        # SmolLM2's plain export builds its causal mask so: Range <= position, And attention_mask.
        from onnx import TensorProto, helper
        a = helper.make_tensor_value_info("a", TensorProto.INT64, [2, 5])
        b = helper.make_tensor_value_info("b", TensorProto.INT64, [2, 5])
        nodes, outs = [], []
        for op in ["Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"]:
            nodes.append(helper.make_node(op, ["a", "b"], [op]))
        nodes += [helper.make_node("And", ["Less", "Equal"], ["and_"]),
                  helper.make_node("Or", ["Less", "Equal"], ["or_"]),
                  helper.make_node("Xor", ["LessOrEqual", "GreaterOrEqual"], ["xor_"]),
                  helper.make_node("Not", ["Greater"], ["not_"])]
        for n in nodes:
            outs.append(helper.make_tensor_value_info(n.output[0], TensorProto.BOOL, [2, 5]))
        m = helper.make_model(helper.make_graph(nodes, "g", [a, b], outs), opset_imports=[helper.make_opsetid("", 17)])
        rng = np.random.RandomState(3)
        self.run_vs_ort(m, {"a": rng.randint(0, 4, (2, 5)).astype(np.int64),
                            "b": rng.randint(0, 4, (2, 5)).astype(np.int64)})

    def test_resize_cubic_and_linear(self):
        # ViT-S/16's position embeddings: cubic, half_pixel, cubic_coeff_a -0.75, to sizes (up and
        # down); its decoder's linear Resize too.
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])
        nodes, outs, inits = [], [], []
        for k, (mode, size) in enumerate([("cubic", [1, 3, 16, 16]), ("cubic", [1, 3, 5, 9]), ("linear", [1, 3, 16, 11])]):
            inits.append(helper.make_tensor(f"s{k}", TensorProto.INT64, [4], size))
            nodes.append(helper.make_node("Resize", ["x", "", "", f"s{k}"], [f"y{k}"], mode=mode,
                                          coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
                                          nearest_mode="floor"))
            outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, size))
        m = helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
        self.run_vs_ort(m, {"x": np.random.RandomState(4).uniform(-1, 1, (1, 3, 7, 7)).astype(np.float32)}, tol=1e-5)

    def test_resize_cubic_other_coefficient_is_refused(self):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])
        s = helper.make_tensor("s", TensorProto.INT64, [4], [1, 1, 8, 8])
        m = helper.make_model(helper.make_graph([helper.make_node("Resize", ["x", "", "", "s"], ["y"], name="rz",
                                                                  mode="cubic", cubic_coeff_a=-0.5)],
                                                "g", [x], [y], [s]), opset_imports=[helper.make_opsetid("", 17)])
        ex = gr.Executor(m, "cpu")
        with self.assertRaisesRegex(gr.Unsupported, "'rz'.*cubic"):
            ex.eager({"x": np.zeros((1, 1, 4, 4), np.float32)})

    def test_reduce_axes_input_traces_under_compile(self):
        # Magika: ReduceSum/ReduceMax with their axes as an input (opset 18). torch.compile read
        # the axes tensor while tracing (a data-dependent symbol) and failed in _norm_axis; the
        # axes now come from the folded constants. Dynamo alone (backend "eager") shows it, fast.
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
        outs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3, 1]),
                helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3])]
        axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
                 helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=0)]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], outs, [axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
        self.run_vs_ort(m, {"x": np.random.RandomState(5).uniform(-1, 1, (2, 3, 4)).astype(np.float32)},
                        backend="eager")

    @unittest.skipUnless(os.environ.get("GPUREF_TEST_COMPILE"), "set GPUREF_TEST_COMPILE=1 (slow)")
    def test_attention_with_a_permuted_key_compiles(self):
        # MiniLM's float16 attention: K transposed by perm (0, 2, 3, 1). Inductor's SDPA rewrite
        # took the pre-permute tensor as the key and failed ("Attempting to broadcast a dimension
        # of length 16"); gpu_reference.py turns the rewrite off. Compiled against eager.
        from onnx import TensorProto, helper
        H = TensorProto.FLOAT16
        q = helper.make_tensor_value_info("q", H, [1, 12, 16, 32])
        k = helper.make_tensor_value_info("k", H, [1, 16, 12, 32])
        v = helper.make_tensor_value_info("v", H, [1, 12, 16, 32])
        mask = helper.make_tensor_value_info("mask", H, [1, 1, 1, 16])
        y = helper.make_tensor_value_info("y", H, [1, 12, 16, 32])
        scale = helper.make_tensor("scale", H, [], [5.65625])
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
                 helper.make_node("MatMul", ["q", "kt"], ["qk"]),
                 helper.make_node("Div", ["qk", "scale"], ["sc"]),
                 helper.make_node("Add", ["sc", "mask"], ["am"]),
                 helper.make_node("Softmax", ["am"], ["p"], axis=-1),
                 helper.make_node("MatMul", ["p", "v"], ["y"])]
        m = helper.make_model(helper.make_graph(nodes, "g", [q, k, v, mask], [y], [scale]),
                              opset_imports=[helper.make_opsetid("", 17)])
        rng = np.random.RandomState(6)
        feeds = {"q": rng.randn(1, 12, 16, 32).astype(np.float16), "k": rng.randn(1, 16, 12, 32).astype(np.float16),
                 "v": rng.randn(1, 12, 16, 32).astype(np.float16), "mask": np.zeros((1, 1, 1, 16), np.float16)}
        ex = gr.Executor(m, "cpu")
        with gr.torch.no_grad():
            _, env = ex.eager(feeds)
            ex.fold_constants(env)
            got = ex.compiled(None)(*[env[n] for n in ex.input_names])[0]
        np.testing.assert_allclose(gr.to_numpy(got).astype(np.float32), gr.to_numpy(env["y"]).astype(np.float32),
                                   rtol=1e-2, atol=1e-2)

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

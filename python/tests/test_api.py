"""The Python API against the CLI and against bad input (scripts/test.sh runs this with the
wheel built and installed into the test venv)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import mixprec

ROOT = Path(__file__).resolve().parents[2]
RANGE = "[1,2]"


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gen_models.py"),
            "--out",
            str(out),
            "--only",
            "needs_constraints,planted_square,qdq_cnn,mlp",
            "--no-ort",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def mixprec_command() -> List[str]:
    """The package's own `mixprec` entry point (the CLI run in process)."""
    exe = shutil.which("mixprec", path=str(Path(sys.executable).parent))
    assert exe, "the wheel installs a `mixprec` command beside the interpreter"
    return [exe]


def comparable(result: Dict[str, Any]) -> Dict[str, Any]:
    """A result file without what differs between two runs of the same search: times and
    the model's path."""
    r = json.loads(json.dumps(result))
    r.pop("model", None)
    for k in ("wall_seconds", "fp32_inference_seconds"):
        r["stats"].pop(k, None)
    return r


def cli_result(tmp_path: Path, args: List[str]) -> Dict[str, Any]:
    out = tmp_path / "cli.json"
    p = subprocess.run(
        mixprec_command() + ["debug", "precision", *args, "--save-result", str(out)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["minimal", "bisect", "worst-first"])
def test_the_cli_and_python_give_the_same_answer(models: Path, tmp_path: Path, mode: str) -> None:
    model = models / "needs_constraints.onnx"
    cli = cli_result(
        tmp_path, [str(model), "--fp16", "--val-range", RANGE, "--mode", mode, "--atol", "1e-2"]
    )
    py = mixprec.debug_precision(
        model, precision="float16", val_range=RANGE, mode=mode, atol=1e-2, progress=False
    )
    assert comparable(py.to_dict()) == comparable(cli)
    assert py.layers == [layer["name"] for layer in cli["layers"]]
    assert py.outcome == "found"
    assert py.evaluations == cli["stats"]["evaluations"] > 0


def test_the_qdq_search_is_the_same_in_python(models: Path, tmp_path: Path) -> None:
    model = models / "qdq_cnn.onnx"
    args = ["--val-range", "[-1,1]", "--check-error-stat", "median", "--atol", "1e-3"]
    cli = cli_result(tmp_path, [str(model), *args])
    py = mixprec.debug_precision(
        model,
        precision=None,
        val_range="[-1,1]",
        check_error_stat="median",
        atol=1e-3,
        mode="bisect",
        progress=False,
    )
    assert comparable(py.to_dict()) == comparable(cli)
    assert "qdq" in py.to_dict()


def test_a_criterion_judges_every_candidate(models: Path) -> None:
    model = models / "needs_constraints.onnx"
    calls: List[int] = []

    def close(outputs: List[Dict[str, np.ndarray]], golden: List[Dict[str, np.ndarray]]) -> bool:
        calls.append(len(outputs))
        assert len(outputs) == len(golden) == 2
        assert all(isinstance(v, np.ndarray) for o in outputs for v in o.values())
        return all(
            np.allclose(o[k], g[k], rtol=1e-2, atol=1e-2) for o, g in zip(outputs, golden) for k in g
        )

    r = mixprec.debug_precision(
        model, precision="float16", val_range=RANGE, iterations=2, criterion=close, progress=False
    )
    assert r.outcome == "found" and r.layers
    # Every evaluation (and every sensitivity ranking run) called it.
    assert len(calls) >= r.evaluations
    assert all(t["summary"].startswith("criterion ") for t in r.history)

    everything = mixprec.debug_precision(
        model, precision="float16", val_range=RANGE, criterion=lambda o, g: True, progress=False
    )
    assert everything.outcome == "nothing-needed" and everything.layers == []
    # numpy booleans are booleans.
    numpy_bool = mixprec.debug_precision(
        model,
        precision="float16",
        val_range=RANGE,
        criterion=lambda o, g: np.all(np.isfinite(o[0]["output"])),
        progress=False,
    )
    assert numpy_bool.outcome in ("found", "nothing-needed")


def test_a_criterion_error_reaches_the_caller_as_itself(models: Path) -> None:
    def broken(outputs: Any, golden: Any) -> bool:
        raise ZeroDivisionError("my metric divided by zero")

    with pytest.raises(ZeroDivisionError, match="my metric") as info:
        mixprec.debug_precision(
            models / "needs_constraints.onnx", precision="float16", criterion=broken, progress=False
        )
    if sys.version_info >= (3, 11):
        assert any("criterion" in n for n in info.value.__notes__)


def test_a_criterion_returning_a_non_bool_is_a_type_error(models: Path) -> None:
    with pytest.raises(TypeError, match="not a bool"):
        mixprec.debug_precision(
            models / "needs_constraints.onnx",
            precision="float16",
            criterion=lambda o, g: "yes",
            progress=False,
        )


def test_inputs_and_golden_in_every_form(models: Path) -> None:
    model = models / "needs_constraints.onnx"
    rng = np.random.default_rng(3)
    sets = [{"x": rng.uniform(1, 2, (1, 1, 256, 256)).astype(np.float32)} for _ in range(2)]
    golden = mixprec.run(model, sets)
    assert len(golden) == 2 and golden[0]["output"].dtype == np.float32
    base = mixprec.debug_precision(model, precision="float16", inputs=sets, progress=False)
    forms = [
        iter(sets),  # a generator
        lambda: sets,  # a callable
        tuple(sets),
    ]
    for form in forms:
        r = mixprec.debug_precision(model, precision="float16", inputs=form, progress=False)
        assert comparable(r.to_dict()) == comparable(base.to_dict())
    # Golden outputs given in memory equal the default (the FP32 run of the same inputs).
    r = mixprec.debug_precision(
        model, precision="float16", inputs=sets, golden=golden, progress=False
    )
    assert r.layers == base.layers
    # One dict is one input set.
    one = mixprec.run(model, sets[0])
    np.testing.assert_array_equal(one[0]["output"], golden[0]["output"])


def test_an_exception_in_a_data_loader_reaches_the_caller(models: Path) -> None:
    def loader():
        yield {"x": np.ones((1, 1, 256, 256), np.float32)}
        raise RuntimeError("the data loader failed")

    with pytest.raises(RuntimeError, match="the data loader failed"):
        mixprec.debug_precision(models / "needs_constraints.onnx", inputs=loader(), progress=False)


def test_bad_input_gets_the_usual_exceptions(models: Path, tmp_path: Path) -> None:
    model = models / "needs_constraints.onnx"
    with pytest.raises(FileNotFoundError):
        mixprec.debug_precision(tmp_path / "missing.onnx", progress=False)
    with pytest.raises(FileNotFoundError):
        mixprec.run(model, tmp_path / "missing.json")
    with pytest.raises(ValueError, match="'y'"):
        mixprec.run(model, {"y": np.ones((1, 1, 256, 256), np.float32)})
    with pytest.raises(ValueError, match="'x'"):
        mixprec.run(model, {"x": np.ones((1, 1, 256, 256), np.int64)})
    with pytest.raises(ValueError, match="mode"):
        mixprec.debug_precision(model, mode="sideways", progress=False)
    with pytest.raises(ValueError, match="--atol"):
        mixprec.debug_precision(model, atol="tight", progress=False)
    with pytest.raises(ValueError, match="precision"):
        mixprec.debug_precision(model, precision="float12", progress=False)
    with pytest.raises(TypeError):
        mixprec.debug_precision(12345, progress=False)  # type: ignore[arg-type]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.onnx"):
        mixprec.run(bad)


def test_export_save_and_report(models: Path, tmp_path: Path) -> None:
    model = models / "needs_constraints.onnx"
    r = mixprec.debug_precision(model, precision="float16", val_range=RANGE, progress=False)
    exported = tmp_path / "mixed.onnx"
    proto = r.export(exported)
    assert exported.exists() and proto is not None
    # Written with the usual permissions (not mkstemp's private ones).
    umask = os.umask(0)
    os.umask(umask)
    assert exported.stat().st_mode & 0o777 == 0o666 & ~umask
    # The exported model is typed: its Casts keep the answer's layers in float32, and it runs
    # (in FP32 mode it computes what the search's answer emulates).
    assert any(n.op_type == "Cast" for n in proto.graph.node)
    inputs = {"x": np.full((1, 1, 256, 256), 1.5, np.float32)}
    assert np.isfinite(mixprec.run(exported, inputs)[0]["output"]).all()
    # Bytes and ModelProto models work as paths do.
    assert mixprec.run(exported.read_bytes(), inputs)[0]["output"].shape == (1, 1, 256, 256)
    assert mixprec.run(proto, inputs)[0]["output"].shape == (1, 1, 256, 256)
    r.save(tmp_path / "result.json")
    assert json.loads((tmp_path / "result.json").read_text())["outcome"]["kind"] == "found"
    r.report(tmp_path / "report.html")
    assert "<html" in (tmp_path / "report.html").read_text().lower()
    assert "<html" in r._repr_html_().lower()
    assert set(r.reasons) <= set(r.layers)


def test_run_in_reduced_precision_and_mark_all(models: Path) -> None:
    model = models / "needs_constraints.onnx"
    inputs = {"x": np.full((1, 1, 256, 256), 1.5, np.float32)}
    fp32 = mixprec.run(model, inputs)[0]["output"]
    fp16 = mixprec.run(model, inputs, precision="float16")[0]["output"]
    # The planted loss: x + 65504 rounds to 65504 in float16, so x is lost.
    assert np.allclose(fp32, 1.5) and np.allclose(fp16, 0.0)
    fixed = mixprec.run(
        model, inputs, precision="float16", layer_precisions={"Add": "float32", "Sub": "float32"}
    )[0]["output"]
    np.testing.assert_allclose(fixed, fp32, rtol=1e-3)
    everything = mixprec.run(model, inputs, mark_all=True)[0]
    assert list(everything)[0] == "output" and len(everything) > 1


def test_progress_goes_to_a_callable(models: Path) -> None:
    seen: List[Dict[str, Any]] = []
    r = mixprec.debug_precision(
        models / "needs_constraints.onnx", precision="float16", val_range=RANGE, progress=seen.append
    )
    assert [t["iteration"] for t in seen] == [t["iteration"] for t in r.history]
    assert {"phase", "marked", "passed", "error", "summary"} <= set(seen[0])


def test_an_exception_in_a_progress_callback_stops_the_search(models: Path) -> None:
    def broken(t: Dict[str, Any]) -> None:
        raise ValueError("the progress display broke")

    with pytest.raises(ValueError, match="progress display broke"):
        mixprec.debug_precision(
            models / "needs_constraints.onnx", precision="float16", progress=broken
        )


def test_ctrl_c_stops_the_search_with_the_best_plan_so_far(models: Path) -> None:
    def interrupt_after_first(t: Dict[str, Any]) -> None:
        if t["iteration"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as info:
        mixprec.debug_precision(
            models / "needs_constraints.onnx",
            precision="float16",
            val_range=RANGE,
            mode="linear",
            progress=interrupt_after_first,
        )
    result = info.value.result  # type: ignore[attr-defined]
    assert result.outcome == "interrupted"
    assert len(result.history) == 3


def test_the_entry_point_is_the_cli() -> None:
    p = subprocess.run(mixprec_command() + ["--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("mixprec ")
    p = subprocess.run(
        mixprec_command() + ["inspect", "/nonexistent.onnx"], capture_output=True, text=True
    )
    assert p.returncode == 1 and "nonexistent.onnx" in p.stderr


def test_convert_writes_what_run_emulates(models: Path, tmp_path: Path) -> None:
    model = models / "needs_constraints.onnx"
    out = tmp_path / "fp16.onnx"
    proto = mixprec.convert(model, out, precision="float16", layer_precisions={"Add": "float32"})
    assert out.exists() and any(n.op_type == "Cast" for n in proto.graph.node)
    cli = tmp_path / "cli.onnx"
    p = subprocess.run(
        mixprec_command()
        + ["convert", str(model), "--fp16", "--layer-precisions", "Add:float32", "-o", str(cli)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert cli.read_bytes() == out.read_bytes()
    with pytest.raises(ValueError, match="nothing to convert"):
        mixprec.convert(model)


def test_calibrate_returns_the_ranges_and_writes_the_cache(models: Path, tmp_path: Path) -> None:
    model = models / "needs_constraints.onnx"
    cache = tmp_path / "model.cache"
    amax = mixprec.calibrate(model, val_range=RANGE, algo="minmax", cache=cache)
    assert amax["x"] == pytest.approx(2.0, rel=1e-3)
    assert cache.read_text().startswith("TRT-")
    cli = tmp_path / "cli.cache"
    p = subprocess.run(
        mixprec_command()
        + ["calibrate", str(model), "--val-range", RANGE, "--algo", "minmax", "--cache", str(cli)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert cli.read_text() == cache.read_text()
    with pytest.raises(ValueError, match="--percentile"):
        mixprec.calibrate(model, algo="minmax", percentile=99.0)


def test_quantize_writes_what_the_cli_writes(models: Path, tmp_path: Path) -> None:
    model = models / "mlp.onnx"
    data = [{"x": np.random.default_rng(k).uniform(-2, 2, (4, 64)).astype(np.float32)} for k in range(4)]
    out = tmp_path / "int8.onnx"
    proto = mixprec.quantize(model, out, scheme="int8", inputs=data, exclude_nodes=["Gemm_2$"])
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "DequantizeLinear" in ops
    npz = tmp_path / "calib.json"
    # The CLI on the same data (saved as Polygraphy JSON by `mixprec run`) writes the same bytes.
    p = subprocess.run(
        mixprec_command() + ["run", str(model), "--val-range", "[-2,2]", "--iterations", "1",
                             "--save-inputs", str(npz)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stderr
    saved = json.loads(npz.read_text())
    assert isinstance(saved, list)
    cli = tmp_path / "cli.onnx"
    ours = tmp_path / "ours.onnx"
    mixprec.quantize(model, ours, scheme="int8", inputs=str(npz), exclude_nodes=["Gemm_2$"])
    p = subprocess.run(
        mixprec_command()
        + ["quantize", str(model), "--int8", "--data", str(npz), "--exclude-nodes", "Gemm_2$",
           "-o", str(cli)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stderr
    assert cli.read_bytes() == ours.read_bytes()
    weights = mixprec.quantize(model, scheme="int4_weights", block_size=32)
    assert any(n.op_type == "DequantizeLinear" for n in weights.graph.node)
    with pytest.raises(ValueError, match="scheme"):
        mixprec.quantize(model, scheme="int3")
    with pytest.raises(ValueError, match="calibration data"):
        mixprec.quantize(model, scheme="int8")
    with pytest.raises(ValueError, match="already"):
        mixprec.quantize(models / "qdq_cnn.onnx", scheme="int8", val_range="[-1,1]")


def test_compare_gives_the_comparators_verdicts(models: Path) -> None:
    model = models / "needs_constraints.onnx"
    inputs = {"x": np.full((1, 1, 256, 256), 1.5, np.float32)}
    fp32 = mixprec.run(model, inputs)
    fp16 = mixprec.run(model, inputs, precision="float16")
    same = mixprec.compare(fp32, fp32)
    assert same[0]["output"]["passed"] and same[0]["output"]["required_atol"] == 0
    lost = mixprec.compare(fp16, fp32, check_error_stat="median", atol=1e-3, metrics=["cosine:0.99"])
    row = lost[0]["output"]
    assert not row["passed"] and row["stat"] == "median"
    assert row["required_atol"] == pytest.approx(1.5)
    assert row["metrics"][0]["passed"] in (True, False)
    with pytest.raises(ValueError, match="missing"):
        mixprec.compare({"other": fp32[0]["output"]}, fp32[0])


def tiny_decoder(path: Path) -> None:
    """A decoder in ONNX Runtime GenAI's names whose next token depends on the whole context
    through its one-layer KV cache (the Rust unit tests' `tiny_decoder`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    E = np.array([[0.3, -1.0], [1.2, 0.4], [-0.7, 0.9], [0.1, 0.1], [-1.1, -0.6]], np.float32)
    W = np.array([[1.0, -0.5, 0.2, 0.8, -1.3], [0.4, 1.1, -0.9, -0.2, 0.6]], np.float32)
    u = np.array([0.0, 0.05, -0.07, 0.11, 0.02], np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["e"]),
        helper.make_node("Unsqueeze", ["e", "one"], ["k"]),
        helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "k"], ["present.0.value"], axis=2),
        helper.make_node("ReduceSum", ["present.0.key", "two"], ["ctx"]),
        helper.make_node("Squeeze", ["ctx", "one"], ["ctx2"]),
        helper.make_node("Add", ["e", "ctx2"], ["h"]),
        helper.make_node("MatMul", ["h", "W"], ["mm"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["maskf", "one"], ["msum"]),
        helper.make_node("Unsqueeze", ["msum", "two"], ["m3"]),
        helper.make_node("Mul", ["m3", "u"], ["mu"]),
        helper.make_node("Add", ["mm", "mu"], ["logits"]),
    ]
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    graph = helper.make_graph(
        nodes,
        "tiny_decoder",
        [
            helper.make_tensor_value_info("input_ids", i64, ["b", "s"]),
            helper.make_tensor_value_info("attention_mask", i64, ["b", "t"]),
            helper.make_tensor_value_info("past_key_values.0.key", f, ["b", 1, "p", 2]),
            helper.make_tensor_value_info("past_key_values.0.value", f, ["b", 1, "p", 2]),
        ],
        [
            helper.make_tensor_value_info("logits", f, ["b", "s", 5]),
            helper.make_tensor_value_info("present.0.key", f, ["b", 1, "t", 2]),
            helper.make_tensor_value_info("present.0.value", f, ["b", 1, "t", 2]),
        ],
        [
            numpy_helper.from_array(E, "E"),
            numpy_helper.from_array(W, "W"),
            numpy_helper.from_array(u, "u"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_run_decode_generates_greedily_through_the_cache(tmp_path: Path) -> None:
    model = tmp_path / "decoder.onnx"
    tiny_decoder(model)
    prompt = np.array([[1, 3, 0]], np.int64)
    # The prompt alone, in memory: --decode adds the mask, the positions and the empty cache.
    (out,) = mixprec.run(model, {"input_ids": prompt}, decode=5)
    # ... or from a file: the same generation.
    np.savez(tmp_path / "prompt.npz", input_ids=prompt)
    (from_file,) = mixprec.run(model, tmp_path / "prompt.npz", decode=5)
    np.testing.assert_array_equal(out["tokens"], from_file["tokens"])
    np.testing.assert_array_equal(out["logits"], from_file["logits"])
    assert out["tokens"].shape == (1, 5) and out["tokens"].dtype == np.int64
    assert out["logits"].shape == (1, 5, 5)
    # The same greedy generation without a cache, in numpy: the whole sequence each step.
    import onnx
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model)).graph.initializer}
    seq = list(prompt[0])
    for step in range(5):
        e = init["E"][seq]
        h = e[-1] + e.sum(axis=0)
        logits = h @ init["W"] + len(seq) * init["u"]
        np.testing.assert_allclose(out["logits"][0, step], logits, rtol=1e-6, atol=1e-6)
        seq.append(int(np.argmax(logits)))
    assert list(out["tokens"][0]) == seq[3:]
    with pytest.raises(ValueError, match="no input 'input_ids'"):
        mixprec.run(ROOT / "examples" / "mlp.onnx", None, decode=2)
    # A completed prompt is still checked against the model's inputs.
    with pytest.raises(ValueError, match="token ids must be integers"):
        mixprec.run(model, {"input_ids": prompt.astype(np.float32)}, decode=2)
    with pytest.raises(ValueError, match="'bogus'.*no such input"):
        mixprec.run(model, {"input_ids": prompt, "bogus": prompt}, decode=2)


def test_debug_precision_decode_judges_generated_tokens(tmp_path: Path) -> None:
    model = tmp_path / "decoder.onnx"
    tiny_decoder(model)
    result = mixprec.debug_precision(
        model,
        inputs=[{"input_ids": np.array([[1, 3, 0]], np.int64)}],
        decode=4,
        metrics=["tokens:1.0"],
        progress=False,
    )
    # float16 rounding of these weights does not change a token: nothing needs float32.
    assert result.outcome == "nothing-needed", result.to_dict()


def repeated_blocks(path: Path, blocks: int, overflowing: List[int]) -> None:
    """Blocks named as PyTorch exports them (``/model/layers.{b}/scale/Mul``,
    ``.../unscale/Mul``, ``.../act/Relu``): x in [70, 72] times 1024 passes float16's 65504 in
    the blocks of ``overflowing`` (times 8 elsewhere), so both products of those blocks must
    stay in float32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for b in range(blocks):
        w = 1024.0 if b in overflowing else 8.0
        p, out = f"/model/layers.{b}", "y" if b + 1 == blocks else f"h{b}"
        nodes += [
            helper.make_node("Mul", [prev, f"w{b}"], [f"s{b}"], name=f"{p}/scale/Mul"),
            helper.make_node("Mul", [f"s{b}", f"iw{b}"], [f"u{b}"], name=f"{p}/unscale/Mul"),
            helper.make_node("Relu", [f"u{b}"], [out], name=f"{p}/act/Relu"),
        ]
        inits += [
            numpy_helper.from_array(np.array([w], np.float32), f"w{b}"),
            numpy_helper.from_array(np.array([1.0 / w], np.float32), f"iw{b}"),
        ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "repeated_blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_group_roles_reads_the_answer_as_rules(tmp_path: Path) -> None:
    model = tmp_path / "blocks.onnx"
    repeated_blocks(model, 8, [5, 6, 7])
    args: Dict[str, Any] = dict(val_range={"x": [70, 72]}, atol=0.1, rtol=0.01, progress=False)
    grouped = mixprec.debug_precision(model, group="roles", **args)
    plain = mixprec.debug_precision(model, **args)
    want = [f"/model/layers.{b}/{r}/Mul" for b in (5, 6, 7) for r in ("scale", "unscale")]
    assert grouped.layers == want and plain.layers == want
    # Both read the answer as the same two rules; the grouped search ran fewer models
    # (evaluations and ranking runs; it ranks three roles instead of 24 layers).
    assert grouped.groups == plain.groups
    roles = [(g["role"], g["blocks"], g["block_indices"], len(g["layers"])) for g in grouped.groups]
    assert roles == [("scale/Mul", "5–7", [5, 6, 7], 3), ("unscale/Mul", "5–7", [5, 6, 7], 3)]
    assert grouped.groups[0]["layer_precisions"].startswith("re:^/model/layers")
    runs = lambda r: r.to_dict()["stats"]["evaluations"] + r.to_dict()["stats"]["ranking_runs"]
    assert runs(grouped) < runs(plain), (grouped.to_dict()["stats"], plain.to_dict()["stats"])
    with pytest.raises(ValueError, match="group"):
        mixprec.debug_precision(model, group="blocks", **args)


def test_plan_chooses_a_format_per_layer_on_an_evaluated_front(tmp_path: Path) -> None:
    model = ROOT / "examples" / "transformer.onnx"
    result = mixprec.plan(
        model,
        formats="fp8,int8,fp16",
        objective="latency",
        target="h100",
        seed=1,
        iterations=2,
        metrics=["snr:30"],
        atol=1e30,
    )
    front = result.front
    assert front and all(isinstance(p["passed"], bool) for p in front)
    assert result.chosen is not None and front[result.chosen]["passed"]
    # The chosen point is the cheapest that passed.
    passing = [p["cost"] for p in front if p["passed"]]
    assert front[result.chosen]["cost"] == min(passing)
    assert set(result.assignment.values()) <= {"fp8e4m3", "int8", "float16", "float32"}
    assert len(result.baselines) == 3
    # Each baseline is a front point (a candidate like the walk's).
    for b in result.baselines:
        assert front[b["point"]]["step"] == {"kind": "uniform", "format": b["format"]}
    # The same front as the CLI's --save-result.
    saved = tmp_path / "plan.json"
    code = mixprec._native.main(
        ["mixprec", "plan", str(model), "--formats", "fp8,int8,fp16", "--seed", "1",
         "--iterations", "2", "--metric", "snr:30", "--atol", "1e30",
         "--save-result", str(saved)]
    )
    assert code == 0
    # The CLI run in process left this process's signals alone: a write to a closed pipe
    # is still an error here, not a SIGPIPE that kills the interpreter.
    if hasattr(signal, "SIGPIPE"):
        assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    cli = json.loads(saved.read_text())
    assert [p["passed"] for p in cli["front"]] == [p["passed"] for p in front]
    assert cli["chosen"] == result.chosen
    out = tmp_path / "planned.onnx"
    result.export(out)
    assert out.stat().st_size > 0
    result.report(tmp_path / "plan.html")
    assert "<svg" in (tmp_path / "plan.html").read_text()
    with pytest.raises(ValueError, match="fp4"):
        mixprec.plan(model, formats=["fp4"])
    # A check command judges the chosen point and its neighbours: one that passes everything
    # keeps the choice; one that passes nothing leaves none.
    kw: Dict[str, Any] = dict(formats="fp8,int8,fp16", seed=1, iterations=2, metrics=["snr:30"], atol=1e30)
    agreed = mixprec.plan(model, check="sh -c 'exit 0'", **kw)
    assert agreed.chosen == result.chosen
    assert agreed.front[agreed.chosen]["check"]["passed"] is True
    assert sum(p["check"] is not None for p in agreed.front) >= 2
    # golden= and criterion= as in debug_precision: a criterion that passes everything
    # chooses the cheapest point; its exception reaches the caller as itself.
    golden = mixprec.run(model, seed=1, iterations=2)
    lenient = mixprec.plan(model, golden=golden, criterion=lambda o, g: True, **kw)
    costs = [p["cost"] for p in lenient.front]
    assert lenient.chosen is not None and costs[lenient.chosen] == min(costs)

    def broken(o: Any, g: Any) -> bool:
        raise ZeroDivisionError("my metric")

    with pytest.raises(ZeroDivisionError, match="my metric"):
        mixprec.plan(model, criterion=broken, **kw)
    refused = mixprec.plan(model, check=["sh", "-c", "exit 3"], **kw)
    assert refused.chosen is None and refused.assignment == {}
    assert all(p["check"] is None or p["check"]["passed"] is False for p in refused.front)


def test_plan_decode_judges_every_point_on_generated_tokens(tmp_path: Path) -> None:
    model = tmp_path / "decoder.onnx"
    tiny_decoder(model)
    seen: List[Any] = []

    def same_tokens(outputs: List[Dict[str, np.ndarray]], golden: List[Dict[str, np.ndarray]]) -> bool:
        seen.append(outputs[0]["tokens"].shape)
        return bool(np.array_equal(outputs[0]["tokens"], golden[0]["tokens"]))

    result = mixprec.plan(
        model,
        inputs=[{"input_ids": np.array([[1, 3, 0]], np.int64)}],
        decode=4,
        formats="int8,fp16",
        criterion=same_tokens,
    )
    # Every evaluation generated 4 tokens and was judged on them.
    assert seen and all(s == (1, 4) for s in seen)
    assert len(seen) >= len(result.front)
    assert result.chosen is not None and result.front[result.chosen]["passed"]
    # Under TensorRT's fusion every step runs with the regions derived from the prompt's
    # shapes (one engine for the optimization profile); the front is still judged on tokens.
    seen.clear()
    fused = mixprec.plan(
        model,
        inputs=[{"input_ids": np.array([[1, 3, 0]], np.int64)}],
        decode=4,
        formats="int8,fp16",
        criterion=same_tokens,
        fusion="tensorrt",
    )
    assert seen and all(s == (1, 4) for s in seen)
    assert fused.fusion == "tensorrt"
    assert fused.chosen is not None and fused.front[fused.chosen]["passed"]


def test_plan_fusion_tensorrt_emulates_every_point_under_tensorrt_fusion(tmp_path: Path) -> None:
    # The seed's MatMul -> Add(65504) -> Sub: in float16 the Add overflows unless the three
    # run as one kernel (TensorRT's GEMM epilogue), whose sum stays in f32.
    model = ROOT / "examples" / "needs_constraints.onnx"
    kw: Dict[str, Any] = dict(
        formats="fp16", val_range="x:[1,2]", check_error_stat="median", atol=1e-2, rtol=1e-2
    )
    plain = mixprec.plan(model, **kw)
    fused = mixprec.plan(model, fusion="tensorrt", **kw)
    assert plain.fusion == "none" and plain.fusion_regions == []
    assert fused.fusion == "tensorrt"
    assert not plain.front[0]["passed"] and fused.front[0]["passed"]
    assert plain.assignment["MatMul"] == "float32"
    assert set(fused.assignment.values()) == {"float16"}
    assert [r["nodes"] for r in fused.fusion_regions] == [["MatMul", "Add", "Sub"]]
    assert fused.baselines[0]["passed"] and not plain.baselines[0]["passed"]
    # The CLI's --fusion gives the same front.
    saved = tmp_path / "plan.json"
    code = mixprec._native.main(
        ["mixprec", "plan", str(model), "--formats", "fp16", "--val-range", "x:[1,2]",
         "--check-error-stat", "median", "--atol", "1e-2", "--rtol", "1e-2",
         "--fusion", "tensorrt", "--save-result", str(saved)]
    )
    assert code == 0
    cli = json.loads(saved.read_text())
    assert cli["fusion"] == "tensorrt"
    assert [p["passed"] for p in cli["front"]] == [p["passed"] for p in fused.front]
    assert cli["chosen"] == fused.chosen
    with pytest.raises(ValueError, match="--fusion 'xla'"):
        mixprec.plan(model, fusion="xla", **kw)
    with pytest.raises(ValueError, match="no effect with --check"):
        mixprec.plan(model, fusion="tensorrt", check="sh -c 'exit 0'", **kw)


def test_plan_cost_prices_a_written_model_as_plan_modeled_it(tmp_path: Path) -> None:
    model = ROOT / "examples" / "transformer.onnx"
    result = mixprec.plan(
        model,
        formats="fp8,int8,fp16",
        seed=1,
        iterations=2,
        metrics=["snr:30"],
        atol=1e30,
        full_front=True,
    )
    assert result.chosen is not None
    mixed = tmp_path / "mixed.onnx"
    result.export(mixed)
    cost = mixprec.plan_cost(model, mixed, target="h100", seed=1)
    chosen = result.front[result.chosen]
    # The written model costs what the walk modeled for its point.
    assert cost["unit"] == "us" and cost["target"] == "h100"
    assert cost["cost"] == pytest.approx(chosen["cost"], rel=1e-12)
    assert cost["costs"]["bytes"] == pytest.approx(chosen["costs"]["bytes"], rel=1e-12)
    assert cost["layers"] == chosen["layers"]
    assert sum(cost["formats"].values()) == len(chosen["layers"])
    # The float model itself is the safest point of the front.
    safest = mixprec.plan_cost(model, model, objective="bytes", seed=1)
    assert set(safest["formats"]) == {"float32"}
    assert safest["cost"] == pytest.approx(result.front[-1]["costs"]["bytes"], rel=1e-12)
    # A mixed model of another network: the first layer it lacks is named.
    with pytest.raises(ValueError, match="no node named"):
        mixprec.plan_cost(model, ROOT / "examples" / "mlp.onnx")
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        mixprec.plan_cost(model, tmp_path / "missing.onnx")


def test_a_check_function_sees_each_candidates_layers_and_model(models: Path, tmp_path: Path) -> None:
    seen: List[Any] = []

    def check(candidate: Any) -> bool:
        path = candidate.export(tmp_path / f"candidate{candidate.iteration}.onnx")
        assert isinstance(path, Path) and path.read_bytes() == candidate.model_bytes()
        seen.append((candidate.iteration, candidate.marked, candidate.layer_precisions))
        assert repr(candidate).startswith(f"Candidate(iteration={candidate.iteration}, ")
        return len(candidate.marked) >= 1

    r = mixprec.debug_precision(
        models / "qdq_cnn.onnx", precision=None, mode="bisect", val_range="[-1,1]",
        progress=False, check=check,
    )
    assert r.outcome == "found" and len(r.layers) == 1
    assert [s[0] for s in seen] == list(range(1, r.evaluations + 1))
    # A Q/DQ search's candidates: the marked layers leave quantization, the rest stay int8.
    for _, marked, precisions in seen:
        assert set(marked) <= set(precisions)
        assert all(p == ("float32" if n in marked else "int8") for n, p in precisions.items())
    assert any(not m for _, m, _ in seen) and any(m for _, m, _ in seen)
    with pytest.raises(FileNotFoundError):
        mixprec.debug_precision(
            models / "qdq_cnn.onnx", precision=None, mode="bisect", val_range="[-1,1]",
            progress=False, check=lambda c: bool(c.export(tmp_path / "missing" / "m.onnx")),
        )


def test_runtime_names_the_cpu_and_the_kernels_it_runs() -> None:
    info = mixprec.runtime()
    assert set(info) == {"cpu", "float_kernels", "integer_kernels", "rounding_kernels", "summary"}
    assert info["float_kernels"].split(" ")[0] in {"avx512", "avx2+fma", "scalar"}
    assert info["integer_kernels"] in {"avx512-vnni", "avx-vnni", "avx2", "portable"}
    assert info["rounding_kernels"].split(" ")[0] in {"avx512", "f16c", "scalar"}
    assert info["cpu"] and info["float_kernels"] in info["summary"]
    if sys.platform == "linux" and "avx512f" in Path("/proc/cpuinfo").read_text():
        assert info["float_kernels"].startswith("avx512"), info

"""Reference data for mixprec's 8- and 4-bit element types (tests/integration/dtypes.rs).

Writes into --out:

* conversions/: `inputs.f32` (every float16 value, specials, the midpoints between
  neighbouring float8/float4 values and their f32 neighbours, random f32 bit patterns) and,
  per type, what ml_dtypes (the ONNX reference implementation's element types) makes of
  them: `<type>.sat.u8` (onnx.numpy_helper.saturate_cast, Cast's default), `<type>.nosat.u8`
  (plain astype, Cast with saturate=0), `<type>.decode.f32` (every code as float32). For
  int4/uint4, `<type>.cast.u8` holds astype() of the finite inputs below 2^24 in magnitude
  (`int4_inputs.f32`).
* qdq_<case>/: a QuantizeLinear -> DequantizeLinear model (blocked int4, blocked float4e2m1,
  per-axis float8e4m3fn with saturate=0, per-tensor float8e4m3fn and float8e5m2) with `test_data_set_0/`
  input and outputs computed by onnx.reference.ReferenceEvaluator, plus `ort.txt` saying
  whether ONNX Runtime ran the model and agreed with the reference.
* dq_<case>/: a lone blocked DequantizeLinear over an int4 / float4e2m1 graph input (odd
  element count, so the packed data has a padding nibble) and the reference output.
"""

import argparse
import os

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

FLOATS = {
    "float8e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8e5m2": ml_dtypes.float8_e5m2,
    "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float4e2m1": ml_dtypes.float4_e2m1fn,
}
INTS = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}


def conversions(out):
    os.makedirs(out, exist_ok=True)
    parts = [
        np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32),
        np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, -1e-30], np.float32),
    ]
    for t in FLOATS.values():
        codes = np.arange(256 if np.dtype(t).itemsize == 1 and t is not ml_dtypes.float4_e2m1fn else 16, dtype=np.uint8)
        vals = codes.view(t).astype(np.float32)
        vals = np.unique(vals[np.isfinite(vals)])
        mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
        parts += [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
        top = vals.max()
        parts.append(np.array([top * 1.0625, top * 1.07, top * 1.2, -top * 1.0625, -top * 1.07], np.float32))
    rng = np.random.default_rng(0)
    parts.append(rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32))
    xs = np.concatenate(parts).astype(np.float32)
    xs.tofile(os.path.join(out, "inputs.f32"))
    for name, t in FLOATS.items():
        numpy_helper.saturate_cast(xs, t).view(np.uint8).tofile(os.path.join(out, f"{name}.sat.u8"))
        xs.astype(t).view(np.uint8).tofile(os.path.join(out, f"{name}.nosat.u8"))
        n = 16 if t is ml_dtypes.float4_e2m1fn else 256
        np.arange(n, dtype=np.uint8).view(t).astype(np.float32).tofile(os.path.join(out, f"{name}.decode.f32"))
    ints = xs[np.isfinite(xs) & (np.abs(xs) < 2**24)]
    ints.tofile(os.path.join(out, "int4_inputs.f32"))
    for name, t in INTS.items():
        (ints.astype(t).astype(np.int8).view(np.uint8) & 0xF).tofile(os.path.join(out, f"{name}.cast.u8"))


def save_case(out, model, feeds):
    os.makedirs(os.path.join(out, "test_data_set_0"), exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "model.onnx"))
    ref = ReferenceEvaluator(model).run(None, feeds)
    names = [i.name for i in model.graph.input]
    for i, name in enumerate(names):
        t = feeds[name]
        elem = model.graph.input[i].type.tensor_type.elem_type
        p = helper.make_tensor(name, elem, t.shape, vals=t, raw=True) if elem in (21, 22, 23) else numpy_helper.from_array(t, name)
        with open(os.path.join(out, "test_data_set_0", f"input_{i}.pb"), "wb") as f:
            f.write(p.SerializeToString())
    for i, (o, r) in enumerate(zip(model.graph.output, ref)):
        elem = o.type.tensor_type.elem_type
        if elem in (21, 22, 23):
            p = helper.make_tensor(o.name, elem, r.shape, vals=r, raw=True)
        elif elem in (17, 18, 19, 20):
            p = helper.make_tensor(o.name, elem, r.shape, vals=r.view(np.uint8).tobytes(), raw=True)
        else:
            p = numpy_helper.from_array(r, o.name)
        with open(os.path.join(out, "test_data_set_0", f"output_{i}.pb"), "wb") as f:
            f.write(p.SerializeToString())
    # ONNX Runtime, where it runs the model: does it agree with the reference? Its Python API
    # cannot pass 4-bit or most float8 arrays, so it runs a variant whose low-bit inputs are
    # initializers and whose outputs are the float ones.
    try:
        import onnxruntime as ort

        v = onnx.ModelProto()
        v.CopyFrom(model)
        keep = [i for i, o in enumerate(v.graph.output) if o.type.tensor_type.elem_type == TensorProto.FLOAT]
        outs = [v.graph.output[i] for i in keep]
        del v.graph.output[:]
        v.graph.output.extend(outs)
        ort_feeds = {}
        for i, inp in enumerate(list(v.graph.input)):
            if inp.type.tensor_type.elem_type in (17, 18, 19, 20, 21, 22, 23):
                with open(os.path.join(out, "test_data_set_0", f"input_{i}.pb"), "rb") as f:
                    t = TensorProto()
                    t.ParseFromString(f.read())
                v.graph.initializer.append(t)
                v.graph.input.remove(inp)
            else:
                ort_feeds[inp.name] = feeds[inp.name]
        s = ort.InferenceSession(v.SerializeToString(), providers=["CPUExecutionProvider"])
        got = s.run(None, ort_feeds)
        ok = all(np.array_equal(g, ref[i], equal_nan=True) for g, i in zip(got, keep))
        status = "agrees" if ok else "differs"
    except Exception as e:  # noqa: BLE001 - any failure means "ORT cannot run it"
        status = "cannot run: " + str(e).splitlines()[0][:200]
    with open(os.path.join(out, "ort.txt"), "w") as f:
        f.write(status + "\n")


def qdq(out, name, qtype, opset, x, scale, zp, **attrs):
    nodes_in = ["x", "scale"] + (["zp"] if zp is not None else [])
    inits = [numpy_helper.from_array(scale, "scale")]
    if zp is not None:
        inits.append(helper.make_tensor("zp", qtype, zp.shape, vals=zp, raw=True) if qtype in (21, 22, 23)
                     else helper.make_tensor("zp", qtype, zp.shape, vals=zp.view(np.uint8).tobytes(), raw=True))
    q_attrs = dict(attrs)
    if zp is None:
        q_attrs["output_dtype"] = qtype
    dq_attrs = {k: v for k, v in attrs.items() if k != "saturate"}
    g = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", nodes_in, ["q"], **q_attrs),
            helper.make_node("DequantizeLinear", ["q"] + nodes_in[1:], ["y"], **dq_attrs),
        ],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("q", qtype, x.shape), helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    save_case(os.path.join(out, f"qdq_{name}"), m, {"x": x})


def dq(out, name, qtype, opset, x, scale, axis, block_size):
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "scale"], ["y"], axis=axis, block_size=block_size)],
        name,
        [helper.make_tensor_value_info("x", qtype, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        initializer=[numpy_helper.from_array(scale, "scale")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    save_case(os.path.join(out, f"dq_{name}"), m, {"x": x})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    conversions(os.path.join(out, "conversions"))
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 7)) * 6).astype(np.float32)
    x[0, 0] = 1000.0  # saturates (int4: 7; fp4: 6; fp8 with saturate=0: NaN/inf)
    x[1, 1] = -1000.0
    x[2, 2] = 2.5  # a rounding tie for scale 1
    # Blocked along axis 1, block 3: 7 columns -> 3 blocks, the last of one column.
    bscale = (np.abs(rng.standard_normal((4, 3))) + 0.5).astype(np.float32)
    bscale[2, 0] = 1.0
    qdq(out, "int4_blocked", TensorProto.INT4, 21, x, bscale,
        rng.integers(-2, 3, size=(4, 3)).astype(ml_dtypes.int4), axis=1, block_size=3)
    qdq(out, "uint4_blocked", TensorProto.UINT4, 21, x, bscale,
        rng.integers(6, 10, size=(4, 3)).astype(ml_dtypes.uint4), axis=1, block_size=3)
    qdq(out, "float4e2m1_blocked", TensorProto.FLOAT4E2M1, 23, x, bscale, None, axis=1, block_size=3)
    ascale = np.array([0.01, 0.02, 0.5, 1.0], np.float32)  # per axis 0: row 0 overflows 448
    qdq(out, "float8e4m3fn_axis_nosat", TensorProto.FLOAT8E4M3FN, 21, x, ascale,
        np.zeros(4, ml_dtypes.float8_e4m3fn), axis=0, saturate=0)
    qdq(out, "float8e4m3fn_tensor", TensorProto.FLOAT8E4M3FN, 19, x, np.array(0.05, np.float32),
        np.array(0, ml_dtypes.float8_e4m3fn))
    qdq(out, "float8e5m2_tensor", TensorProto.FLOAT8E5M2, 19, x, np.array(0.001, np.float32),
        np.array(0, ml_dtypes.float8_e5m2))
    # Lone blocked DequantizeLinear over packed 4-bit inputs with an odd element count (15).
    xi = rng.integers(-8, 8, size=(3, 5)).astype(ml_dtypes.int4)
    dq(out, "int4_blocked_axis0", TensorProto.INT4, 21, xi,
       (np.abs(rng.standard_normal((2, 5))) + 0.1).astype(np.float32), axis=0, block_size=2)
    xf = rng.integers(0, 16, size=(3, 5)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    dq(out, "float4e2m1_blocked_axis1", TensorProto.FLOAT4E2M1, 23, xf,
       (np.abs(rng.standard_normal((3, 3))) + 0.1).astype(np.float32), axis=1, block_size=2)


if __name__ == "__main__":
    main()

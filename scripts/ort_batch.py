#!/usr/bin/env python3
"""Runs many ONNX models in ONNX Runtime (CPU) in one process.

Usage: ort_batch.py MANIFEST

MANIFEST has one case per line: `MODEL<TAB>INPUT_DIR<TAB>OUT_DIR`. For each case the script
reads INPUT_DIR/input_K.pb (TensorProto files, in the model's input order), runs the model with
one intra-op thread and writes OUT_DIR/output_K.pb (in the model's output order), or
OUT_DIR/error.txt with the first line of ONNX Runtime's error when it cannot load or run the
model. OUT_DIR/done is written last, so a caller can tell which case a crash (a signal, not an
exception) happened in and start again after it. Consecutive cases of one model share a session.

A model whose metadata names `ort_shared_buffers` (`input:output` pairs) runs with those
outputs bound to their inputs' buffers (IOBinding), as kernels that update a cache in place need.

Used by tests/integration/nanprop.rs (NaN/inf/signed-zero/subnormal propagation vs ORT).
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


# Element types ORT hands back as raw uint8/uint16 arrays: written with their declared type.
RAW_TYPES = {
    "tensor(float8e4m3fn)": onnx.TensorProto.FLOAT8E4M3FN,
    "tensor(float8e4m3fnuz)": onnx.TensorProto.FLOAT8E4M3FNUZ,
    "tensor(float8e5m2)": onnx.TensorProto.FLOAT8E5M2,
    "tensor(float8e5m2fnuz)": onnx.TensorProto.FLOAT8E5M2FNUZ,
    "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
}


def to_proto(meta, v):
    v = np.asarray(v)
    code = RAW_TYPES.get(meta.type)
    if code is not None and v.dtype in (np.uint8, np.uint16):
        t = onnx.TensorProto()
        t.name = meta.name
        t.data_type = code
        t.dims.extend(v.shape)
        t.raw_data = np.ascontiguousarray(v).tobytes()
        return t
    return numpy_helper.from_array(v, meta.name)


SHARED_BUFFERS = "ort_shared_buffers"


def run(sess, feeds):
    """Runs the session; a model whose metadata has `ort_shared_buffers` ("in:out,in:out")
    runs with each named output bound to its input's buffer, which ONNX Runtime then updates
    in place (SparseAttention's CPU kernel insists that present_key/value share past's
    buffer, as ONNX Runtime GenAI binds them)."""
    pairs = sess.get_modelmeta().custom_metadata_map.get(SHARED_BUFFERS)
    if not pairs:
        return sess.run(None, feeds)
    shared = dict(reversed(p.split(":")) for p in pairs.split(","))
    binding = sess.io_binding()
    # The arrays stay referenced until the run ends: OrtValues do not own numpy's memory.
    arrays = {k: np.ascontiguousarray(v).copy() for k, v in feeds.items()}
    values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()}
    for k, v in values.items():
        binding.bind_ortvalue_input(k, v)
    for meta in sess.get_outputs():
        if meta.name in shared:
            binding.bind_ortvalue_output(meta.name, values[shared[meta.name]])
        else:
            binding.bind_output(meta.name)
    sess.run_with_iobinding(binding)
    # Copies: an output bound to an input's buffer views `arrays`, freed on return.
    return [np.array(v.numpy(), copy=True) for v in binding.get_outputs()]


def main():

    ort.set_default_logger_severity(4)
    with open(sys.argv[1]) as f:
        cases = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    last_model, sess, err = None, None, None
    for model, inputs, out in cases:
        os.makedirs(out, exist_ok=True)
        if model != last_model:
            last_model, sess, err = model, None, None
            try:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1
                opts.inter_op_num_threads = 1
                opts.log_severity_level = 4
                sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 - ORT raises several types
                err = f"load: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        try:
            if sess is None:
                raise RuntimeError(err)
            feeds = {}
            for k, meta in enumerate(sess.get_inputs()):
                path = os.path.join(inputs, f"input_{k}.pb")
                if not os.path.exists(path):
                    continue  # an optional input the test leaves out
                t = onnx.TensorProto()
                with open(path, "rb") as fh:
                    t.ParseFromString(fh.read())
                feeds[meta.name] = numpy_helper.to_array(t)
            with np.errstate(all="ignore"):
                outs = run(sess, feeds)
            for k, (meta, v) in enumerate(zip(sess.get_outputs(), outs)):
                with open(os.path.join(out, f"output_{k}.pb"), "wb") as fh:
                    fh.write(to_proto(meta, v).SerializeToString())
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            with open(os.path.join(out, "error.txt"), "w") as fh:
                fh.write(msg + "\n")
        with open(os.path.join(out, "done"), "w") as fh:
            fh.write("")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs an ONNX model natively with PyTorch (on a CUDA GPU, or the CPU) and saves its outputs as
Polygraphy JSON, the format `mixprec run --save-outputs/--load-outputs` reads and writes.

It is the referee of mixprec's emulation (docs/fidelity.md): `mixprec convert --fp16` writes a
model whose Casts and initializer types say the precision of every layer; this script runs each
ONNX node as the matching torch op in exactly the dtype the graph gives it (no autocast, TF32 off,
no reduced-precision reductions in cuBLAS), either

  eager    one kernel per op, every intermediate rounded to its ONNX dtype (an unfused engine), or
  compile  the same graph under torch.compile (Inductor fuses pointwise chains, reductions and
           normalizations into kernels that keep their intermediates in f32, as TensorRT does).

It is a small executor of its own rather than onnx2torch, which fails on weights reached through
Cast nodes, GlobalMaxPool, and data-dependent Reshape under torch.compile: every value that
depends only on initializers and tensor shapes (Shape -> Gather -> Concat -> Reshape chains) is
folded to a constant after a first eager run, so torch.compile sees static shapes.

Usage:
  gpu_reference.py MODEL.onnx --load-inputs inputs.json --save-outputs out.json
                   [--mode eager|compile] [--device cuda|cpu] [--runner-name NAME]
                   [--mark-all] [--iterations N] [--isolate LAYERS.json [--isolate-f64]]
                   [--no-cudnn] [--fp16-reduced-reduction]

  --load-inputs    Polygraphy inputs JSON: a list of feed dicts (`mixprec run --save-inputs`)
  --mark-all       save every node's outputs too (topological order), for layer-wise comparison
  --mark NAMES     save these values too (comma-separated, or @FILE with one name a line): a
                   layer-wise comparison of a model too large to save every layer of
  --isolate FILE   per-layer isolation: each node reads its inputs from FILE (a RunResults JSON
                   holding every layer's output, e.g. `mixprec run --fp16 --mark-all
                   --save-outputs`), cast to the dtype the graph gives them, so each saved output
                   is that single op's result on the emulation's own inputs (eager only);
                   with --isolate-f64 each op runs in float64 instead (the exact result)
  --no-cudnn       convolutions through PyTorch's own CUDA kernels instead of cuDNN

Exit status 0 on success; 2 with a message naming the node on an unsupported op or attribute.
"""
import argparse
import base64
import io
import json
import sys
import time

import numpy as np

try:
    import onnx
    from onnx import numpy_helper
except ImportError:  # pragma: no cover - the caller's environment lacks onnx
    onnx = None

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - torch is only on the GPU machine (and optional here)
    torch = None
    F = None


class Unsupported(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Polygraphy JSON
# ---------------------------------------------------------------------------------------------

def _decode_array(obj):
    cls = obj.get("polygraphy_class")
    if cls in ("LazyArray", "LazyNumpyArray"):
        return _decode_array(obj["values"])
    if cls not in ("ndarray", "np.ndarray", "numpy.ndarray"):
        raise ValueError(f"expected an encoded ndarray, found {cls!r}")
    raw = obj["array"]
    try:
        data = base64.b64decode(raw, validate=True)
    except Exception:
        data = raw.encode("latin-1")
    return np.load(io.BytesIO(data), allow_pickle=False)


def _encode_array(arr):
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), "polygraphy_class": "ndarray"}


def load_inputs(path):
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, dict):
        doc = [doc]
    return [{k: _decode_array(v) for k, v in feed.items()} for feed in doc]


def load_run_results(path):
    """{runner: [ {name: array}, ... per iteration ]} from a RunResults JSON."""
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for runner, iters in doc["lst"]:
        out[runner] = [{k: _decode_array(v) for k, v in it["outputs"].items()} for it in iters]
    return out


def save_run_results(path, runner_name, iterations):
    """iterations: list of (ordered [(name, array)], runtime seconds)."""
    its = []
    for outputs, runtime in iterations:
        its.append({
            "outputs": {n: {"values": _encode_array(a), "polygraphy_class": "LazyArray"} for n, a in outputs},
            "runtime": runtime,
            "runner_name": runner_name,
            "polygraphy_class": "IterationResult",
        })
    doc = {"lst": [[runner_name, its]], "polygraphy_class": "RunResults"}
    with open(path, "w") as f:
        json.dump(doc, f)


# ---------------------------------------------------------------------------------------------
# The executor
# ---------------------------------------------------------------------------------------------

ONNX_TO_TORCH = {}
if torch is not None:
    ONNX_TO_TORCH = {
        1: torch.float32, 10: torch.float16, 16: torch.bfloat16, 11: torch.float64,
        6: torch.int32, 7: torch.int64, 9: torch.bool, 3: torch.int8, 2: torch.uint8,
        5: torch.int16, 4: torch.int16,
    }


def tensor_to_torch(t):
    """An ONNX TensorProto as a CPU torch tensor, bfloat16 included (numpy has no bfloat16: its
    bits are read as uint16 and reinterpreted)."""
    if t.data_type == onnx.TensorProto.BFLOAT16:
        if t.HasField("raw_data"):
            bits = np.frombuffer(t.raw_data, dtype="<u2").copy()
        else:
            bits = np.array(t.int32_data, dtype=np.uint32).astype(np.uint16)
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).reshape(tuple(t.dims))
    return torch.from_numpy(np.array(numpy_helper.to_array(t)))


def _attrs(node):
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, onnx.TensorProto):
            v = tensor_to_torch(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        elif not isinstance(v, (int, float, str)):
            raise Unsupported(f"node '{node.name}': attribute '{a.name}' of type {type(v).__name__}")
        out[a.name] = v
    return out


class Node:
    """A plain-Python copy of an ONNX node (torch.compile cannot trace protobuf containers)."""

    __slots__ = ("name", "op_type", "input", "output", "attrs")

    def __init__(self, node):
        self.name = node.name
        self.op_type = node.op_type
        self.input = tuple(node.input)
        self.output = tuple(node.output)
        self.attrs = _attrs(node)


def _norm_axis(a, rank):
    return a + rank if a < 0 else a


def _to_list(v):
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    if isinstance(v, torch.Tensor):
        return [int(x) for x in v.reshape(-1).tolist()]
    return [int(x) for x in np.asarray(v).reshape(-1).tolist()]


class Executor:
    """ONNX graph -> torch ops, one node at a time, in the graph's own dtypes."""

    def __init__(self, model, device, fold=True):
        self.model = model
        self.graph = model.graph
        self.device = torch.device(device)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self.inits = {}
        for t in self.graph.initializer:
            self.inits[t.name] = tensor_to_torch(t).to(self.device)
        self.input_names = [i.name for i in self.graph.input if i.name not in self.inits]
        self.output_names = [o.name for o in self.graph.output]
        for n in self.graph.node:
            if n.domain not in ("", "ai.onnx"):
                raise Unsupported(f"node '{n.name}' ({n.op_type}): domain '{n.domain}' is not supported")
            if not hasattr(self, "op_" + n.op_type):
                raise Unsupported(f"node '{n.name}': op {n.op_type} is not supported by gpu_reference.py")
        self.nodes = [Node(n) for n in self.graph.node]
        self.methods = [getattr(self, "op_" + n.op_type) for n in self.nodes]
        self.fold = fold
        self.conv_once = False
        self.expected_dtypes = self._inferred_dtypes()
        self.static = None  # name -> value, once fold() has run
        self.static_nodes = set()
        self.shapes = {}

    def _inferred_dtypes(self):
        """Every value's element type as ONNX shape inference gives it (the graph's own word on
        each op's precision); values it cannot type are left out."""
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model)
        except Exception:
            inferred = self.model
        g = inferred.graph
        out = {}
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            t = vi.type.tensor_type.elem_type
            if t in ONNX_TO_TORCH:
                out[vi.name] = ONNX_TO_TORCH[t]
        return out

    def check_dtypes(self, env):
        """Every computed value must have the dtype the ONNX graph gives it (no silent promotion
        or autocast): raises naming the first value that does not."""
        for node in self.nodes:
            for name in node.output:
                want = self.expected_dtypes.get(name)
                got = env.get(name)
                if want is not None and isinstance(got, torch.Tensor) and got.dtype != want:
                    raise RuntimeError(f"node '{node.name}' ({node.op_type}): output '{name}' is {got.dtype}, "
                                       f"the ONNX graph says {want}")

    # -- running -------------------------------------------------------------------------------

    def feeds_to_torch(self, feeds):
        env = {}
        for name in self.input_names:
            if name not in feeds:
                raise KeyError(f"input '{name}' missing from the loaded inputs (have {sorted(feeds)})")
            env[name] = torch.from_numpy(np.ascontiguousarray(feeds[name])).to(self.device)
        return env

    def run_nodes(self, env, record=None, skip_static=False, isolate=None, upcast=False):
        """Runs every node on env (name -> tensor); returns env. record: name -> tensor of all
        values (for mark-all); isolate: name -> tensor used instead of computed inputs; upcast
        (with isolate): every floating input widened to float64, so each op is computed exactly
        (to f64) on the same inputs."""
        for idx, node in enumerate(self.nodes):
            if skip_static and idx in self.static_nodes:
                continue
            ins = []
            for name in node.input:
                if name == "":
                    ins.append(None)
                elif isolate is not None and name in isolate and name not in self.inits:
                    ref = env.get(name)
                    val = isolate[name]
                    if ref is not None and isinstance(ref, torch.Tensor):
                        val = val.to(ref.dtype).reshape(ref.shape)
                    ins.append(val)
                elif name in env:
                    ins.append(env[name])
                elif name in self.inits:
                    ins.append(self.inits[name])
                else:
                    raise KeyError(f"node '{node.name}': input '{name}' is not computed before it")
                if upcast and isinstance(ins[-1], torch.Tensor) and ins[-1].is_floating_point():
                    ins[-1] = ins[-1].to(torch.float64)
            try:
                outs = self.methods[idx](node, ins, node.attrs)
            except Unsupported:
                raise
            except Exception as e:
                raise RuntimeError(f"node '{node.name}' ({node.op_type}): {e}") from e
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            for name, val in zip(node.output, outs):
                if name:
                    env[name] = val
                    if record is not None:
                        record.append(name)
        return env

    def eager(self, feeds, mark_all=False, isolate=None, upcast=False):
        env = self.feeds_to_torch(feeds)
        order = [] if mark_all else None
        if upcast:
            # Dtypes and shapes of every value first (the isolated inputs are cast to them).
            env = self.run_nodes(env)
        env = self.run_nodes(env, record=order, isolate=isolate, upcast=upcast)
        if not upcast:
            self.check_dtypes(env)
        for k, v in env.items():
            if isinstance(v, torch.Tensor):
                self.shapes[k] = (tuple(v.shape), v.dtype)
        names = list(self.output_names)
        if mark_all:
            names += [n for n in order if n not in self.output_names]
        return names, env

    def fold_constants(self, env):
        """Marks values computed from initializers and shapes alone as static (after one eager
        run filled env) and stores small integer ones as Python lists."""
        static = set(self.inits)
        self.static = {}
        self.static_nodes = set()
        for idx, node in enumerate(self.nodes):
            ins = [i for i in node.input if i]
            if node.op_type in ("Shape", "Size") or node.op_type == "Constant" or all(i in static for i in ins):
                if node.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"):
                    continue
                self.static_nodes.add(idx)
                for o in node.output:
                    if o:
                        static.add(o)
                        self.static[o] = env[o]
        # Small static tensors (shapes, axes, scales) as Python lists, so that torch.compile
        # never reads a tensor's values while tracing.
        self._const_lists = {k: v.reshape(-1).tolist() for k, v in self.static.items()
                             if isinstance(v, torch.Tensor) and v.numel() <= 64}
        for name, v in self.inits.items():
            if v.numel() <= 64:
                self._const_lists[name] = v.reshape(-1).tolist()

    def compiled(self, mode, backend="inductor"):
        static = self.static
        inits = self.inits

        def fn(*inputs):
            env = dict(static)
            for name, t in zip(self.input_names, inputs):
                env[name] = t
            for k, v in inits.items():
                env.setdefault(k, v)
            self.run_nodes(env, skip_static=True)
            return tuple(env[n] for n in self.output_names)

        no_attention_rewrite()
        # fullgraph: a graph break would silently run part of the model unfused.
        return torch.compile(fn, dynamic=False, fullgraph=True, mode=mode, backend=backend)

    # -- helpers ---------------------------------------------------------------------------------

    def ints(self, v):
        if v is None:
            return None
        return _to_list(v)

    def scalar_like(self, value, ref):
        return torch.tensor(value, dtype=ref.dtype, device=ref.device)

    # -- elementwise -------------------------------------------------------------------------------

    def op_Add(self, n, i, a):
        return i[0] + i[1]

    def op_Sub(self, n, i, a):
        return i[0] - i[1]

    def op_Mul(self, n, i, a):
        return i[0] * i[1]

    def op_Div(self, n, i, a):
        if not i[0].is_floating_point():
            return torch.div(i[0], i[1], rounding_mode="trunc")
        return i[0] / i[1]

    def op_Pow(self, n, i, a):
        y = torch.pow(i[0], i[1].to(i[0].dtype) if i[1].is_floating_point() else i[1])
        return y.to(i[0].dtype)

    def op_Sqrt(self, n, i, a):
        return torch.sqrt(i[0])

    def op_Reciprocal(self, n, i, a):
        return torch.reciprocal(i[0])

    def op_Exp(self, n, i, a):
        return torch.exp(i[0])

    def op_Log(self, n, i, a):
        return torch.log(i[0])

    def op_Abs(self, n, i, a):
        return torch.abs(i[0])

    def op_Neg(self, n, i, a):
        return torch.neg(i[0])

    def op_Erf(self, n, i, a):
        return torch.erf(i[0])

    def op_Tanh(self, n, i, a):
        return torch.tanh(i[0])

    def op_Sigmoid(self, n, i, a):
        return torch.sigmoid(i[0])

    def op_Relu(self, n, i, a):
        return torch.relu(i[0])

    def op_LeakyRelu(self, n, i, a):
        return F.leaky_relu(i[0], a.get("alpha", 0.01))

    def op_HardSigmoid(self, n, i, a):
        x = i[0]
        return torch.clamp(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1).to(x.dtype)

    def op_HardSwish(self, n, i, a):
        return F.hardswish(i[0])

    def op_Clip(self, n, i, a):
        x = i[0]
        lo = i[1] if len(i) > 1 and i[1] is not None else a.get("min")
        hi = i[2] if len(i) > 2 and i[2] is not None else a.get("max")
        if lo is not None:
            x = torch.maximum(x, lo.to(x.dtype) if isinstance(lo, torch.Tensor) else self.scalar_like(lo, x))
        if hi is not None:
            x = torch.minimum(x, hi.to(x.dtype) if isinstance(hi, torch.Tensor) else self.scalar_like(hi, x))
        return x

    def op_Max(self, n, i, a):
        y = i[0]
        for t in i[1:]:
            y = torch.maximum(y, t)
        return y

    def op_Min(self, n, i, a):
        y = i[0]
        for t in i[1:]:
            y = torch.minimum(y, t)
        return y

    def op_Equal(self, n, i, a):
        return i[0] == i[1]

    def op_Less(self, n, i, a):
        return i[0] < i[1]

    def op_LessOrEqual(self, n, i, a):
        return i[0] <= i[1]

    def op_Greater(self, n, i, a):
        return i[0] > i[1]

    def op_GreaterOrEqual(self, n, i, a):
        return i[0] >= i[1]

    def op_And(self, n, i, a):
        return torch.logical_and(i[0], i[1])

    def op_Or(self, n, i, a):
        return torch.logical_or(i[0], i[1])

    def op_Xor(self, n, i, a):
        return torch.logical_xor(i[0], i[1])

    def op_Not(self, n, i, a):
        return torch.logical_not(i[0])

    def op_Where(self, n, i, a):
        return torch.where(i[0], i[1], i[2])

    def op_Cast(self, n, i, a):
        to = ONNX_TO_TORCH[a["to"]]
        if i[0].dtype == torch.float64 and to.is_floating_point:
            return i[0]  # an upcast (isolated, exact) run keeps float64
        return i[0].to(to)

    def op_Identity(self, n, i, a):
        return i[0]

    def op_Constant(self, n, i, a):
        if "value" in a:
            return a["value"].to(self.device)
        for k, dt in (("value_float", torch.float32), ("value_int", torch.int64),
                      ("value_floats", torch.float32), ("value_ints", torch.int64)):
            if k in a:
                return torch.tensor(a[k], dtype=dt, device=self.device)
        raise Unsupported(f"node '{n.name}': Constant without a supported value attribute")

    # -- matrix products and convolutions ----------------------------------------------------------

    def op_MatMul(self, n, i, a):
        return torch.matmul(i[0], i[1])

    def op_Gemm(self, n, i, a):
        x, w = i[0], i[1]
        if a.get("transA", 0):
            x = x.t()
        if a.get("transB", 0):
            w = w.t()
        alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
        c = i[2] if len(i) > 2 else None
        if c is None:
            y = torch.matmul(x, w)
            return y if alpha == 1.0 else y * alpha
        if alpha == 1.0 and beta == 1.0:
            return torch.addmm(c.expand(x.shape[0], w.shape[1]) if c.dim() < 2 else c, x, w)
        return torch.addmm(c.expand(x.shape[0], w.shape[1]) if c.dim() < 2 else c, x, w, beta=beta, alpha=alpha)

    def _pads(self, n, a, rank_sp, x, kernel, strides, dil):
        pads = a.get("pads", [0] * (2 * rank_sp))
        auto = a.get("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0] * (2 * rank_sp)
            for d in range(rank_sp):
                size = x.shape[2 + d]
                out = -(-size // strides[d])
                total = max(0, (out - 1) * strides[d] + (kernel[d] - 1) * dil[d] + 1 - size)
                lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
                pads[d], pads[d + rank_sp] = lo, total - lo
        elif auto == "VALID":
            pads = [0] * (2 * rank_sp)
        return list(pads)

    def _pad_input(self, x, pads, rank_sp, value=0.0):
        """Explicit F.pad when begin/end pads differ; returns (x, symmetric pads)."""
        begin, end = pads[:rank_sp], pads[rank_sp:]
        if begin == end:
            return x, begin
        flat = []
        for d in reversed(range(rank_sp)):
            flat += [begin[d], end[d]]
        return F.pad(x, flat, value=value), [0] * rank_sp

    def _conv_rounded_once(self, fn, x, w, b, **kw):
        """With --conv-rounded-once, a float16/bfloat16 convolution with a bias is computed in
        float32 (its inputs widened exactly, TF32 off) and rounded once, bias included; PyTorch's
        own cuDNN path rounds the convolution to the low type and then adds the bias (a second
        rounding)."""
        if self.conv_once and b is not None and x.dtype in (torch.float16, torch.bfloat16):
            return fn(x.float(), w.float(), b.float(), **kw).to(x.dtype)
        return fn(x, w, b, **kw)

    def op_Conv(self, n, i, a):
        x, w = i[0], i[1]
        b = i[2] if len(i) > 2 else None
        rank_sp = x.dim() - 2
        kernel = a.get("kernel_shape", list(w.shape[2:]))
        strides = a.get("strides", [1] * rank_sp)
        dil = a.get("dilations", [1] * rank_sp)
        pads = self._pads(n, a, rank_sp, x, kernel, strides, dil)
        x, pad = self._pad_input(x, pads, rank_sp)
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank_sp]
        return self._conv_rounded_once(conv, x, w, b, stride=strides, padding=pad, dilation=dil, groups=a.get("group", 1))

    def op_ConvTranspose(self, n, i, a):
        x, w = i[0], i[1]
        b = i[2] if len(i) > 2 else None
        rank_sp = x.dim() - 2
        strides = a.get("strides", [1] * rank_sp)
        dil = a.get("dilations", [1] * rank_sp)
        pads = a.get("pads", [0] * (2 * rank_sp))
        if pads[:rank_sp] != pads[rank_sp:] or "output_shape" in a:
            raise Unsupported(f"node '{n.name}': ConvTranspose with asymmetric pads or output_shape")
        conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[rank_sp]
        return self._conv_rounded_once(conv, x, w, b, stride=strides, padding=pads[:rank_sp],
                                       output_padding=a.get("output_padding", [0] * rank_sp),
                                       groups=a.get("group", 1), dilation=dil)

    # -- normalization ----------------------------------------------------------------------------

    def op_BatchNormalization(self, n, i, a):
        x, scale, bias, mean, var = i[:5]
        if a.get("training_mode", 0):
            raise Unsupported(f"node '{n.name}': BatchNormalization training_mode=1")
        return F.batch_norm(x, mean, var, scale, bias, training=False, eps=a.get("epsilon", 1e-5))

    def op_LayerNormalization(self, n, i, a):
        x, g = i[0], i[1]
        b = i[2] if len(i) > 2 else None
        axis = _norm_axis(a.get("axis", -1), x.dim())
        if len(n.output) > 1 and any(n.output[1:]):
            raise Unsupported(f"node '{n.name}': LayerNormalization Mean/InvStdDev outputs")
        return F.layer_norm(x, list(x.shape[axis:]), g, b, eps=a.get("epsilon", 1e-5))

    def op_InstanceNormalization(self, n, i, a):
        return F.instance_norm(i[0], weight=i[1], bias=i[2], eps=a.get("epsilon", 1e-5))

    def op_Softmax(self, n, i, a):
        x = i[0]
        axis = a.get("axis", -1 if self.opset >= 13 else 1)
        if self.opset < 13 and _norm_axis(axis, x.dim()) != x.dim() - 1:
            raise Unsupported(f"node '{n.name}': opset<13 Softmax over a flattened axis")
        return torch.softmax(x, dim=axis)

    # -- pooling and reductions -------------------------------------------------------------------

    def op_MaxPool(self, n, i, a):
        x = i[0]
        rank_sp = x.dim() - 2
        kernel = a["kernel_shape"]
        strides = a.get("strides", [1] * rank_sp)
        dil = a.get("dilations", [1] * rank_sp)
        if len(n.output) > 1 and n.output[1]:
            raise Unsupported(f"node '{n.name}': MaxPool Indices output")
        pads = self._pads(n, a, rank_sp, x, kernel, strides, dil)
        x, pad = self._pad_input(x, pads, rank_sp, value=float("-inf"))
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank_sp]
        return pool(x, kernel, strides, pad, dil, ceil_mode=bool(a.get("ceil_mode", 0)))

    def op_AveragePool(self, n, i, a):
        x = i[0]
        rank_sp = x.dim() - 2
        kernel = a["kernel_shape"]
        strides = a.get("strides", [1] * rank_sp)
        pads = self._pads(n, a, rank_sp, x, kernel, strides, [1] * rank_sp)
        if pads[:rank_sp] != pads[rank_sp:]:
            raise Unsupported(f"node '{n.name}': AveragePool with asymmetric pads")
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank_sp]
        return pool(x, kernel, strides, pads[:rank_sp], ceil_mode=bool(a.get("ceil_mode", 0)),
                    count_include_pad=bool(a.get("count_include_pad", 0)))

    def op_GlobalAveragePool(self, n, i, a):
        x = i[0]
        return torch.mean(x, dim=tuple(range(2, x.dim())), keepdim=True)

    def op_GlobalMaxPool(self, n, i, a):
        x = i[0]
        return torch.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)

    def _reduce_axes(self, n, i, a, x):
        if self.opset >= 18 or (n.op_type == "ReduceSum" and self.opset >= 13):
            # The axes input through static_ints: under torch.compile a tensor's values cannot be
            # read while tracing (they would be data-dependent symbols, which _norm_axis cannot
            # compare with 0: Magika's ReduceSum/ReduceMax failed so).
            axes = self.ints(self.static_ints(n.input[1], i[1])) if len(i) > 1 and i[1] is not None else None
        else:
            axes = a.get("axes")
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return None
            axes = list(range(x.dim()))
        return [_norm_axis(ax, x.dim()) for ax in axes]

    def _reduce(self, fn, n, i, a):
        x = i[0]
        axes = self._reduce_axes(n, i, a, x)
        if axes is None:
            return x
        return fn(x, dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))

    def op_ReduceMean(self, n, i, a):
        return self._reduce(torch.mean, n, i, a)

    def op_ReduceSum(self, n, i, a):
        return self._reduce(lambda x, dim, keepdim: torch.sum(x, dim=dim, keepdim=keepdim, dtype=x.dtype), n, i, a)

    def op_ReduceMax(self, n, i, a):
        return self._reduce(torch.amax, n, i, a)

    def op_ReduceMin(self, n, i, a):
        return self._reduce(torch.amin, n, i, a)

    # -- shapes -----------------------------------------------------------------------------------

    def op_Shape(self, n, i, a):
        shape = list(i[0].shape)
        start, end = a.get("start", 0), a.get("end", None)
        shape = shape[start:end]
        return torch.tensor(shape, dtype=torch.int64, device=self.device)

    def op_Size(self, n, i, a):
        return torch.tensor(i[0].numel(), dtype=torch.int64, device=self.device)

    def op_Reshape(self, n, i, a):
        x = i[0]
        shape = self.ints(self.static_ints(n.input[1], i[1]))
        shape = [x.shape[k] if (s == 0 and not a.get("allowzero", 0)) else s for k, s in enumerate(shape)]
        return torch.reshape(x, shape)

    def static_ints(self, name, val):
        lists = getattr(self, "_const_lists", None)
        if lists is not None and name in lists:
            return lists[name]
        return val

    def op_Flatten(self, n, i, a):
        x = i[0]
        axis = _norm_axis(a.get("axis", 1), x.dim())
        lead = 1
        for d in x.shape[:axis]:
            lead *= d
        return torch.reshape(x, (lead, -1))

    def op_Transpose(self, n, i, a):
        x = i[0]
        perm = a.get("perm", list(reversed(range(x.dim()))))
        return x.permute(*perm)

    def op_Squeeze(self, n, i, a):
        x = i[0]
        axes = self.ints(self.static_ints(n.input[1], i[1])) if len(i) > 1 and i[1] is not None else a.get("axes")
        if axes is None:
            return torch.squeeze(x)
        for ax in sorted((_norm_axis(v, x.dim()) for v in axes), reverse=True):
            x = x.squeeze(ax)
        return x

    def op_Unsqueeze(self, n, i, a):
        x = i[0]
        axes = self.ints(self.static_ints(n.input[1], i[1])) if len(i) > 1 else a["axes"]
        rank = x.dim() + len(axes)
        for ax in sorted(_norm_axis(v, rank) for v in axes):
            x = x.unsqueeze(ax)
        return x

    def op_Concat(self, n, i, a):
        return torch.cat([t for t in i if t is not None], dim=a["axis"])

    def op_Split(self, n, i, a):
        x = i[0]
        axis = _norm_axis(a.get("axis", 0), x.dim())
        if len(i) > 1 and i[1] is not None:
            sizes = self.ints(self.static_ints(n.input[1], i[1]))
        elif "split" in a:
            sizes = list(a["split"])
        else:
            k = len(n.output)
            total = x.shape[axis]
            each = -(-total // k)
            sizes = [each] * (k - 1) + [total - each * (k - 1)]
        return list(torch.split(x, sizes, dim=axis))

    def op_Slice(self, n, i, a):
        x = i[0]
        starts = self.ints(self.static_ints(n.input[1], i[1]))
        ends = self.ints(self.static_ints(n.input[2], i[2]))
        axes = self.ints(self.static_ints(n.input[3], i[3])) if len(i) > 3 and i[3] is not None else list(range(len(starts)))
        steps = self.ints(self.static_ints(n.input[4], i[4])) if len(i) > 4 and i[4] is not None else [1] * len(starts)
        idx = [slice(None)] * x.dim()
        for s, e, ax, st in zip(starts, ends, axes, steps):
            ax = _norm_axis(ax, x.dim())
            size = x.shape[ax]
            if st < 0:
                raise Unsupported(f"node '{n.name}': Slice with a negative step")
            s = max(0, min(size, s + size if s < 0 else s))
            e = max(0, min(size, e + size if e < 0 else e))
            idx[ax] = slice(s, e, st)
        return x[tuple(idx)]

    def op_Gather(self, n, i, a):
        x, ind = i[0], i[1]
        axis = _norm_axis(a.get("axis", 0), x.dim())
        ind = torch.where(ind < 0, ind + x.shape[axis], ind)
        if ind.dim() == 0:
            return torch.index_select(x, axis, ind.reshape(1)).squeeze(axis)
        flat = torch.index_select(x, axis, ind.reshape(-1))
        return flat.reshape(list(x.shape[:axis]) + list(ind.shape) + list(x.shape[axis + 1:]))

    def op_Expand(self, n, i, a):
        x = i[0]
        shape = self.ints(self.static_ints(n.input[1], i[1]))
        out = list(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))
        return x.expand(out)

    def op_Tile(self, n, i, a):
        return i[0].repeat(*self.ints(self.static_ints(n.input[1], i[1])))

    def op_ConstantOfShape(self, n, i, a):
        shape = self.ints(self.static_ints(n.input[0], i[0]))
        if "value" in a:
            v = a["value"].reshape(-1)
            return torch.full(shape, v[0].item(), dtype=v.dtype, device=self.device)
        return torch.zeros(shape, dtype=torch.float32, device=self.device)

    def op_Range(self, n, i, a):
        s, e, d = (t.item() for t in i)
        return torch.arange(s, e, d, dtype=i[0].dtype, device=self.device)

    def op_Resize(self, n, i, a):
        x = i[0]
        mode = a.get("mode", "nearest")
        ctm = a.get("coordinate_transformation_mode", "half_pixel")
        sizes = i[3] if len(i) > 3 and i[3] is not None and i[3].numel() else None
        scales = i[2] if len(i) > 2 and i[2] is not None and i[2].numel() else None
        if "axes" in a:
            raise Unsupported(f"node '{n.name}': Resize with axes")
        if sizes is not None:
            full = self.ints(self.static_ints(n.input[3], sizes))
            if full[:2] != list(x.shape[:2]):
                raise Unsupported(f"node '{n.name}': Resize of the batch or channel axis")
            kw = {"size": full[2:]}
        else:
            sc = self.static_ints(n.input[2], scales)
            sc = [float(v) for v in (sc if isinstance(sc, list) else sc.reshape(-1).tolist())]
            if sc[:2] != [1.0, 1.0]:
                raise Unsupported(f"node '{n.name}': Resize of the batch or channel axis")
            kw = {"size": [int(np.floor(x.shape[2 + k] * s)) for k, s in enumerate(sc[2:])]}
        if mode == "nearest":
            nm = a.get("nearest_mode", "round_prefer_floor")
            if ctm == "asymmetric" and nm == "floor":
                return F.interpolate(x, mode="nearest", **kw)
            # Integer upsampling factors give the same result under every rounding mode used by
            # exporters (half_pixel + round_prefer_floor with factor 2 picks floor(i / 2)).
            if all(kw["size"][k] % x.shape[2 + k] == 0 for k in range(len(kw["size"]))):
                return F.interpolate(x, mode="nearest", **kw)
            raise Unsupported(f"node '{n.name}': Resize nearest with {ctm}/{nm} and a non-integer factor")
        if mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            m = {1: "linear", 2: "bilinear", 3: "trilinear"}[x.dim() - 2]
            return F.interpolate(x, mode=m, align_corners=(ctm == "align_corners"), **kw)
        if (mode == "cubic" and x.dim() == 4 and ctm in ("half_pixel", "pytorch_half_pixel", "align_corners")
                and a.get("cubic_coeff_a", -0.75) == -0.75 and not a.get("exclude_outside", 0)):
            # PyTorch's bicubic is Keys' kernel with A = -0.75 and the border samples repeated
            # (indices clamped), which is ONNX's cubic with cubic_coeff_a = -0.75 and
            # exclude_outside = 0; half_pixel is align_corners=False (ViT's position embeddings).
            return F.interpolate(x, mode="bicubic", align_corners=(ctm == "align_corners"), **kw)
        raise Unsupported(f"node '{n.name}': Resize mode {mode} / {ctm}")


# ---------------------------------------------------------------------------------------------

def no_attention_rewrite():
    """Turns off Inductor's scaled-dot-product-attention rewrite (fx_passes/fuse_attention.py,
    torch 2.11) before the first compile. Its patterns match `softmax(q @ k.transpose(-2, -1) ...)
    @ v` without checking the permutation, so on an export whose attention transposes K with
    perm (0, 2, 3, 1) (MiniLM: [1, 16, 12, 32] -> [1, 12, 32, 16]) it takes K's pre-permute
    tensor as the key and fails ("Attempting to broadcast a dimension of length 16"), or would
    compute another function where the shapes happen to agree. Without it Inductor runs
    attention as the graph says: two cuBLAS GEMMs with a fused scale/mask/softmax kernel between
    them (scores and probabilities rounded to the graph's dtype between the kernels)."""
    try:
        from torch._inductor.fx_passes import fuse_attention
    except ImportError:  # another torch: nothing to turn off
        return
    if hasattr(fuse_attention, "_sfdp_init"):
        fuse_attention._sfdp_init = lambda *args, **kwargs: None


def set_numerics(reduced_reduction):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = reduced_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced_reduction
    torch.set_float32_matmul_precision("highest")


def to_numpy(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16: widen exactly to float32 (the values are unchanged).
        t = t.to(torch.float32)
    return t.cpu().numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--load-inputs", required=True)
    ap.add_argument("--save-outputs", required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: Inductor's default)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--runner-name", default=None)
    ap.add_argument("--mark-all", action="store_true")
    ap.add_argument("--mark", default=None, metavar="NAMES",
                    help="values to save besides the outputs: comma-separated, or @FILE (one a line)")
    ap.add_argument("--iterations", type=int, default=None, help="use only the first N input sets")
    ap.add_argument("--isolate", default=None)
    ap.add_argument("--isolate-f64", action="store_true",
                    help="with --isolate: compute each op in float64 on the isolated inputs (the exact result)")
    ap.add_argument("--list-kernels", default=None, metavar="FILE",
                    help="profile the last run and write the names of the CUDA kernels it launched, with counts, to FILE")
    ap.add_argument("--conv-rounded-once", action="store_true",
                    help="float16 Conv/ConvTranspose with a bias in float32, rounded once (PyTorch rounds the "
                         "convolution, then adds the bias: two roundings)")
    ap.add_argument("--no-cudnn", action="store_true",
                    help="torch.backends.cudnn.enabled = False (convolutions through PyTorch's own kernels)")
    ap.add_argument("--fp16-reduced-reduction", action="store_true",
                    help="allow cuBLAS reduced-precision (fp16/bf16) split-K reductions (PyTorch's default); off by default")
    args = ap.parse_args(argv)
    if torch is None or onnx is None:
        print("gpu_reference.py needs torch and onnx", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    set_numerics(args.fp16_reduced_reduction)
    if args.no_cudnn:
        torch.backends.cudnn.enabled = False
    model = onnx.load(args.model)
    try:
        ex = Executor(model, device)
        ex.conv_once = args.conv_rounded_once
    except Unsupported as e:
        print(f"gpu_reference.py: {args.model}: {e}", file=sys.stderr)
        return 2
    feeds_list = load_inputs(args.load_inputs)
    if args.iterations is not None:
        feeds_list = feeds_list[:args.iterations]
    marked = []
    if args.mark:
        if args.mode != "eager":
            print("--mark runs eager only", file=sys.stderr)
            return 2
        text = open(args.mark[1:]).read().split("\n") if args.mark.startswith("@") else args.mark.split(",")
        marked = [m.strip() for m in text if m.strip()]
        unknown = sorted(set(marked) - {o for nd in ex.nodes for o in nd.output})
        if unknown:
            print(f"gpu_reference.py: --mark: no node computes {unknown[:5]}", file=sys.stderr)
            return 2
    runner = args.runner_name or f"torch-{args.mode}-{device}"
    isolate = None
    if args.isolate:
        if args.mode != "eager":
            print("--isolate runs eager only", file=sys.stderr)
            return 2
        res = load_run_results(args.isolate)
        isolate = list(res.values())[0]
    results = []
    compiled = None
    compiled_shapes = None
    prof = None
    if args.list_kernels:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        prof = profile(activities=acts)
        prof.__enter__()
    for it, feeds in enumerate(feeds_list):
        try:
            iso = None
            if isolate is not None:
                iso = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in isolate[it].items()}
            with torch.no_grad():
                if iso is not None:
                    # First a plain run for every value's dtype and shape, then the isolated one.
                    ex.eager(feeds)
                t0 = time.perf_counter()
                names, env = ex.eager(feeds, mark_all=args.mark_all, isolate=iso,
                                      upcast=args.isolate_f64 and iso is not None)
                names = names + [m for m in marked if m not in names]
                if device == "cuda":
                    torch.cuda.synchronize()
                runtime = time.perf_counter() - t0
                if args.mode == "compile":
                    if compiled is None:
                        ex.fold_constants(env)
                        compiled = ex.compiled(args.compile_mode)
                    inputs = [env[nm] for nm in ex.input_names]
                    shapes = [tuple(t.shape) for t in inputs]
                    if compiled_shapes is None:
                        compiled_shapes = shapes
                    elif shapes != compiled_shapes:
                        # The folded constants (shapes, masks) are the first input set's.
                        print(f"gpu_reference.py: input set {it}'s shapes {shapes} differ from the first's "
                              f"{compiled_shapes}: compile mode needs one shape for all input sets", file=sys.stderr)
                        return 2
                    t0 = time.perf_counter()
                    outs = compiled(*inputs)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    runtime = time.perf_counter() - t0
                    env = dict(env)
                    env.update(zip(ex.output_names, outs))
                    ex.check_dtypes({k: env[k] for k in ex.output_names})
                    names = list(ex.output_names)
        except Unsupported as e:
            print(f"gpu_reference.py: {args.model}: {e}", file=sys.stderr)
            return 2
        outputs = [(nm, to_numpy(env[nm])) for nm in names if isinstance(env.get(nm), torch.Tensor)]
        results.append((outputs, runtime))
    if prof is not None:
        prof.__exit__(None, None, None)
        counts = {}
        for ev in prof.events():
            kind = getattr(ev, "device_type", None)
            if device == "cuda" and str(kind).endswith("CUDA"):
                counts[ev.name] = counts.get(ev.name, 0) + 1
            elif device != "cuda" and ev.name.startswith("aten::"):
                counts[ev.name] = counts.get(ev.name, 0) + 1
        with open(args.list_kernels, "w") as f:
            for name, c in sorted(counts.items(), key=lambda kv: -kv[1]):
                f.write(f"{c}\t{name}\n")
    save_run_results(args.save_outputs, runner, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

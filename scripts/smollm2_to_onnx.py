#!/usr/bin/env python3
"""Derives ONNX models from a Llama-architecture GGUF checkpoint (SmolLM2-135M-Instruct, Q4_1).

Usage: smollm2_to_onnx.py MODEL.gguf OUT_DIR
       smollm2_to_onnx.py --random CONFIG.json SEED OUT_DIR

Writes, each in its own folder under OUT_DIR (weights as external data, model.onnx.data, as
ONNX Runtime GenAI's model builder writes them):

- genai-fp32/: ONNX Runtime GenAI's layout for CPU float32, as its model builder
  (onnxruntime_genai/models/builders/base.py, onnxruntime-genai 0.18.0) writes it for a Llama:
  GroupQueryAttention with packed QKV and rotary inside (cos_cache/sin_cache), the KV cache as
  past_key_values.N.{key,value} -> present.N.{key,value}, seqlens_k/total_sequence_length from
  attention_mask, SimplifiedLayerNormalization then SkipSimplifiedLayerNormalization, SiLU as
  Sigmoid*Mul, the tied embedding as Transpose+Gather of lm_head's weight; plus genai_config.json.
- genai-int4/: the same graph with every MatMul weight-only quantized to int4 by ONNX Runtime's
  MatMulNBitsQuantizer with the builder's CPU defaults (block 32, symmetric, accuracy_level 4);
  the embedding stays float32 (the builder quantizes only MatMul by default), so lm_head is a
  MatMulNBits and the Gather reads its own float copy.
- plain/: the same network in standard ONNX ops only, laid out like a Hugging Face/Optimum
  export (input_ids, attention_mask, position_ids, past_key_values.N.* -> logits, present.N.*):
  decomposed RMSNorm (Pow, ReduceMean, Add, Sqrt, Div, Mul), rotate-half rotary embedding,
  grouped-query attention by broadcasting MatMul, an additive float32-min mask built as
  (1 - allowed) * min, SiLU as Sigmoid*Mul.

and OUT_DIR/tokens.json, the GGUF's vocabulary (token strings by id) to name prompt tokens and
read generated ones.

Weights: GGUF's Q4_1 and Q8_0 blocks dequantized to float32 here with numpy (Q4_1: per block of
32, x = d*q + m with 4-bit q; Q8_0: x = d*q with int8 q), and attn_q/attn_k rows un-permuted
(llama.cpp's converter interleaves each head's rotary halves; the GenAI loader undoes it the
same way).

--random: no GGUF; a Llama of CONFIG.json's shape (Hugging Face config.json keys:
hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
vocab_size, max_position_embeddings, rope_theta, rms_norm_eps, bos/eos/pad_token_id,
tie_word_embeddings) with seeded random weights (each tensor normal with std 0.02 from a
generator seeded by SEED and the tensor's name; the norms' weights ones), written as
OUT_DIR/genai-fp32 only (model.onnx, model.onnx.data, genai_config.json). The weights are
generated one tensor at a time and appended to model.onnx.data as the graph is built, so
Python never holds more than a tensor or two (a 1.1B model's 4.4 GB are written with well
under 1 GB of Python memory). bench/llm.sh builds a TinyLlama-1.1B-shaped model this way.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import onnx
from gguf import GGMLQuantizationType, GGUFReader
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10
FLOAT32_MIN = float(np.finfo(np.float32).min)


@dataclass
class Config:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_size: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float
    bos: int
    eos: int
    pad: int


def field(reader: GGUFReader, key: str) -> object:
    f = reader.fields.get(key)
    if f is None:
        raise SystemExit(f"smollm2_to_onnx.py: the GGUF has no '{key}'")
    return f.contents()


def read_config(reader: GGUFReader) -> Config:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"smollm2_to_onnx.py: architecture '{arch}', only 'llama' is converted")
    heads = int(field(reader, "llama.attention.head_count"))  # type: ignore[call-overload]
    hidden = int(field(reader, "llama.embedding_length"))  # type: ignore[call-overload]
    return Config(
        layers=int(field(reader, "llama.block_count")),  # type: ignore[call-overload]
        hidden=hidden,
        intermediate=int(field(reader, "llama.feed_forward_length")),  # type: ignore[call-overload]
        heads=heads,
        kv_heads=int(field(reader, "llama.attention.head_count_kv")),  # type: ignore[call-overload]
        head_size=hidden // heads,
        vocab=int(field(reader, "llama.vocab_size")),  # type: ignore[call-overload]
        context=int(field(reader, "llama.context_length")),  # type: ignore[call-overload]
        rope_theta=float(field(reader, "llama.rope.freq_base")),  # type: ignore[arg-type]
        rms_eps=float(field(reader, "llama.attention.layer_norm_rms_epsilon")),  # type: ignore[arg-type]
        bos=int(field(reader, "tokenizer.ggml.bos_token_id")),  # type: ignore[call-overload]
        eos=int(field(reader, "tokenizer.ggml.eos_token_id")),  # type: ignore[call-overload]
        pad=int(field(reader, "tokenizer.ggml.padding_token_id")),  # type: ignore[call-overload]
    )


def dequantize(kind: GGMLQuantizationType, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A GGUF tensor's blocks as float32 [rows, cols] (rows = GGUF's ne1, cols = ne0)."""
    if kind == GGMLQuantizationType.F32:
        return np.asarray(raw, dtype=np.float32).reshape(rows, cols)
    blocks = raw.reshape(rows, cols // 32, -1)
    if kind == GGMLQuantizationType.Q4_1:
        # block_q4_1: f16 d, f16 m, 16 bytes; byte j holds element j (low nibble) and j+16 (high).
        d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
        m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[..., 4:20]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
        return (d * q + m).reshape(rows, cols)
    if kind == GGMLQuantizationType.Q8_0:
        # block_q8_0: f16 d, 32 int8.
        d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[..., 2:34].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, cols)
    raise SystemExit(f"smollm2_to_onnx.py: GGUF tensor type {kind.name} is not converted (F32, Q4_1, Q8_0 are)")


def read_weights(reader: GGUFReader, cfg: Config) -> dict[str, np.ndarray]:
    """Every tensor as float32 in Hugging Face's orientation ([out, in] for projections)."""
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        ne = [int(n) for n in t.shape]
        cols = ne[0]
        rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        w = dequantize(t.tensor_type, np.asarray(t.data), rows, cols)
        out[t.name] = w.reshape(cols) if len(ne) == 1 else w
    for i in range(cfg.layers):
        for name, n_heads in ((f"blk.{i}.attn_q.weight", cfg.heads), (f"blk.{i}.attn_k.weight", cfg.kv_heads)):
            w = out[name]
            out[name] = w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
    return out


def rope_tables(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of position * inv_freq, [context, head_size/2] (the builder's caches)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_size, 2, dtype=np.int64).astype(np.float32) / cfg.head_size))
    t = np.arange(cfg.context, dtype=np.float32)
    freqs = np.outer(t, inv_freq).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


class Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.names: set[str] = set()

    def init(self, name: str, array: np.ndarray) -> str:
        if name not in self.names:
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
            self.names.add(name)
        return name

    def i64(self, values: list[int]) -> str:
        return self.init(f"/model/constants/INT64/{values}", np.array(values, dtype=np.int64))

    def i64_scalar(self, value: int) -> str:
        return self.init(f"/model/constants/INT64/{value}", np.array(value, dtype=np.int64))

    def f32_scalar(self, value: float) -> str:
        return self.init(f"/model/constants/FLOAT/{value}", np.array(value, dtype=np.float32))

    def node(self, op: str, name: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs: object) -> list[str]:
        outputs = [f"{name}/output_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs

    def node_to(self, op: str, name: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: object) -> None:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))


class StreamingGraph(Graph):
    """A Graph whose initializers of 1 KiB and more go straight to an external-data file (at
    4 KiB-aligned offsets, as references in the TensorProto), so each array can be freed as soon
    as it is written."""

    def __init__(self, data_path: str) -> None:
        super().__init__()
        self.location = os.path.basename(data_path)
        self.file = open(data_path, "wb")
        self.offset = 0

    def init(self, name: str, array: np.ndarray) -> str:
        if name in self.names:
            return name
        array = np.ascontiguousarray(array)
        if array.nbytes < 1024:
            return super().init(name, array)
        pad = -self.offset % 4096
        self.file.write(b"\0" * pad)
        self.offset += pad
        array.tofile(self.file)
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=list(array.shape),
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.location), ("offset", str(self.offset)), ("length", str(array.nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, value
        self.offset += array.nbytes
        self.inits.append(t)
        self.names.add(name)
        return name


class RandomWeights:
    """The GGUF tensor names build_genai reads, generated on access: normal(0, std) float32 in
    Hugging Face's orientation from a generator seeded by (seed, crc32(name)), the norms ones.
    Nothing is kept: a second access regenerates the same values."""

    def __init__(self, cfg: Config, seed: int, tied: bool, std: float = 0.02) -> None:
        self.cfg, self.seed, self.tied, self.std = cfg, seed, tied, std

    def shape(self, name: str) -> tuple[int, ...]:
        c = self.cfg
        if name == "token_embd.weight" or (name == "output.weight" and not self.tied):
            return (c.vocab, c.hidden)
        if name == "output_norm.weight":
            return (c.hidden,)
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or not 0 <= int(parts[1]) < c.layers:
            raise KeyError(name)
        return {
            "attn_norm": (c.hidden,), "ffn_norm": (c.hidden,),
            "attn_q": (c.heads * c.head_size, c.hidden), "attn_k": (c.kv_heads * c.head_size, c.hidden),
            "attn_v": (c.kv_heads * c.head_size, c.hidden), "attn_output": (c.hidden, c.heads * c.head_size),
            "ffn_gate": (c.intermediate, c.hidden), "ffn_up": (c.intermediate, c.hidden),
            "ffn_down": (c.hidden, c.intermediate),
        }[parts[2]]

    def __contains__(self, name: str) -> bool:
        try:
            self.shape(name)
            return True
        except (KeyError, ValueError):
            return False

    def __getitem__(self, name: str) -> np.ndarray:
        shape = self.shape(name)
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(self.std)
        return w


def config_from_json(path: str) -> tuple[Config, bool]:
    """A Hugging Face config.json's Llama shape; the bool: tie_word_embeddings."""
    with open(path) as f:
        j = json.load(f)
    heads = int(j["num_attention_heads"])
    return Config(
        layers=int(j["num_hidden_layers"]), hidden=int(j["hidden_size"]), intermediate=int(j["intermediate_size"]),
        heads=heads, kv_heads=int(j.get("num_key_value_heads", heads)),
        head_size=int(j.get("head_dim", int(j["hidden_size"]) // heads)), vocab=int(j["vocab_size"]),
        context=int(j.get("max_position_embeddings", 2048)), rope_theta=float(j.get("rope_theta", 10000.0)),
        rms_eps=float(j.get("rms_norm_eps", 1e-5)), bos=int(j.get("bos_token_id", 1)),
        eos=int(j.get("eos_token_id", 2)), pad=int(j.get("pad_token_id", 0) or 0),
    ), bool(j.get("tie_word_embeddings", False))


def write_random(config: str, seed: int, out: str) -> None:
    """--random: OUT/genai-fp32 with seeded random weights, streamed to model.onnx.data."""
    cfg, tied = config_from_json(config)
    folder = os.path.join(out, "genai-fp32")
    os.makedirs(folder, exist_ok=True)
    g = StreamingGraph(os.path.join(folder, "model.onnx.data"))
    try:
        model = build_genai(cfg, RandomWeights(cfg, seed, tied), tied_transpose=True, graph=g)  # type: ignore[arg-type]
    finally:
        g.file.close()
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    with open(os.path.join(folder, "genai_config.json"), "w") as f:
        json.dump(genai_config(cfg), f, indent=4)
    params = g.offset // 4
    print(f"smollm2_to_onnx.py --random: {folder}: {cfg.layers} layers, hidden {cfg.hidden}, "
          f"{g.offset / 1e9:.2f} GB of weights (~{params / 1e9:.2f}B parameters)", file=sys.stderr)


def kv_io(cfg: Config) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    past, present = [], []
    for i in range(cfg.layers):
        for kind in ("key", "value"):
            past.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kind}", TensorProto.FLOAT,
                ["batch_size", cfg.kv_heads, "past_sequence_length", cfg.head_size]))
            present.append(helper.make_tensor_value_info(
                f"present.{i}.{kind}", TensorProto.FLOAT,
                ["batch_size", cfg.kv_heads, "total_sequence_length", cfg.head_size]))
    return past, present


def build_genai(cfg: Config, w: dict[str, np.ndarray], tied_transpose: bool, graph: Graph | None = None) -> onnx.ModelProto:
    """The builder's Llama graph for CPU float32. tied_transpose: the embedding is a Transpose of
    lm_head's weight (float32 builds); else its own initializer (int4 builds). graph: where the
    initializers go (a StreamingGraph writes them out as they come)."""
    g = graph if graph is not None else Graph()
    embed = w["token_embd.weight"]  # [vocab, hidden]
    untied = "output.weight" in w  # a separate lm_head (as TinyLlama): the embedding is its own initializer
    lm_head_w = g.init("lm_head.MatMul.weight", (w["output.weight"] if untied else embed).T)
    if tied_transpose and not untied:
        table = g.node("Transpose", "/model/embed_tokens/Transpose", [lm_head_w], perm=[1, 0])[0]
    else:
        table = g.init("model.embed_tokens.weight", embed)
    x = g.node("Gather", "/model/embed_tokens/Gather", [table, "input_ids"])[0]

    # attention_mask -> seqlens_k (int32 [batch]) and total_sequence_length (int32 scalar).
    base = "/model/attn_mask_reformat/attn_mask_subgraph"
    rs = g.node("ReduceSum", f"{base}/ReduceSum", ["attention_mask", g.i64([1])], keepdims=0)[0]
    sub = g.node("Sub", f"{base}/Sub", [rs, g.i64([1])])[0]
    seqlens_k = g.node("Cast", f"{base}/Sub/Cast", [sub], to=TensorProto.INT32)[0]
    shape = g.node("Shape", f"{base}/Shape", ["attention_mask"])[0]
    gath = g.node("Gather", f"{base}/Gather", [shape, g.i64_scalar(1)], axis=0)[0]
    total_len = g.node("Cast", f"{base}/Gather/Cast", [gath], to=TensorProto.INT32)[0]

    cos, sin = rope_tables(cfg)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)

    residual = x
    pending: str | None = None  # the sublayer output the next SkipSimplifiedLayerNormalization adds
    for i in range(cfg.layers):
        p = f"/model/layers.{i}"
        ln_w = g.init(f"model.layers.{i}.input_layernorm.weight", w[f"blk.{i}.attn_norm.weight"])
        if pending is None:
            h = g.node("SimplifiedLayerNormalization", f"{p}/input_layernorm/LayerNorm", [residual, ln_w],
                       axis=-1, epsilon=cfg.rms_eps, stash_type=1)[0]
        else:
            out0, out3 = f"{p}/input_layernorm/output_0", f"{p}/input_layernorm/output_3"
            g.node_to("SkipSimplifiedLayerNormalization", f"{p}/input_layernorm/SkipLayerNorm",
                      [residual, pending, ln_w], [out0, "", "", out3], domain="com.microsoft", epsilon=cfg.rms_eps)
            h, residual = out0, out3
        qkv_w = np.concatenate([w[f"blk.{i}.attn_q.weight"], w[f"blk.{i}.attn_k.weight"], w[f"blk.{i}.attn_v.weight"]], axis=0)
        qkv = g.node("MatMul", f"{p}/attn/qkv_proj/MatMul", [h, g.init(f"model.layers.{i}.attn.qkv_proj.MatMul.weight", qkv_w.T)])[0]
        attn = f"{p}/attn/GroupQueryAttention/output_0"
        g.node_to("GroupQueryAttention", f"{p}/attn/GroupQueryAttention",
                  [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens_k, total_len,
                   "cos_cache", "sin_cache"],
                  [attn, f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                  num_heads=cfg.heads, kv_num_heads=cfg.kv_heads, scale=float(1.0 / np.sqrt(cfg.head_size)),
                  local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0)
        o = g.node("MatMul", f"{p}/attn/o_proj/MatMul",
                   [attn, g.init(f"model.layers.{i}.attn.o_proj.MatMul.weight", w[f"blk.{i}.attn_output.weight"].T)])[0]
        post_w = g.init(f"model.layers.{i}.post_attention_layernorm.weight", w[f"blk.{i}.ffn_norm.weight"])
        out0, out3 = f"{p}/post_attention_layernorm/output_0", f"{p}/post_attention_layernorm/output_3"
        g.node_to("SkipSimplifiedLayerNormalization", f"{p}/post_attention_layernorm/SkipLayerNorm",
                  [residual, o, post_w], [out0, "", "", out3], domain="com.microsoft", epsilon=cfg.rms_eps)
        h, residual = out0, out3
        gate = g.node("MatMul", f"{p}/mlp/gate_proj/MatMul",
                      [h, g.init(f"model.layers.{i}.mlp.gate_proj.MatMul.weight", w[f"blk.{i}.ffn_gate.weight"].T)])[0]
        up = g.node("MatMul", f"{p}/mlp/up_proj/MatMul",
                    [h, g.init(f"model.layers.{i}.mlp.up_proj.MatMul.weight", w[f"blk.{i}.ffn_up.weight"].T)])[0]
        sig = g.node("Sigmoid", f"{p}/mlp/act_fn/Sigmoid", [gate])[0]
        act = g.node("Mul", f"{p}/mlp/act_fn/Mul", [gate, sig])[0]
        prod = g.node("Mul", f"{p}/mlp/Mul", [act, up])[0]
        pending = g.node("MatMul", f"{p}/mlp/down_proj/MatMul",
                         [prod, g.init(f"model.layers.{i}.mlp.down_proj.MatMul.weight", w[f"blk.{i}.ffn_down.weight"].T)])[0]

    assert pending is not None
    p = f"/model/layers.{cfg.layers}"
    final_w = g.init(f"model.layers.{cfg.layers}.final_norm_layernorm.weight", w["output_norm.weight"])
    out0 = f"{p}/final_norm_layernorm/output_0"
    g.node_to("SkipSimplifiedLayerNormalization", f"{p}/final_norm_layernorm/SkipLayerNorm",
              [residual, pending, final_w], [out0], domain="com.microsoft", epsilon=cfg.rms_eps)
    g.node_to("MatMul", "/lm_head/MatMul", [out0, lm_head_w], ["logits"])

    past, present = kv_io(cfg)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        *past,
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.vocab]), *present]
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=IR_VERSION, producer_name="mixprec scripts/smollm2_to_onnx.py")


def build_plain(cfg: Config, w: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The same network in standard ONNX ops (an Optimum-style export with a KV cache)."""
    g = Graph()
    embed = g.init("model.embed_tokens.weight", w["token_embd.weight"])
    x = g.node("Gather", "/model/embed_tokens/Gather", [embed, "input_ids"])[0]
    eps = g.f32_scalar(cfg.rms_eps)
    two = g.f32_scalar(2.0)
    one = g.f32_scalar(1.0)
    last_axis = g.i64([-1])

    def rms_norm(name: str, h: str, weight: np.ndarray, wname: str) -> str:
        sq = g.node("Pow", f"{name}/Pow", [h, two])[0]
        mean = g.node("ReduceMean", f"{name}/ReduceMean", [sq, last_axis], keepdims=1)[0]
        var = g.node("Add", f"{name}/Add", [mean, eps])[0]
        rms = g.node("Sqrt", f"{name}/Sqrt", [var])[0]
        normed = g.node("Div", f"{name}/Div", [h, rms])[0]
        return g.node("Mul", f"{name}/Mul", [normed, g.init(wname, weight)])[0]

    # Rotary tables over the full head (cos/sin of [freqs, freqs]), gathered at position_ids:
    # [batch, seq, head] -> [batch, 1, seq, head].
    cos, sin = rope_tables(cfg)
    cos_full = g.init("model.rotary_emb.cos", np.concatenate([cos, cos], axis=-1))
    sin_full = g.init("model.rotary_emb.sin", np.concatenate([sin, sin], axis=-1))
    heads_axis = g.i64([1])
    cos_p = g.node("Unsqueeze", "/model/rotary_emb/cos/Unsqueeze",
                   [g.node("Gather", "/model/rotary_emb/cos/Gather", [cos_full, "position_ids"])[0], heads_axis])[0]
    sin_p = g.node("Unsqueeze", "/model/rotary_emb/sin/Unsqueeze",
                   [g.node("Gather", "/model/rotary_emb/sin/Gather", [sin_full, "position_ids"])[0], heads_axis])[0]

    # Additive mask [batch, 1, 1, seq, total]: key j is visible to the query at position p when
    # j <= p and attention_mask[j] == 1; hidden keys get float32's minimum, as (1 - allowed) * min.
    m = "/model/attn_mask"
    shape = g.node("Shape", f"{m}/Shape", ["attention_mask"])[0]
    total = g.node("Gather", f"{m}/Gather", [shape, g.i64_scalar(1)], axis=0)[0]
    key_pos = g.node("Range", f"{m}/Range", [g.i64_scalar(0), total, g.i64_scalar(1)])[0]
    query_pos = g.node("Unsqueeze", f"{m}/Unsqueeze", ["position_ids", last_axis])[0]  # [b, s, 1]
    causal = g.node("LessOrEqual", f"{m}/LessOrEqual", [key_pos, query_pos])[0]  # [b, s, t]
    keep = g.node("Unsqueeze", f"{m}/Unsqueeze_1",
                  [g.node("Cast", f"{m}/Cast", ["attention_mask"], to=TensorProto.BOOL)[0], heads_axis])[0]  # [b, 1, t]
    allowed = g.node("And", f"{m}/And", [causal, keep])[0]
    allowed_f = g.node("Cast", f"{m}/Cast_1", [allowed], to=TensorProto.FLOAT)[0]
    hidden = g.node("Sub", f"{m}/Sub", [one, allowed_f])[0]
    additive = g.node("Mul", f"{m}/Mul", [hidden, g.f32_scalar(FLOAT32_MIN)])[0]
    mask = g.node("Unsqueeze", f"{m}/Unsqueeze_2", [additive, g.i64([1, 2])])[0]

    half = cfg.head_size // 2
    group = cfg.heads // cfg.kv_heads
    q_shape = g.i64([0, 0, cfg.heads, cfg.head_size])
    kv_shape = g.i64([0, 0, cfg.kv_heads, cfg.head_size])
    grouped = g.i64([0, cfg.kv_heads, group, -1, cfg.head_size])
    ungrouped = g.i64([0, cfg.heads, -1, cfg.head_size])
    merged = g.i64([0, 0, cfg.hidden])
    scale = g.f32_scalar(float(1.0 / np.sqrt(cfg.head_size)))
    s_lo, s_mid, s_hi = g.i64([0]), g.i64([half]), g.i64([cfg.head_size])

    def rotary(name: str, t: str) -> str:
        x1 = g.node("Slice", f"{name}/Slice", [t, s_lo, s_mid, last_axis])[0]
        x2 = g.node("Slice", f"{name}/Slice_1", [t, s_mid, s_hi, last_axis])[0]
        neg = g.node("Neg", f"{name}/Neg", [x2])[0]
        rot = g.node("Concat", f"{name}/Concat", [neg, x1], axis=-1)[0]
        a = g.node("Mul", f"{name}/Mul", [t, cos_p])[0]
        b = g.node("Mul", f"{name}/Mul_1", [rot, sin_p])[0]
        return g.node("Add", f"{name}/Add", [a, b])[0]

    residual = x
    for i in range(cfg.layers):
        p = f"/model/layers.{i}"
        h = rms_norm(f"{p}/input_layernorm", residual, w[f"blk.{i}.attn_norm.weight"], f"model.layers.{i}.input_layernorm.weight")

        def proj(kind: str, gguf: str, inp: str) -> str:
            return g.node("MatMul", f"{p}/self_attn/{kind}/MatMul",
                          [inp, g.init(f"model.layers.{i}.self_attn.{kind}.weight", w[f"blk.{i}.{gguf}.weight"].T)])[0]

        q = proj("q_proj", "attn_q", h)
        k = proj("k_proj", "attn_k", h)
        v = proj("v_proj", "attn_v", h)
        perm = [0, 2, 1, 3]
        q = g.node("Transpose", f"{p}/self_attn/q/Transpose", [g.node("Reshape", f"{p}/self_attn/q/Reshape", [q, q_shape])[0]], perm=perm)[0]
        k = g.node("Transpose", f"{p}/self_attn/k/Transpose", [g.node("Reshape", f"{p}/self_attn/k/Reshape", [k, kv_shape])[0]], perm=perm)[0]
        v = g.node("Transpose", f"{p}/self_attn/v/Transpose", [g.node("Reshape", f"{p}/self_attn/v/Reshape", [v, kv_shape])[0]], perm=perm)[0]
        q = rotary(f"{p}/self_attn/q_rotary", q)
        k = rotary(f"{p}/self_attn/k_rotary", k)
        g.node_to("Concat", f"{p}/self_attn/past_key/Concat", [f"past_key_values.{i}.key", k], [f"present.{i}.key"], axis=2)
        g.node_to("Concat", f"{p}/self_attn/past_value/Concat", [f"past_key_values.{i}.value", v], [f"present.{i}.value"], axis=2)
        # Grouped-query attention: queries [b, kv, group, s, d] against keys [b, kv, 1, t, d].
        qg = g.node("Reshape", f"{p}/self_attn/q/Reshape_1", [q, grouped])[0]
        kg = g.node("Unsqueeze", f"{p}/self_attn/k/Unsqueeze", [f"present.{i}.key", g.i64([2])])[0]
        vg = g.node("Unsqueeze", f"{p}/self_attn/v/Unsqueeze", [f"present.{i}.value", g.i64([2])])[0]
        kt = g.node("Transpose", f"{p}/self_attn/k/Transpose_1", [kg], perm=[0, 1, 2, 4, 3])[0]
        scores = g.node("MatMul", f"{p}/self_attn/MatMul", [qg, kt])[0]
        scores = g.node("Mul", f"{p}/self_attn/Mul", [scores, scale])[0]
        scores = g.node("Add", f"{p}/self_attn/Add", [scores, mask])[0]
        probs = g.node("Softmax", f"{p}/self_attn/Softmax", [scores], axis=-1)[0]
        ctx = g.node("MatMul", f"{p}/self_attn/MatMul_1", [probs, vg])[0]
        ctx = g.node("Reshape", f"{p}/self_attn/Reshape", [ctx, ungrouped])[0]
        ctx = g.node("Transpose", f"{p}/self_attn/Transpose", [ctx], perm=perm)[0]
        ctx = g.node("Reshape", f"{p}/self_attn/Reshape_1", [ctx, merged])[0]
        o = proj("o_proj", "attn_output", ctx)
        residual = g.node("Add", f"{p}/Add", [residual, o])[0]
        h = rms_norm(f"{p}/post_attention_layernorm", residual, w[f"blk.{i}.ffn_norm.weight"], f"model.layers.{i}.post_attention_layernorm.weight")
        gate = g.node("MatMul", f"{p}/mlp/gate_proj/MatMul",
                      [h, g.init(f"model.layers.{i}.mlp.gate_proj.weight", w[f"blk.{i}.ffn_gate.weight"].T)])[0]
        up = g.node("MatMul", f"{p}/mlp/up_proj/MatMul",
                    [h, g.init(f"model.layers.{i}.mlp.up_proj.weight", w[f"blk.{i}.ffn_up.weight"].T)])[0]
        sig = g.node("Sigmoid", f"{p}/mlp/act_fn/Sigmoid", [gate])[0]
        act = g.node("Mul", f"{p}/mlp/act_fn/Mul", [gate, sig])[0]
        prod = g.node("Mul", f"{p}/mlp/Mul", [act, up])[0]
        down = g.node("MatMul", f"{p}/mlp/down_proj/MatMul",
                      [prod, g.init(f"model.layers.{i}.mlp.down_proj.weight", w[f"blk.{i}.ffn_down.weight"].T)])[0]
        residual = g.node("Add", f"{p}/Add_1", [residual, down])[0]

    h = rms_norm("/model/norm", residual, w["output_norm.weight"], "model.norm.weight")
    lm_w = g.node("Transpose", "/lm_head/Transpose", [embed], perm=[1, 0])[0]
    g.node_to("MatMul", "/lm_head/MatMul", [h, lm_w], ["logits"])

    past, present = kv_io(cfg)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        *past,
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.vocab]), *present]
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                             producer_name="mixprec scripts/smollm2_to_onnx.py")


def quantize_int4(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every MatMul with a constant weight to MatMulNBits, as the builder's `to_nbits` pass does
    for CPU int4 (ONNX Runtime's default weight-only quantizer)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # The quantizer logs two INFO lines per node.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4,
                             op_types_to_quantize=("MatMul",))
    q.process()
    return q.model.model


def genai_config(cfg: Config) -> dict[str, object]:
    """genai_config.json as the builder writes it for a CPU Llama (make_genai_config)."""
    return {
        "model": {
            "bos_token_id": cfg.bos,
            "context_length": cfg.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": cfg.head_size,
                "hidden_size": cfg.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": cfg.heads,
                "num_hidden_layers": cfg.layers,
                "num_key_value_heads": cfg.kv_heads,
            },
            "eos_token_id": cfg.eos,
            "pad_token_id": cfg.pad,
            "type": "llama",
            "vocab_size": cfg.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": cfg.context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def save(model: onnx.ModelProto, folder: str, check: bool) -> None:
    """model.onnx + model.onnx.data; check: run the ONNX checker (standard ops only: the GenAI
    graphs use SimplifiedLayerNormalization in the default domain, an ONNX Runtime contrib op
    the checker does not know, exactly as the builder writes it)."""
    os.makedirs(folder, exist_ok=True)
    onnx.save_model(model, os.path.join(folder, "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
    if check:
        onnx.checker.check_model(os.path.join(folder, "model.onnx"), full_check=True)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--random":
        write_random(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    cfg = read_config(reader)
    tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]  # type: ignore[union-attr]
    w = read_weights(reader, cfg)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(tokens, f)

    fp32 = build_genai(cfg, w, tied_transpose=True)
    save(fp32, os.path.join(out, "genai-fp32"), check=False)
    del fp32
    int4 = quantize_int4(build_genai(cfg, w, tied_transpose=False))
    save(int4, os.path.join(out, "genai-int4"), check=False)
    del int4
    for folder in ("genai-fp32", "genai-int4"):
        with open(os.path.join(out, folder, "genai_config.json"), "w") as f:
            json.dump(genai_config(cfg), f, indent=4)
    save(build_plain(cfg, w), os.path.join(out, "plain"), check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

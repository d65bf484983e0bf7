#!/usr/bin/env python3
"""Lists the ONNX ops ONNX Runtime GenAI's model builder can emit, read from its source, and
whether mixprec registers each one.

Usage: genai_builder_ops.py [BUILDER_DIR] [--families]

BUILDER_DIR is the builder's package folder (default: onnxruntime_genai/models of the Python
running this script). The builder cannot be run here (it imports torch and transformers, and
its loaders read Hugging Face checkpoints), so the list comes from the source: every
`self.make_node(OP, ..., domain=...)` call in builders/*.py, OP a string literal, or a variable
whose candidate values are the op names written as string literals in the same function
(`make_layernorm_op`'s LayerNormalization/SkipLayerNormalization..., `make_gelu`'s Gelu/FastGelu).
Op names are checked against the ONNX schemas and ONNX Runtime's contrib schemas of the
installed packages, so only real ops are kept. mixprec's support is read from its Rust source
(src/ops/**/*.rs: `r.add(...)`, `r.add_in(MS_DOMAIN, ...)` registrations), relative to this
script's repository.

With --families, also prints, per model class of the families docs/ops.md covers, the ops
reachable from that class's methods (self.method calls resolved through the class's bases):
an over-approximation — every option's path is included —, which docs/ops.md narrows by hand.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

MS = "com.microsoft"
REPO = Path(__file__).resolve().parent.parent


def known_ops() -> dict[str, set[str]]:
    """Op names per domain ("" and com.microsoft) from ONNX's and ONNX Runtime's schemas."""
    import onnx.defs
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    ops: dict[str, set[str]] = defaultdict(set)
    for s in onnx.defs.get_all_schemas_with_history():
        ops[s.domain].add(s.name)
    for s in ort_c.get_all_operator_schema():
        ops[s.domain].add(s.name)
    return ops


def mixprec_ops() -> dict[str, set[str]]:
    """Ops mixprec registers, per domain, from its Rust source."""
    ops: dict[str, set[str]] = defaultdict(set)
    add_in = re.compile(r'add_in\(\s*MS_DOMAIN,\s*"([A-Za-z0-9]+)"')
    add = re.compile(r'\br\.add\(\s*"([A-Za-z0-9]+)"')
    for path in (REPO / "src" / "ops").rglob("*.rs"):
        text = path.read_text()
        ops[MS].update(add_in.findall(text))
        ops[""].update(add.findall(text))
    return ops


@dataclass
class Function:
    """One builder function: the ops its make_node calls emit and the self.methods it calls."""
    ops: set[tuple[str, str]] = field(default_factory=set)
    calls: set[str] = field(default_factory=set)


def domain_of(call: ast.Call, func_strings: set[str]) -> list[str]:
    """The domains a make_node call may use: "" unless its domain keyword says otherwise."""
    for k in call.keywords:
        if k.arg != "domain":
            continue
        v = k.value
        if isinstance(v, ast.Constant):
            return [v.value or ""]
        # `"com.microsoft" if skip else None`, or a variable: both where the function names
        # the contrib domain.
        return ["", MS] if MS in func_strings or MS in ast.unparse(v) else [""]
    return [""]


def read_functions(tree: ast.AST, known: dict[str, set[str]]) -> dict[str, Function]:
    out: dict[str, Function] = {}
    all_known = known[""] | known[MS]
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        f = Function()
        strings = {c.value for c in ast.walk(fn)
                   if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        for c in ast.walk(fn):
            if not isinstance(c, ast.Call):
                continue
            callee = c.func
            if (isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name)
                    and callee.value.id == "self"):
                f.calls.add(callee.attr)
            if getattr(callee, "attr", None) != "make_node" or not c.args:
                continue
            first = c.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value}
            else:
                names = {s for s in strings if s in all_known}
            for d in domain_of(c, strings):
                for n in names:
                    if n in known[d]:
                        f.ops.add((d, n))
        out[fn.name] = f
    return out


def read_builder(builder: Path, known: dict[str, set[str]]):
    """Per file, its functions; per class, (bases, methods)."""
    funcs: dict[str, Function] = {}
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    classes: dict[str, tuple[list[str], dict[str, Function]]] = {}
    for path in sorted((builder / "builders").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                methods = read_functions(ast.Module(body=node.body, type_ignores=[]), known)
                classes[node.name] = ([ast.unparse(b) for b in node.bases], methods)
        for name, f in read_functions(tree, known).items():
            funcs[f"{path.stem}.{name}"] = f
            for op in f.ops:
                where[op].add(f"{path.stem}.{name}")
    return funcs, where, classes


def reachable(cls: str, classes) -> set[tuple[str, str]]:
    """The ops reachable from `cls`'s methods, self.method resolved through its bases."""
    def resolve(name: str, c: str) -> Function | None:
        while c in classes:
            bases, methods = classes[c]
            if name in methods:
                return methods[name]
            c = bases[0] if bases else ""
        return None

    seen: set[str] = set()
    ops: set[tuple[str, str]] = set()
    todo = ["__init__", "make_model"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        f = resolve(name, cls)
        if f is None:
            continue
        ops |= f.ops
        todo.extend(f.calls)
    return ops


FAMILIES = ["LlamaModel", "MistralModel", "QwenModel", "Qwen3Model", "Qwen25VLTextModel",
            "Qwen3VLTextModel", "Qwen35TextModel", "Qwen35MoETextModel", "PhiModel",
            "Phi3MiniModel", "Phi3MiniLongRoPEModel", "Phi3SmallModel", "Phi3MoELongRoPEModel",
            "Phi3VModel", "Phi4MMModel", "GemmaModel", "Gemma2Model", "Gemma3Model",
            "GPTOSSModel"]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if args:
        builder = Path(args[0])
    else:
        import onnxruntime_genai

        builder = Path(os.path.dirname(onnxruntime_genai.__file__)) / "models"
    known = known_ops()
    mine = mixprec_ops()
    _, where, classes = read_builder(builder, known)
    try:
        from importlib.metadata import version

        v = version("onnxruntime-genai")
    except Exception:  # a source tree without package metadata
        v = "unknown"
    print(f"onnxruntime-genai {v} builder: {builder}")
    print()
    print("| domain | op | emitted by | mixprec |")
    print("|---|---|---|---|")
    for d, op in sorted(where, key=lambda x: (x[0], x[1])):
        fns = ", ".join(sorted(where[(d, op)]))
        print(f"| {d or 'ai.onnx'} | {op} | {fns} | {'yes' if op in mine[d] else 'no'} |")
    if "--families" in sys.argv:
        print()
        for cls in FAMILIES:
            if cls not in classes:
                continue
            ops = reachable(cls, classes)
            missing = sorted(f"{d or 'ai.onnx'}.{o}" for d, o in ops if o not in mine[d])
            print(f"{cls}: {len(ops)} ops; not in mixprec: {', '.join(missing) or '-'}")


if __name__ == "__main__":
    main()

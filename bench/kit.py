#!/usr/bin/env python3
"""A benchmark kit for a machine without a Rust toolchain (another CPU vendor, a GPU host's CPU).

    kit.py pack KIT_DIR    (here, after `cargo build --release --bin mixprec --bench latency`)
    kit.py run KIT_DIR     (there: needs only python3 with numpy, onnx and onnxruntime)
    kit.py ab KIT_DIR LABEL=LATENCY [LABEL=LATENCY...]   (there: the kit's `latency` binary
                           against other builds of benches/latency.rs, alternating rounds)

`pack` writes KIT_DIR: the stripped `mixprec` and `latency` (benches/latency.rs) binaries, the
bench models of bench/run.sh, every model of the real-model corpus (tests/fixtures/real_models.json)
and SmolLM2-135M's plain and GenAI float32 exports (scripts/real_models.sh), each with its input
set. To keep the kit small (the device tool carries 64 MiB), every stored tensor (initializer,
Constant, in subgraphs too) of 64 KiB or more
is replaced by a record of its shape and value statistics, and `run` regenerates it seeded:
float tensors from a normal distribution with the original's mean and standard deviation,
integer tensors uniform over the original's range. Tensors with non-finite values or values
beyond ±1e4 (masks, limits) are kept as they are. Latency does not depend on the values of
float weights (no denormals are generated: |x| < 1e-30 is written as 0), so both engines time
the same work as on the real model; accuracy figures from a kit are not the real model's.

`run` regenerates the models, pins every timed process to two CPUs (CPUS=a,b, default the
first CPU and its hyperthread sibling: a 2-vCPU cloud machine's shape), and prints the CPU, its
ISA extensions, the two CPUs' cache-line round trip before and after (as bench/run.sh: how quiet
the run was) and, as bench/run.sh and bench/llm.sh (c) do, ROUNDS (default 3) alternating
rounds of the two engines, each engine's lowest median: FP32 mixprec/ORT, the emulated runs
against mixprec's own FP32 run, SmolLM2's prefill and per-token decode against ORT, and its
emulated float16 and bfloat16 prefill and decode against its own FP32 ones.
PROFILE=NAME[,NAME] then prints, for those models, `mixprec run --profile`'s time per op type
and layer beside ONNX Runtime's time per op type (bench/ort_op_profile.py), on the same inputs
(an LLM variant, e.g. PROFILE=genai-fp32: its prefill of the 16-token prompt):
the profile recipe of docs/benchmarks.md for a machine where only the kit runs. ONLY=NAME[,NAME]
times only those models (the LLM variants are named plain and genai-fp32).

`ab` is how a change is measured where instances of a machine differ by more than the change
(the device's Intel hosts: up to 1.5× between instances): ROUNDS (default 4) alternating rounds
of the kit's `latency`, each LABEL's and ONNX Runtime on the kit's models (ONLY=...), FP32
only; it prints each binary's lowest median and its ratio to ORT's, then every round's
medians. Build the other binary from the other commit (`cargo build --release --bench
latency`, then `strip` a copy) and carry it beside the kit.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHRINK_BYTES = 64 * 1024
# The prompt bench/llm.sh uses: a SmolLM2 chat prompt of 16 tokens.
PROMPT = "1,4093,198,1780,314,260,3575,282,4649,47,2,198,1,520,9531,198"


def tensors(graph: onnx.GraphProto):
    """Every stored tensor of `graph` in a fixed order: initializers, Constant values, subgraphs'."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from tensors(g)


def shrink(src: str, dst: str) -> None:
    """Writes `src` to `dst` with every large stored tensor replaced by its statistics."""
    model = onnx.load(src)
    records = {}
    for k, t in enumerate(tensors(model.graph)):
        a = numpy_helper.to_array(t)
        if a.nbytes < SHRINK_BYTES or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            continue
        if np.issubdtype(a.dtype, np.floating):
            f = a.astype(np.float64)
            if not np.isfinite(f).all() or np.abs(f).max() > 1e4:
                continue
            stats = {"mean": float(f.mean()), "std": float(f.std())}
        else:
            stats = {"min": int(a.min()), "max": int(a.max())}
        records[str(k)] = {"dims": list(t.dims), "data_type": t.data_type, **stats}
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                      "external_data"):
            t.ClearField(field)
        t.data_location = TensorProto.DEFAULT
    external = os.path.exists(src + ".data")
    model.metadata_props.add(key="mixprec_kit", value=json.dumps({"external": external, "tensors": records}))
    onnx.save(model, dst)


def expand(src: str, dst: str) -> None:
    """Regenerates the tensors `shrink` replaced, seeded by each one's position and name."""
    model = onnx.load(src)
    props = {p.key: p.value for p in model.metadata_props}
    kit = json.loads(props["mixprec_kit"])
    for k, t in enumerate(tensors(model.graph)):
        r = kit["tensors"].get(str(k))
        if r is None:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(r["data_type"])
        rng = np.random.default_rng([k, zlib.crc32(t.name.encode())])
        if "std" in r:
            a = rng.normal(r["mean"], r["std"], size=r["dims"])
            a[np.abs(a) < 1e-30] = 0.0
        else:
            a = rng.integers(r["min"], r["max"], size=r["dims"], endpoint=True)
        t.CopyFrom(numpy_helper.from_array(a.astype(dtype), t.name))
    keep = [p for p in model.metadata_props if p.key != "mixprec_kit"]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if kit["external"]:
        # onnx.save appends to an existing data file: start it afresh on every expansion.
        data = dst + ".data"
        if os.path.exists(data):
            os.remove(data)
        onnx.save(model, dst, save_as_external_data=True, location=os.path.basename(dst) + ".data")
    else:
        onnx.save(model, dst)


def write_inputs(model_path: str, feeds: dict, folder: str) -> None:
    """The input set as input_K.pb in the graph's input order (benches/latency.rs, ort_latency.py)."""
    os.makedirs(folder, exist_ok=True)
    graph = onnx.load(model_path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    names = [i.name for i in graph.input if i.name not in inits]
    for k, name in enumerate(names):
        with open(os.path.join(folder, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[name], name).SerializeToString())


def pack(kit: str) -> None:
    py = sys.executable
    build = subprocess.run(["cargo", "build", "--release", "--bin", "mixprec", "--bench", "latency",
                            "--message-format=json"], cwd=ROOT, check=True, capture_output=True, text=True)
    exes = {}
    for line in build.stdout.splitlines():
        j = json.loads(line)
        if j.get("reason") == "compiler-artifact" and j.get("executable"):
            exes[j["target"]["name"]] = j["executable"]
    shutil.rmtree(kit, ignore_errors=True)
    os.makedirs(f"{kit}/bin")
    os.makedirs(f"{kit}/models")
    for name in ("mixprec", "latency"):
        subprocess.run(["strip", "-o", f"{kit}/bin/{name}", exes[name]], check=True)
    for script in ("kit.py", "ort_latency.py", "llm_ort.py", "ort_op_profile.py"):
        shutil.copy(f"{ROOT}/bench/{script}", f"{kit}/{script}")
    mix = f"{kit}/bin/mixprec"
    # bench/run.sh's two generated models, with their input sets.
    gen = f"{kit}/gen"
    subprocess.run([py, f"{ROOT}/scripts/gen_models.py", "--out", gen, "--size", "bench", "--only", "cnn,transformer"],
                   check=True, stdout=subprocess.DEVNULL)
    names = []
    for name in ("cnn", "transformer"):
        shrink(f"{gen}/{name}.onnx", f"{kit}/models/{name}.onnx")
        shutil.copytree(f"{gen}/{name}", f"{kit}/models/{name}", ignore=shutil.ignore_patterns("output_*"))
        names.append(name)
    shutil.rmtree(gen)
    # The real-model corpus: inputs as bench/corpus.py makes them (mixprec run --save-inputs).
    env = dict(os.environ, MIXPREC_PYTHON=py)
    cache_lines = subprocess.run(["bash", f"{ROOT}/scripts/real_models.sh"], cwd=ROOT, env=env, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()
    cache = cache_lines[-1]
    sys.path.insert(0, f"{ROOT}/bench")
    from corpus import gen_args  # noqa: E402  (bench/corpus.py: the corpus' input generators)

    for m in json.load(open(f"{ROOT}/tests/fixtures/real_models.json")):
        path, name = os.path.join(cache, m["file"]), m["name"]
        npz = f"{kit}/models/{name}.npz"
        subprocess.run([mix, "run", path, *gen_args(m), "--save-inputs", npz], check=True, capture_output=True)
        write_inputs(path, dict(np.load(npz)), f"{kit}/models/{name}")
        os.remove(npz)
        shrink(path, f"{kit}/models/{name}.onnx")
        names.append(name)
    smollm2 = next(l.split("=", 1)[1] for l in cache_lines if l.startswith("derived smollm2="))
    llms = ["plain", "genai-fp32"]
    os.makedirs(f"{kit}/llm")
    for variant in llms:
        shrink(f"{smollm2}/{variant}/model.onnx", f"{kit}/llm/{variant}.onnx")
    json.dump({"models": names, "llms": llms}, open(f"{kit}/kit.json", "w"))


def cpu_pair() -> list[int]:
    """The first allowed CPU and its hyperthread sibling (else the next CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpus[0]}/topology/thread_siblings_list") as f:
            text = f.read().strip()
        sib = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            sib += range(int(lo), int(hi or lo) + 1)
        if len(sib) >= 2:
            return sib[:2]
    except OSError:
        pass
    return cpus[:2]


def cpu_line() -> str:
    info = open("/proc/cpuinfo").read()
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
    isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                       "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "avx_vnni") if f in flags]
    return f"{model}; {os.cpu_count()} CPUs; {' '.join(isa)}"


def prepare(kit: str, rounds: int, llms: bool = True) -> tuple[dict, str, list[str], str, dict]:
    """Regenerates the kit's models (ONLY=... of them; the LLM variants only with `llms`) under
    KIT/expanded and prints the CPU,
    the kernels' instruction sets and the pinning: the models to time, where they are, the
    pinning command, the thread count and the environment the timed processes run with."""
    meta = json.load(open(f"{kit}/kit.json"))
    work = f"{kit}/expanded"
    if os.environ.get("ONLY"):
        only = set(os.environ["ONLY"].split(",")) | set(filter(None, os.environ.get("PROFILE", "").split(",")))
        meta = {key: [n for n in names if n in only] for key, names in meta.items()}
    if not llms:
        meta["llms"] = []
    for name in meta["models"]:
        shutil.copytree(f"{kit}/models/{name}", f"{work}/{name}", dirs_exist_ok=True)
        expand(f"{kit}/models/{name}.onnx", f"{work}/{name}.onnx")
    for variant in meta["llms"]:
        expand(f"{kit}/llm/{variant}.onnx", f"{work}/llm/{variant}/model.onnx")
    pair = [int(c) for c in os.environ["CPUS"].split(",")] if os.environ.get("CPUS") else cpu_pair()
    threads = str(len(pair))
    print(f"cpu: {cpu_line()}")
    # The instruction sets mixprec's kernels run with there (src/ops/isa.rs).
    p = subprocess.run([f"{kit}/bin/latency", "--cpu"], capture_output=True, text=True)
    if p.returncode == 0:
        print(f"mixprec: {json.loads(p.stdout)['kernels']}")
    print(f"pinned to CPUs {pair}, {threads} threads; onnxruntime {__import__('onnxruntime').__version__}; "
          f"{rounds} rounds; models regenerated from the kit's statistics (see kit.py)")
    pin = ["taskset", "-c", ",".join(map(str, pair))]
    return meta, work, pin, threads, dict(os.environ, RAYON_NUM_THREADS=threads)


def core_round_trip(kit: str, pin: list[str]) -> int | None:
    """A cache line's round trip between the two CPUs in ns (`latency --core-round-trip`, which
    pins to CPUs 0 and 1): 40-110 ns where they share an L3 cache, ~350+ in a machine's slow
    mode. None where the binary fails."""
    p = subprocess.run([*pin, f"{kit}/bin/latency", "--core-round-trip"], capture_output=True, text=True)
    return json.loads(p.stdout)["core_round_trip_ns"] if p.returncode == 0 else None


def run(kit: str) -> None:
    kit = os.path.abspath(kit)
    rounds = int(os.environ.get("ROUNDS", "3"))
    meta, work, pin, threads, env = prepare(kit, rounds)
    trip_before = core_round_trip(kit, pin)
    mix, ort_ = {}, {}
    emulated: dict = {}
    llm: dict = {}
    for _ in range(rounds):
        for name in meta["models"]:
            p = subprocess.run([*pin, f"{kit}/bin/latency", work, name], capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(f"{name}: mixprec failed: {p.stderr.strip()[-300:]}")
                continue
            for j in map(json.loads, p.stdout.strip().splitlines()):
                for k in ("fp16", "bf16", "int8", "fp8"):
                    if j.get(k + "_median_ms"):
                        emulated.setdefault((name, k), []).append(j[k + "_median_ms"] / j["median_ms"])
                mix[name] = min(mix.get(name, 1e30), j["median_ms"])
            p = subprocess.run([*pin, sys.executable, f"{kit}/ort_latency.py", work, threads, name],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{name}: onnxruntime failed: {p.stderr.strip()[-300:]}")
                continue
            for j in map(json.loads, p.stdout.strip().splitlines()):
                ort_[name] = min(ort_.get(name, 1e30), j["median_ms"])
        for variant in meta["llms"]:
            model = f"{work}/llm/{variant}/model.onnx"
            prompt = f"{work}/llm/prompt.npz"
            np.savez(prompt, input_ids=np.array([[int(t) for t in PROMPT.split(",")]], dtype=np.int64))
            # FP32, then the emulated float16 and bfloat16 runs (all layers), each its lowest time.
            for flag in ("", "--fp16", "--bf16"):
                for n in (1, 9):
                    p = subprocess.run([*pin, f"{kit}/bin/mixprec", "run", model, "--load-inputs", prompt, "--decode",
                                        str(n), "--warm-up", "2", "--threads", threads, *([flag] if flag else [])],
                                       capture_output=True, text=True)
                    t = [l for l in (p.stdout + p.stderr).splitlines() if "Average inference time" in l]
                    if not t:
                        print(f"{variant}: mixprec run --decode {n} {flag} failed: {(p.stdout + p.stderr).strip()[-300:]}")
                        continue
                    ms = float(t[0].split("Average inference time:")[1].split("ms")[0])
                    key = (variant, "mixprec" + flag, n)
                    llm[key] = min(llm.get(key, 1e30), ms)
            p = subprocess.run([*pin, sys.executable, f"{kit}/llm_ort.py", model, PROMPT, threads],
                               capture_output=True, text=True)
            if p.returncode == 0:
                t1, t9 = map(float, p.stdout.split())
                for n, s in ((1, t1), (9, t9)):
                    key = (variant, "ort", n)
                    llm[key] = min(llm.get(key, 1e30), s * 1e3)
            else:
                print(f"{variant}: llm_ort.py failed: {p.stderr.strip()[-300:]}")
    # How quiet the machine was: the run is a verdict only where both are low.
    trips = [trip_before, core_round_trip(kit, pin)]
    note = " (>= 250: a slow state of the machine; two-thread times inflate)" if max(t or 0 for t in trips) >= 250 else ""
    print(f"core round trip before / after: {trips[0]} / {trips[1]} ns{note}")
    print("| model | mixprec ms | ORT ms | mixprec/ORT | FP16 / BF16 / INT8 / FP8 ÷ FP32 |")
    print("| --- | --- | --- | --- | --- |")
    ratios = []
    for name in meta["models"]:
        if name not in mix or name not in ort_:
            continue
        r = mix[name] / ort_[name]
        ratios.append(r)
        em = " / ".join(f"{statistics.median(emulated[(name, k)]):.2f}" if (name, k) in emulated else "-"
                        for k in ("fp16", "bf16", "int8", "fp8"))
        print(f"| {name} | {mix[name]:.2f} | {ort_[name]:.2f} | {r:.2f} | {em} |")
    if ratios:
        print(f"FP32 mixprec/ORT over {len(ratios)} models: median {statistics.median(ratios):.2f}, "
              f"max {max(ratios):.2f}")
    print("| SmolLM2-135M (16-token prompt) | prefill mixprec ms | ORT ms | ratio | decode mixprec ms/token | ORT | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant in meta["llms"]:
        try:
            m1, m9 = llm[(variant, "mixprec", 1)], llm[(variant, "mixprec", 9)]
            o1, o9 = llm[(variant, "ort", 1)], llm[(variant, "ort", 9)]
        except KeyError:
            continue
        md, od = (m9 - m1) / 8, (o9 - o1) / 8
        print(f"| {variant} | {m1:.1f} | {o1:.1f} | {m1 / o1:.2f} | {md:.2f} | {od:.2f} | {md / od:.2f} |")
    # The emulated runs against mixprec's own FP32 run: prefill, and per generated token.
    print("| SmolLM2-135M emulated ÷ FP32 | FP16 prefill | FP16 decode | BF16 prefill | BF16 decode |")
    print("| --- | --- | --- | --- | --- |")
    for variant in meta["llms"]:
        try:
            m1, m9 = llm[(variant, "mixprec", 1)], llm[(variant, "mixprec", 9)]
            cells = []
            for flag in ("--fp16", "--bf16"):
                e1, e9 = llm[(variant, "mixprec" + flag, 1)], llm[(variant, "mixprec" + flag, 9)]
                cells += [f"{e1 / m1:.2f}", f"{(e9 - e1) / (m9 - m1):.2f}"]
        except KeyError:
            continue
        print(f"| {variant} | " + " | ".join(cells) + " |")
    if os.environ.get("PROFILE"):
        profile(kit, work, os.environ["PROFILE"].split(","), pin, threads)


def profile(kit: str, work: str, names: list[str], pin: list[str], threads: str) -> None:
    """Per-op profiles of both engines on the kit's inputs (PROFILE=...)."""
    for name in names:
        llm = f"{work}/llm/{name}/model.onnx"
        if os.path.exists(llm):
            # An LLM variant (PROFILE=genai-fp32): its prefill, on the feed ort_op_profile.py
            # writes for GenAI's input names (the 16-token prompt, empty KV cache), which
            # mixprec then loads; so ONNX Runtime runs first.
            model, npz = llm, f"{work}/llm/{name}/prefill.npz"
            if os.path.exists(npz):
                os.remove(npz)
        else:
            model, npz = f"{work}/{name}.onnx", f"{work}/{name}/feed.npz"
            graph = onnx.load(model, load_external_data=False).graph
            inits = {i.name for i in graph.initializer}
            feeds = {}
            for k, i in enumerate(i for i in graph.input if i.name not in inits):
                t = TensorProto()
                with open(f"{work}/{name}/input_{k}.pb", "rb") as f:
                    t.ParseFromString(f.read())
                feeds[i.name] = numpy_helper.to_array(t)
            np.savez(npz, **feeds)
        p = subprocess.run([*pin, sys.executable, f"{kit}/ort_op_profile.py", model, npz, "25", threads],
                           capture_output=True, text=True)
        ort_lines = (p.stdout + p.stderr).splitlines()[:16]
        print(f"\n## {name}: mixprec run --profile")
        p = subprocess.run([*pin, f"{kit}/bin/mixprec", "run", model, "--load-inputs", npz,
                            "--warm-up", "10", "--profile", "--threads", threads], capture_output=True, text=True)
        lines = (p.stdout + p.stderr).splitlines()
        by_type = next((i for i, l in enumerate(lines) if "By op type" in l), len(lines))
        layers = next((i for i, l in enumerate(lines) if "Layer profile" in l), by_type)
        print("\n".join(lines[layers:layers + 16] + lines[by_type:by_type + 16]))
        print(f"## {name}: ONNX Runtime")
        print("\n".join(ort_lines))


def ab(kit: str, others: list[str]) -> None:
    """The kit's `latency` binary against other builds of it (LABEL=PATH each), FP32 only, in
    ROUNDS (default 4) alternating rounds with ONNX Runtime on the kit's models (ONLY=...):
    each binary's lowest median and its ratio to ORT's, and every round's medians, so that
    the spread shows whether a difference is the code's or the machine's."""
    kit = os.path.abspath(kit)
    rounds = int(os.environ.get("ROUNDS", "4"))
    binaries = [("kit", f"{kit}/bin/latency")]
    for other in others:
        label, sep, path = other.partition("=")
        if not sep or not label or not os.path.isfile(path):
            sys.exit(f"kit.py ab: '{other}' is not LABEL=PATH of a latency binary")
        binaries.append((label, os.path.abspath(path)))
    # The LLM variants are not regenerated: `ab` times the kit's models only.
    meta, work, pin, threads, env = prepare(kit, rounds, llms=False)
    names = meta["models"]
    medians: dict = {}
    for _ in range(rounds):
        for label, path in binaries:
            p = subprocess.run([*pin, path, "--fp32-only", work, *names], capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(f"{label}: failed: {p.stderr.strip()[-300:]}")
            for j in map(json.loads, filter(None, p.stdout.strip().splitlines())):
                medians.setdefault((label, j["model"]), []).append(j["median_ms"])
        p = subprocess.run([*pin, sys.executable, f"{kit}/ort_latency.py", work, threads, *names],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"onnxruntime: failed: {p.stderr.strip()[-300:]}")
        for j in map(json.loads, filter(None, p.stdout.strip().splitlines())):
            medians.setdefault(("ORT", j["model"]), []).append(j["median_ms"])
    labels = [label for label, _ in binaries]
    print("| model | " + " | ".join(f"{l} ms" for l in labels) + " | ORT ms | "
          + " | ".join(f"{l}/ORT" for l in labels) + " |")
    print("| --- " * (2 * len(labels) + 2) + "|")
    for name in names:
        best = {l: min(medians[(l, name)]) for l in labels + ["ORT"] if (l, name) in medians}
        if "ORT" not in best:
            continue
        cells = [f"{best[l]:.3f}" if l in best else "-" for l in labels + ["ORT"]]
        ratios = [f"{best[l] / best['ORT']:.3f}" if l in best else "-" for l in labels]
        print(f"| {name} | " + " | ".join(cells + ratios) + " |")
    print("every round's medians (ms):")
    for name in names:
        for l in labels + ["ORT"]:
            if (l, name) in medians:
                print(f"  {name} {l}: " + " ".join(f"{v:.3f}" for v in medians[(l, name)]))


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "ab":
        return ab(sys.argv[2], sys.argv[3:])
    if len(sys.argv) != 3 or sys.argv[1] not in ("pack", "run"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else run)(sys.argv[2])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`debug precision` as users run it, with --jobs 1 and --jobs 2 (bench/search.sh).

Usage: search_jobs.py MIXPREC_BIN THREADS CASE_DIR [CORPUS_CACHE]

Per model and mode: candidates N, answer k, evaluations the strategy took (the same for any
--jobs: checked), issue 10's bound 1.2*(k*log2(N/k)+k), then per --jobs value the sets evaluated
ahead and not needed, the command's wall time in seconds and as a multiple of one FP32
inference (the search's own figure), and its peak RSS in MB and as a multiple of a plain
`mixprec run` of the same inputs (wait4). Cases: the planted benchmark models (CASE_DIR, from
scripts/gen_models.py --size bench) and, when CORPUS_CACHE is given, the real-model corpus
(tests/fixtures/real_models.json) with its strict criterion. Prints a Markdown table.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import ROOT, gen_args, run, search_bound  # noqa: E402

PLANTED = ["--val-range", "[-1,1]", "--check-error-stat", "median", "--atol", "1e-2", "--rtol=1e-2"]
JOBS = ("1", "2")


def cases(case_dir, cache):
    for name in ("planted_cnn", "planted_transformer"):
        yield name, os.path.join(case_dir, f"{name}.onnx"), PLANTED, ["minimal", "worst-first", "bisect"]
    if cache:
        for m in json.load(open(f"{ROOT}/tests/fixtures/real_models.json")):
            yield m["name"], os.path.join(cache, m["file"]), ["GEN", m], ["minimal"]


def main():
    mix, threads, case_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    cache = sys.argv[4] if len(sys.argv) > 4 else None
    work = os.path.join(ROOT, "target", "bench-search")
    os.makedirs(work, exist_ok=True)
    print(f"threads={threads}")
    head = "| model | mode | N | k | evals (bound) |"
    for j in JOBS:
        head += f" jobs {j}: ahead / s / x FP32 / RSS MB (x run) |"
    print(head)
    print("|" + " --- |" * (5 + len(JOBS)))
    for name, path, crit, modes in cases(case_dir, cache):
        inputs = []
        if crit[0] == "GEN":
            m = crit[1]
            npz = os.path.join(work, f"{name}.npz")
            p, _ = run([mix, "run", path, *gen_args(m), "--threads", threads, "--save-inputs", npz])
            crit, inputs = m["strict"], ["--load-inputs", npz]
            if p.returncode == 0:
                # The baseline reads the same inputs (a data-loader script's Python is not in it).
                p, _ = run([mix, "run", path, *inputs, "--threads", threads])
        else:
            p, _ = run([mix, "run", path, "--threads", threads, *crit])
        if p.returncode != 0:
            print(f"| {name} | | | | does not run | |")
            continue
        run_rss = p.rss_mb
        for mode in modes:
            row, answers, trials = {}, [], []
            for j in JOBS:
                res = os.path.join(work, f"{name}-{mode}-{j}.json")
                p, wall = run([mix, "debug", "precision", path, *inputs, "--threads", threads, "--fp16",
                               "--mode", mode, *crit, "--jobs", j, "--save-result", res])
                if p.returncode != 0 or not os.path.exists(res):
                    row[j] = None
                    continue
                saved = json.load(open(res))
                answers.append(sorted(l["name"] for l in saved["layers"]))
                trials.append([(t["marked"], t["passed"]) for t in saved["trials"]])
                x = re.search(r"= ([\d.]+)x one FP32 inference", p.stdout)
                row[j] = (saved["stats"]["speculative_evaluations"], wall, x and float(x.group(1)), p.rss_mb,
                          saved["candidates"], len(saved["layers"]), len(saved["trials"]))
            done = [row[j] for j in JOBS if row[j]]
            if not done:
                print(f"| {name} | {mode} | | | failed |" + " |" * len(JOBS))
                continue
            n, k, e = done[0][4], done[0][5], done[0][6]
            same = all(a == answers[0] for a in answers) and all(t == trials[0] for t in trials)
            line = f"| {name} | {mode} | {n} | {k} | {e} ({search_bound(k, n):.0f}){'' if same else ' DIFFERENT'} |"
            for j in JOBS:
                r = row[j]
                if r is None:
                    line += " failed |"
                    continue
                ahead, wall, x, rss = r[0], r[1], r[2], r[3]
                line += f" {ahead} / {wall:.2f} / {x if x is not None else '?'} / {rss:.0f} ({rss / run_rss:.1f}) |"
            print(line)


if __name__ == "__main__":
    main()

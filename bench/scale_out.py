"""bench/scale_out.sh's measurement: one check-style search, serial and on 1, 2 and 4 Ray
workers (a local Ray instance), with the same answer and trials in every row."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import ray

import mixprec
from mixprec._scale import comparable

# The check: sleep (the engine build), then the candidate's model against the FP32 model on
# fixed inputs, in a child Python (as a deployment check would run).
JUDGE = """
import sys
import numpy as np
import mixprec
candidate, reference = sys.argv[1], sys.argv[2]
def run(path):
    return mixprec.run(path, val_range="[1,2]", seed=7, iterations=2)
ok = all(np.allclose(a[k], b[k], rtol=1e-2, atol=1e-2)
         for a, b in zip(run(candidate), run(reference)) for k in b)
sys.exit(0 if ok else 1)
"""


def main() -> None:
    model, seconds, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        judge = os.path.join(tmp, "judge.py")
        with open(judge, "w") as f:
            f.write(JUDGE)
        check: List[str] = [
            "sh", "-c", f'sleep {seconds} && exec "{sys.executable}" {judge} "$0" {model}', "{model}",
        ]
        t = time.perf_counter()
        subprocess.run([a.replace("{model}", model) for a in check], check=True)
        check_seconds = time.perf_counter() - t
        kw: Dict[str, Any] = dict(
            precision="float16", val_range="[1,2]", iterations=2, mode=mode, check=check,
            progress=False,
        )
        rows = []
        t = time.perf_counter()
        serial = mixprec.debug_precision(model, jobs=1, **kw)
        serial_wall = time.perf_counter() - t
        rows.append(("serial (jobs 1)", 1, serial, serial_wall))
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            for workers in (1, 2, 4):
                t = time.perf_counter()
                r = mixprec.debug_precision(
                    model, executor=mixprec.RayWorkers(workers), jobs=workers, **kw
                )
                rows.append((f"Ray, {workers} worker(s)", workers, r, time.perf_counter() - t))
        finally:
            ray.shutdown()
    print(f"model {os.path.basename(model)}, mode {mode}, check {check_seconds:.2f} s a candidate "
          f"(sleep {seconds:g} s + the judge); {os.cpu_count()} CPU(s)")
    print(f"answer: {serial.outcome}, {len(serial.layers)} layer(s): {', '.join(serial.layers)}")
    print("| run | evaluations (+ ahead) | wall s | vs serial | ideal s | vs ideal | same answer and trials |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, workers, r, wall in rows:
        stats = r.to_dict()["stats"]
        evals, ahead = stats["evaluations"], stats["speculative_evaluations"]
        ideal = evals / workers * check_seconds
        same = comparable(r.to_dict()) == comparable(serial.to_dict()) and r.history == serial.history
        print(f"| {name} | {evals} (+{ahead}) | {wall:.1f} | {serial_wall / wall:.2f}x | "
              f"{ideal:.1f} | {ideal / wall:.0%} | {'yes' if same else 'NO'} |")
        if not same:
            sys.exit(f"{name}: the answer or the trials differ from the serial search")


if __name__ == "__main__":
    main()

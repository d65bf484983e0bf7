"""The search on a two-node Ray cluster (scripts/ray_two_nodes.sh starts it): actors spread
over both nodes, the first worker that judges a candidate dies mid-candidate, and the answer,
the trials and the result file must be those of the serial search on the driver."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Dict, List

import numpy as np
import ray

import mixprec
from mixprec._scale import comparable


class Close:
    """Every output within 1e-2; on a worker, records its node and, once, dies."""

    def __init__(self, driver: int, record: str, marker: str) -> None:
        self.driver, self.record, self.marker = driver, record, marker

    def __call__(self, outputs: List[Dict[str, np.ndarray]], golden: List[Dict[str, np.ndarray]]) -> bool:
        if os.getpid() != self.driver:
            with open(self.record, "a") as f:
                f.write(ray.get_runtime_context().get_node_id() + "\n")
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os._exit(3)
        return all(
            np.allclose(o[k], g[k], rtol=1e-2, atol=1e-2) for o, g in zip(outputs, golden) for k in g
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--model", required=True)
    a = p.parse_args()
    ray.init(address=a.address, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        record, marker = os.path.join(tmp, "nodes"), os.path.join(tmp, "died")
        criterion = Close(os.getpid(), record, marker)
        kw: Dict[str, Any] = dict(
            precision="float16", val_range="[1,2]", iterations=2, progress=False, criterion=criterion
        )
        serial = mixprec.debug_precision(a.model, **kw)
        spread = mixprec.RayWorkers(2, scheduling_strategy="SPREAD")
        on_cluster = mixprec.debug_precision(a.model, executor=spread, **kw)
        nodes = set(open(record).read().split())
        assert os.path.exists(marker), "no worker died"
        assert len(nodes) == 2, f"the candidates ran on {len(nodes)} node(s): {nodes}"
        assert on_cluster.history == serial.history
        assert comparable(on_cluster.to_dict()) == comparable(serial.to_dict())
    print(
        f"two-node search: the serial answer ({len(serial.layers)} layer(s), "
        f"{serial.evaluations} evaluation(s)) on {len(nodes)} nodes, one worker killed mid-candidate"
    )


if __name__ == "__main__":
    main()

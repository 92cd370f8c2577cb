"""Run a small check ON every node of the joined Ray cluster, where the work will run.

A node's disk, its interfaces, what it can reach: none of it can be measured from the driver's
machine. Each node gets one task pinned to it (no CPU reserved, no retry); a node whose task does
not run within the deadline, or fails, is an outcome of its own, named by index and address.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from fleetrl.cluster.ray.nodes import in_node_order
from fleetrl.doctor.result import Check, failed

# A probe's worker process may have to start first. Ray itself gives a starting worker 60 s to
# register (its worker_register_timeout_seconds) before calling it failed; on a loaded 2-core host
# two workers once took over 20 s each, and a healthy node was reported unable to run work.
START_UP_S = 60.0


@dataclass(frozen=True)
class NodeOutcome:
    index: int  # fleetrl's node index
    address: str
    result: Any = None
    error: str = ""  # why there is no result, in words ("" when there is one)

    @property
    def source(self) -> str:
        return f"node {self.index} ({self.address})"

    def did_not_run(self, name: str) -> Check:
        """Check `name` failed on this node because the probe itself could not run there."""
        return failed(
            name,
            f"{self.source}: {self.error}",
            f"check that {self.source} is healthy (`ray status`) and can start workers",
        )


def live_nodes() -> list[dict]:
    """Ray's alive nodes in fleetrl's node order (`cluster/ray/nodes.py`)."""
    import ray

    return in_node_order(ray.nodes())


def on_every_node(
    nodes: list[dict], function: Callable, args: tuple, deadline_s: float, only: Collection[int] | None = None
) -> list[NodeOutcome]:
    """`function(node index, *args)` run on each of `nodes` (entries of `live_nodes()`), or on
    those whose index is in `only`, within `deadline_s`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(function)
    chosen = [(index, node) for index, node in enumerate(nodes) if only is None or index in only]
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            index, *args
        )
        for index, node in chosen
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=deadline_s)
    outcomes = []
    for (index, node), ref in zip(chosen, refs):
        address = node["NodeManagerAddress"]
        if ref not in ready:
            ray.cancel(ref, force=True)
            outcomes.append(NodeOutcome(index, address, error=f"did not run its probe within {deadline_s:g} s"))
            continue
        try:
            outcomes.append(NodeOutcome(index, address, ray.get(ref)))
        except Exception as error:  # noqa: BLE001 — a probe that cannot run is the finding
            outcomes.append(NodeOutcome(index, address, error=f"the probe failed: {type(error).__name__}: {error}"))
    return outcomes

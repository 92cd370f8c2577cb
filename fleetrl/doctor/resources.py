"""The resources that actually exist: the connected Ray cluster's nodes, or this machine.

The doctor never starts or joins a Ray cluster on its own; when the calling process is already
connected (`ray.is_initialized()`, as in `fleetrl train` on the ray backend), every node is seen.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from fleetrl.cluster.ray.nodes import in_node_order


@dataclass(frozen=True)
class LiveNode:
    address: str
    cpus: int
    gpus: int


@dataclass(frozen=True)
class LiveCluster:
    source: str  # 'this machine' or 'the Ray cluster'
    nodes: tuple[LiveNode, ...]

    @property
    def whole_cluster(self) -> bool:
        return self.source != "this machine"


def cpu_count() -> int:
    """CPUs this process may run on (cgroup/affinity aware where the OS says so)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def live_cluster(count_gpus: bool) -> LiveCluster:
    if ray_connected():
        import ray

        nodes = [
            LiveNode(
                node["NodeManagerAddress"], int(node["Resources"].get("CPU", 0)), int(node["Resources"].get("GPU", 0))
            )
            for node in in_node_order(ray.nodes())
        ]
        return LiveCluster("the Ray cluster", tuple(nodes))
    gpus = gpu_count() if count_gpus else 0
    return LiveCluster("this machine", (LiveNode("localhost", cpu_count(), gpus),))

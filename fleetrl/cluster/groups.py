"""Worker groups: the ranks of one component, called by method name, wherever they run.

`call` returns a future at once (an `ObjectRef` on Ray, the plain result inline); a future may be
passed as an argument to another call, so the controller can queue a whole chain of dependent
calls (env step → rollout act → env step …) and each worker runs them in submission order as
their inputs arrive. That is what pipelines env and rollout without any threads here.
"""

from __future__ import annotations

from typing import Any, Sequence

from fleetrl.cluster.placement import Assignment


class InlineGroup:
    """All ranks are objects in this process; calls run immediately."""

    def __init__(self, assignments: Sequence[Assignment], workers: list):
        self.assignments, self.workers = list(assignments), workers

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def call(self, rank: int, method: str, *args) -> Any:
        return getattr(self.workers[rank], method)(*args)

    def call_all(self, method: str, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    @staticmethod
    def get(futures):
        return futures


class RayGroup:
    """Each rank is a Ray actor (`WorkerHost`) pinned to its node."""

    def __init__(self, assignments: Sequence[Assignment], handles: list):
        self.assignments, self.handles = list(assignments), handles

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def call(self, rank: int, method: str, *args):
        return self.handles[rank].call.remote(method, *args)

    def call_all(self, method: str, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    @staticmethod
    def get(futures):
        import ray

        return ray.get(futures)

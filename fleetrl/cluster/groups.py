"""Worker groups: the ranks of one component, called by method name, wherever they run.

`call` returns a future at once (an `ObjectRef` on Ray, the plain result inline); a future may be
passed as an argument to another call, so the controller can queue a whole chain of dependent
calls (env step → rollout act → env step …) and each worker runs them in submission order as
their inputs arrive. That is what pipelines env and rollout without any threads here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fleetrl.cluster.placement import Assignment


class InlineGroup:
    """All ranks are objects in this process; calls run immediately, as recorded phases."""

    def __init__(self, assignments: Sequence[Assignment], workers: list, runners: list | None = None):
        self.assignments, self.workers = list(assignments), workers
        self.runners = runners or [lambda method, *args, w=w: getattr(w, method)(*args) for w in workers]

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def call(self, rank: int, method: str, *args) -> Any:
        return self.runners[rank](method, *args)

    def call_all(self, method: str, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    @staticmethod
    def get(futures):
        return futures


class RayGroup:
    """Each rank is a Ray actor (`WorkerHost`) pinned to its node. `get` waits in short slices,
    raises a finished call's error without waiting for the rest, and gives up as soon as
    `interrupt` is set (the watchdog found an incident)."""

    def __init__(self, assignments: Sequence[Assignment], handles: list):
        self.assignments, self.handles = list(assignments), handles
        self.interrupt = threading.Event()

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def call(self, rank: int, method: str, *args):
        return self.handles[rank].call.remote(method, *args)

    def call_all(self, method: str, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    def get(self, futures, slice_s: float = 0.2):
        import ray

        single = not isinstance(futures, list)
        pending = [futures] if single else list(futures)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=slice_s, fetch_local=False)
            if self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            if ready and pending:  # a failed call raises now: its peers may wait for it forever
                ray.get(ready)
        return ray.get(futures)


class Interrupted(Exception):
    """A wait given up because the watchdog has taken over (it reports and tears down)."""

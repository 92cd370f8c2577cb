"""Worker groups: the ranks of one component, called with the worker class's own methods.

`group.call(rank, EnvWorker.step, actions, stage)` names the method by its function object, so a
reader and an IDE follow a call to its definition. A group knows the class its workers are; a
method that is not that class's (or one of its bases') raises `NotAWorkerMethod` at the call
site, the first time it is used, before anything is sent. What reaches the worker is the method's
name, derived from the function object (and resolved there by `getattr`, so a subclass's override
runs): one dict lookup per call once a method has been checked.

`call` returns a future at once (an `ObjectRef` on Ray, the plain result inline); a future may be
passed as an argument to another call, so the controller can queue a whole chain of dependent
calls (env step → rollout act → env step …) and each worker runs them in submission order as
their inputs arrive. That is what pipelines env and rollout without any threads here.

A Ray group's `get` publishes what it waits on — each call's worker, phase and when it was sent
(`SentCalls`) — in this process's heartbeat (probe/flight_recorder.py `waiting_on`): a worker that
dies in a call is reported in that call even where its own last heartbeat predates it.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from fleetrl.plan.placement import Assignment
from fleetrl.probe.flight_recorder import waiting_on
from fleetrl.signals import stops_wait

Method = Callable[..., Any]  # a function defined on a worker class, e.g. `EnvWorker.step`


class NotAWorkerMethod(TypeError):
    """A controller bug: a group was called with a function its worker class does not define."""


def method_name(worker_class: type, method: Method) -> str:
    """The name under which `worker_class` defines `method` (itself or in a base class)."""
    name = getattr(method, "__name__", None)
    if name is None or not any(vars(cls).get(name) is method for cls in worker_class.__mro__):
        owner = getattr(method, "__qualname__", repr(method))
        raise NotAWorkerMethod(
            f"{owner} is not a method of {worker_class.__qualname__} or its bases: "
            f"this group runs {worker_class.__qualname__} workers"
        )
    return name


class WorkerGroup(ABC):
    """What every group has: its ranks' assignments, its worker class, and the checked wire name
    of each method called so far. `prefix` routes calls inside a process that hosts several
    components (a fused rank: 'env.step')."""

    def __init__(self, assignments: Sequence[Assignment], worker_class: type, prefix: str = ""):
        self.assignments: list[Assignment] = list(assignments)
        self.worker_class: type = worker_class
        self.prefix: str = prefix
        self.wire_names: dict[Method, str] = {}

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    def wire_name(self, method: Method) -> str:
        name = self.wire_names.get(method)
        if name is None:
            name = self.wire_names[method] = self.prefix + method_name(self.worker_class, method)
        return name

    @abstractmethod
    def call(self, rank: int, method: Method, *args) -> Any:
        """Run `method` on rank `rank`; returns its future (inline: its result)."""

    def call_all(self, method: Method, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    @abstractmethod
    def get(self, futures):
        """The results of a future or a list of futures, once they are ready."""

    @abstractmethod
    def ready(self, future) -> bool:
        """Whether `future`'s call has finished (its `get` would not wait); never waits."""


class InlineGroup(WorkerGroup):
    """All ranks are objects in this process; calls run immediately, through `calls` (each a
    `RecordedCalls`: a recorded phase) or, without them, as plain method calls."""

    def __init__(self, assignments: Sequence[Assignment], workers: list, calls: list | None = None):
        super().__init__(assignments, type(workers[0]))
        self.workers: list = workers
        self.calls: list[Callable] = calls or [lambda name, *args, w=w: getattr(w, name)(*args) for w in workers]

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def call(self, rank: int, method: Method, *args) -> Any:
        return self.calls[rank](self.wire_names.get(method) or self.wire_name(method), *args)

    def get(self, futures):
        return futures

    def ready(self, future) -> bool:
        return True


# The calls per worker whose futures a wait can name: more than one ever waits on at once
KEPT_PER_WORKER = 16


class SentCalls:
    """The calls this process sent to Ray workers, the last `KEPT_PER_WORKER` of each: a future's
    id → (component, rank, phase, sent at: epoch seconds). Ids, not futures: a future kept here
    would keep its result in Ray's object store."""

    def __init__(self) -> None:
        self.sent: dict[bytes, tuple[str, int, str, float]] = {}
        self.kept: dict[tuple[str, int], deque[bytes]] = {}

    def add(self, future, component: str, rank: int, phase: str) -> None:
        kept = self.kept.setdefault((component, rank), deque())
        if len(kept) == KEPT_PER_WORKER:
            self.sent.pop(kept.popleft(), None)
        sent = future.binary()
        kept.append(sent)
        self.sent[sent] = (component, rank, phase, time.time())

    def waiting(self, futures: list) -> tuple:
        """The calls of `futures` sent from here, as `Recorder.wait_on` takes them: one entry per
        component and phase, its ranks, sent when the first of them was."""
        calls: dict[tuple[str, str], list] = {}  # (component, phase) → [ranks, sent at]
        for future in futures:
            found = self.sent.get(future.binary())
            if found is None:  # not sent through a group (a worker's start), or long ago
                continue
            component, rank, phase, sent = found
            call = calls.setdefault((component, phase), [[], sent])
            call[0].append(rank)
            call[1] = min(call[1], sent)
        return tuple((component, phase, tuple(ranks), sent) for (component, phase), (ranks, sent) in calls.items())


class RayGroup(WorkerGroup):
    """Each rank is a Ray actor (`WorkerHost`) pinned to its node. `get` waits in short slices,
    raises a finished call's error without waiting for the rest, and gives up as soon as
    `interrupt` is set (the watchdog found an incident). Its calls are noted in `sent`, which
    the groups of one cluster share (a wait may take another group's futures)."""

    def __init__(
        self,
        assignments: Sequence[Assignment],
        handles: list,
        worker_class: type,
        interrupt: threading.Event,
        sent: SentCalls,
        prefix: str = "",
    ):
        super().__init__(assignments, worker_class, prefix)
        self.handles: list = handles
        self.interrupt: threading.Event = interrupt
        self.sent: SentCalls = sent

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def view(self, component: str, worker_class: type) -> RayGroup:
        """The same processes seen as `component`'s group (fused ranks host several components)."""
        return RayGroup(self.assignments, self.handles, worker_class, self.interrupt, self.sent, f"{component}.")

    def call(self, rank: int, method: Method, *args):
        name = self.wire_names.get(method) or self.wire_name(method)
        future = self.handles[rank].call.remote(name, *args)
        assignment = self.assignments[rank]
        # the phase the worker runs it as (probe/recorded_calls.py): a prefixed name is one already
        phase = name if self.prefix else f"{assignment.component}.{name}"
        self.sent.add(future, assignment.component, assignment.rank, phase)
        return future

    def call_all(self, method: Method, *args) -> list:
        """Every rank gets the call, or a stop came first and none did (signals.py `stops_wait`):
        a collective method sent to some ranks only would never end."""
        with stops_wait():
            return super().call_all(method, *args)

    def built(self) -> None:
        """Wait until every rank's worker is built (`build_workers` does not); a rank's constructor
        error is raised here, at start-up, rather than by its first call, which may come late (the
        eval worker's, after the first iteration)."""
        self.get([handle.built.remote() for handle in self.handles])

    def ready(self, future) -> bool:
        import ray

        done, _ = ray.wait([future], timeout=0, fetch_local=False)
        return bool(done)

    def get(self, futures, slice_s: float = 0.2):
        import ray

        single = not isinstance(futures, list)
        pending = [futures] if single else list(futures)
        while pending:
            waiting_on(self.sent.waiting(pending))
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=slice_s, fetch_local=False)
            if self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            if ready and pending:  # a failed call raises now: its peers may wait for it forever
                ray.get(ready)
        results = ray.get(futures)
        # Only once the results are in: a wait that raised (a dead worker, an incident) stays in
        # the heartbeat for the watcher, which reads it to name what the dead worker was doing
        waiting_on(())
        return results


class Interrupted(Exception):
    """A wait given up because the watchdog has taken over (it reports and tears down)."""

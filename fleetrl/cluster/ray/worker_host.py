"""The Ray actor around one worker, on the worker's side: all a worker process imports of fleetrl's
cluster code (ray/cluster.py, the driver's side, imports the watchdog's session and torch).

Its start-up is two steps, so that the controller can start a worker's process before it can
build the worker: `WorkerHost(...)` sets up the process — thread count, watching (heartbeats,
stack dumps), and the worker class's imports, done as Ray unpickles `factory` — and `start(args)`
builds the worker as the watched start-up step `<component>.construct`. The Ray backend starts
the actor and rollout processes this way while the env worker answers `spaces` (their
constructors need the spaces). An env worker's process never imports torch (step_result.py,
probe/store_client.py): ~1.5 s of CPU less on its start-up path (benchmarks/scaling/ray_startup.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from fleetrl.cluster.exchange.direct_channels import DirectChannels
from fleetrl.debug.faults import FaultPlan
from fleetrl.net import free_port
from fleetrl.plan.placement import Assignment
from fleetrl.probe.recorded_calls import RecordedCalls, WatchSpec, WorkerError, start_watching


class WorkerHost:
    """Sets up its process, builds the worker on `start`, then runs the controller's method
    calls as recorded phases. An error in `start` is kept and raised by the first call (a
    `WorkerError` naming the worker and `<component>.construct`), so the controller need not
    wait for `start` before queueing calls behind it."""

    def __init__(self, threads: int, factory: Callable, assignment: Assignment, watch: WatchSpec):
        limit_threads(threads)
        pack_step_results()
        self.factory, self.assignment, self.watch = factory, assignment, watch
        self.recorder = start_watching(assignment.component, assignment.rank, assignment.node, watch)
        self.run: Callable | None = None
        self.failed: WorkerError | None = None
        self.channels = DirectChannels(self.call, (assignment.component, assignment.rank), watch.secret)

    def start(self, args: tuple) -> None:
        """Build the worker from `factory(*args)`, as the phase `<component>.construct`."""
        a = self.assignment
        construct = RecordedCalls(self, a.component, a.rank, self.recorder, FaultPlan({}, a.component, a.rank))
        try:
            self.run = construct("construct", args)
        except WorkerError as error:
            self.failed = error

    def built(self) -> None:
        """Returns once `start` has built the worker; raises its error if it could not."""
        if self.run is None:
            raise self.failed or RuntimeError("the worker has not been built (`start` was never called)")

    def construct(self, args: tuple) -> Callable:
        return self.build(self.factory, args, self.assignment, self.recorder, self.watch)

    @staticmethod
    def build(factory: Callable, args: tuple, assignment: Assignment, recorder, watch: WatchSpec) -> Callable:
        """The callable that runs `call(method, *args)`: here one worker's RecordedCalls."""
        faults = FaultPlan(watch.fault, assignment.component, assignment.rank)
        return RecordedCalls(factory(*args), assignment.component, assignment.rank, recorder, faults)

    def call(self, method_name: str, *args):
        """Run the worker's method `method_name` (cluster/groups.py derives it from the method)."""
        if self.run is None:
            raise self.failed or RuntimeError(f"{method_name} called before `start` built the worker")
        return self.run(method_name, *args)

    def direct(self, operation: str, *args):
        """Run `operation` of this worker's direct env⇄rollout channels (cluster/exchange/direct_channels.py)."""
        return getattr(self.channels, operation)(*args)

    def join_weight_sync(self, formation) -> str | None:
        """Run the worker's `join_weight_sync(formation, secret)` (parallel/sync_group.py) as its
        recorded phase, with the run's secret this process was started with: the secret never
        travels in a call's arguments."""
        return self.call("join_weight_sync", formation, self.watch.secret)

    def free_port(self, address: str) -> int:
        """A TCP port that is free on this worker's node (for a rendezvous hosted here)."""
        return free_port(address)


class FusedHost(WorkerHost):
    """The Ray actor around one fused rank (cluster/backends/fused.py): `factory(*args, recorder,
    fault_spec)` builds it, and it runs each call under its component's own RecordedCalls."""

    @staticmethod
    def build(factory: Callable, args: tuple, assignment: Assignment, recorder, watch: WatchSpec) -> Callable:
        return factory(*args, recorder, watch.fault)


def nothing(worker_host: WorkerHost) -> None:
    """A call that does nothing, queued behind earlier calls: it returns once they have run
    (exchange/compiled.py `finish_earlier_calls`). Here, not there: Ray sends it by reference, and
    the worker imports its module — exchange/compiled.py would bring torch into an env worker."""


def limit_threads(threads: int) -> None:
    """torch's intra-op threads, in a process that has torch: an actor or rollout worker's (its
    class's module imported it as Ray unpickled the factory). An env worker, which has not, is
    bounded by `OMP_NUM_THREADS` (RayCluster.worker_env_vars), which torch also reads should the
    user's env import it; and Ray is told that torch is not there (`keep_torch_out`)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        keep_torch_out()


def keep_torch_out() -> None:
    """A compiled graph's loop imports torch in each of its actors, only to ask whether torch is
    installed (`ChannelContext.torch_available`) and, where it is, to enter a device context
    around each channel read and write: one the CPU needs none of, and fleetrl's channels carry
    pickles, never device tensors. Answered `False` here, before any graph, an env worker never
    pays torch's import (tests/test_ray_backend.py holds Ray to it)."""
    from ray.experimental.channel.common import ChannelContext

    ChannelContext.get_current()._torch_available = False


def pack_step_results() -> None:
    """Send env outcomes between this process and the others as one pickle. Ray serialises a
    dataclass of numpy arrays array by array, each out of band: a `StepResult` of 4 CartPole
    envs (6 arrays) cost ~50 µs to serialise against ~18 µs in one pickle, and as much again to
    read back, at every env ⇄ rollout exchange (benchmarks/scaling/exchange.py). Registered in
    the driver and in every worker process (Ray's serialisers are per process)."""
    import pickle

    import ray

    from fleetrl.step_result import StepResult

    ray.util.register_serializer(StepResult, serializer=pickle.dumps, deserializer=pickle.loads)

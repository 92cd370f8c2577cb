"""Asynchronous training (`runner.asynchronous: true`): the env and rollout workers collect the
next batches while the actor ranks train on one that has arrived.

One controller thread drives it, with the calls the synchronous loop makes. A collection is the
same blocking `Collector.collect` (any exchange); an update is `ActorBase.train` on every actor
rank, *submitted* — its futures are kept, and on Ray the ranks train in their own processes
while this thread collects the next batch. Between the two sits a bounded queue of collected
batches (`runner.async_queue_batches`): a collection starts only while the queue has room, so a
learner that falls behind holds the collectors back (back-pressure) rather than filling memory.

    collect B0 → [B0] → train B0 (submitted) → collect B1 (meanwhile) → [B1] → B0 trained → train B1 → ...

Weights move as versions (controller/policy_versions.py): right after an update is submitted the
actor ranks are asked for the new version's weights (the call queues behind the update), and a
collection loads the newest version whose weights are ready — the rollout never waits for the
actor. A batch is submitted with each sample's age, the versions between the one that acted it
and the actor's at the update's start (`Trajectory.ages`: `algorithm.proximal_logprob: loglinear`
interpolates by it); one whose oldest sample is more than `algorithm.max_staleness` versions old
when its update would start is dropped, its samples counted. On the inline backend every call runs when
it is made: the loop runs collect, train, collect, ... in order and its samples are 0 versions
old (nothing overlaps in one thread).

An *iteration* is one update: `next()` returns each trained batch's outcome; the console line,
`metrics.jsonl`, checkpoints and `runner.checkpoint_interval` count them. The controller's waits
are watched phases of its own — `async.collect` (on the env and rollout workers), `async.queue_full`
(on the actor ranks, the queue full: the collectors are held back behind them), `async.drain` (on
the actor ranks, nothing left to collect) — which the watchdog leaves to the workers' own
deadlines (watch/link.py `CONTROLLER_WAITS`; a report says whom each waits for:
watch/reporting/hang_report.py `ASYNC_WAITS`). An update that fails while this thread is inside a
collection is not left until the collection ends: a watcher thread sees the failed future, and
the collection's waits give up (`Interrupted`) so that the update's own error is raised.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from fleetrl.algos.registry import ConsoleMetric
from fleetrl.cluster.backends.base import Backend
from fleetrl.cluster.exchange.collect import Collector
from fleetrl.cluster.groups import Interrupted, WorkerGroup
from fleetrl.config.schema import Config
from fleetrl.controller.policy_versions import PolicyVersions
from fleetrl.controller.updates import Update
from fleetrl.probe.flight_recorder import phase
from fleetrl.signals import hold_stops, stops_wait
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker

COLLECT, QUEUE_FULL, DRAIN = "async.collect", "async.queue_full", "async.drain"  # the controller's waits
# What the console line adds in asynchronous training: the batch's mean age, the queue behind it, the drops
CONSOLE_METRICS = (
    ConsoleMetric("staleness_mean", "age", ".2f"),
    ConsoleMetric("queue_depth", "queue", "d"),
    ConsoleMetric("samples_dropped", "dropped", ",d"),
)
WATCH_SLICE_S = 0.2  # how often the failure watcher looks at an update's futures
WEIGHTS_POLL_S = 0.005  # how often a finished update's weights are looked for (they follow it at once)


@dataclass
class Batch:
    """One collection, waiting in the queue for the actor."""

    trajectory: Trajectory
    progress: float  # env steps collected before it / runner.total_env_steps: its schedule position
    reports: list[dict]  # the env workers' reports at its end (counters, finished episodes)
    collect_s: float
    weight_syncs: int  # rollout workers sent weights at its start

    @property
    def samples(self) -> int:
        return self.trajectory.rewards.numel()


@dataclass
class InFlight:
    """An update submitted to the actor ranks: its futures, and a thread that watches them."""

    batch: Batch
    futures: list
    ages: Counter
    queue_depth: int  # batches waiting behind it when it started
    submitted: float  # perf_counter() when its calls were made
    failure: list = field(default_factory=list)  # the first error the watcher saw
    done: threading.Event = field(default_factory=threading.Event)
    watcher: threading.Thread | None = None


def by_age(ages: torch.Tensor) -> Counter:
    """Samples counted by age (`Trajectory.ages`)."""
    values, counts = ages.unique(return_counts=True)
    return Counter(dict(zip(values.tolist(), counts.tolist())))


class AsyncUpdates:
    def __init__(
        self,
        collector: Collector,
        actor: WorkerGroup,
        env: WorkerGroup,
        versions: PolicyVersions,
        interrupt: threading.Event | None,
        capacity: int,
        staleness_bound: int | None,
        total_env_steps: int,
        collected_steps: int,
        resets_each_collection: bool,
        updates_here: bool = False,
    ):
        self.collector, self.actor, self.env, self.versions = collector, actor, env, versions
        self.interrupt = interrupt  # the session's: once set, every wait of this thread gives up
        self.capacity, self.staleness_bound, self.total_env_steps = capacity, staleness_bound, total_env_steps
        self.collected_steps = collected_steps  # env steps the collections so far have taken
        self.resets_each_collection = resets_each_collection  # group-seeded resets (reset_group_size)
        self.updates_here = updates_here  # the actor trains in this thread (inline): its calls return done
        self.collections = versions.actor_version  # collections so far (a resumed run's: its iterations)
        self.queue: deque[Batch] = deque()
        self.training: InFlight | None = None
        self.samples_dropped = 0

    @classmethod
    def of_run(cls, backend: Backend, config: Config, versions: PolicyVersions, global_step: int) -> AsyncUpdates:
        """The overlapped loop of a run with `runner.asynchronous`, from where it stands (its
        env steps so far)."""
        runner = config.runner
        return cls(
            backend.collector.collector,
            backend.actor,
            backend.env,
            versions,
            backend.session.interrupt,
            runner.async_queue_batches,
            config.algorithm.staleness_bound,
            runner.total_env_steps,
            global_step,
            config.algorithm.resets_envs_each_iteration,
            backend.shares_policy,
        )

    # ------------------------------------------------------------------------------ the loop

    def next(self) -> Update | None:
        """Collect and train until one more update is done; its outcome, or None once the env-step
        budget is spent and every collected batch is trained or dropped."""
        while True:
            if self.training is not None and self.training_ready():
                return self.finish()
            if self.training is None and self.queue:
                self.submit(self.queue.popleft())
                continue
            if self.collected_steps < self.total_env_steps and len(self.queue) < self.capacity:
                self.queue.append(self.collect())
                continue
            if self.training is None:
                return None
            with phase(QUEUE_FULL if self.queue else DRAIN):
                return self.finish()

    def collect(self) -> Batch:
        started = time.perf_counter()
        with phase(COLLECT), self.update_failures():
            syncs = self.versions.refresh(wait=False)
            if self.resets_each_collection:
                self.collector.start(self.collections)
            trajectory = self.collector.collect()
            reports = self.env.get(self.env.call_all(EnvWorker.report))
        progress = self.collected_steps / self.total_env_steps
        self.collected_steps = sum(report["env_steps"] for report in reports)
        self.collections += 1
        return Batch(trajectory, progress, reports, time.perf_counter() - started, syncs)

    def submit(self, batch: Batch) -> None:
        """Start the update on `batch` on every actor rank (rank r on shard r), or drop it when
        it holds a sample older than the bound; then ask for the new version's weights."""
        trajectory = replace(batch.trajectory, ages=self.ages(batch.trajectory))
        ages = by_age(trajectory.ages)
        if self.staleness_bound is not None and max(ages) > self.staleness_bound:
            self.samples_dropped += batch.samples
            return
        actor, world = self.actor, self.actor.world_size
        submitted = time.perf_counter()
        if self.updates_here:  # a stop must not cut this thread's update in half: it waits for the record
            hold_stops()
        # Nor its submission: every rank gets the update and it is in flight, for a stop to settle
        # (a stop between two ranks' calls left one rank in the update's collectives alone)
        with stops_wait():
            futures = [
                actor.call(rank, ActorBase.train, trajectory.shard(rank, world), batch.progress)
                for rank in range(world)
            ]
            self.training = InFlight(batch, futures, ages, len(self.queue), submitted)
            self.versions.updated()
            self.versions.request()
        if not self.training_ready():
            self.training.watcher = threading.Thread(
                target=self.watch, args=(self.training,), name="fleetrl-update-watch", daemon=True
            )
            self.training.watcher.start()

    def ages(self, trajectory: Trajectory) -> torch.Tensor:
        """(T, N) each sample's age: the actor's version at the update's start minus the acting
        version (0 where none was recorded)."""
        if trajectory.versions is None:
            return torch.zeros(trajectory.rewards.shape, dtype=torch.int64)
        return self.versions.actor_version - trajectory.versions

    def training_ready(self) -> bool:
        return all(self.actor.ready(future) for future in self.training.futures)

    def finish(self) -> Update:
        """Wait for the update in flight (a failure raised at once) and return its outcome."""
        training = self.training
        with self.update_failures():
            metrics = self.actor.get(training.futures)[0]  # reduced across ranks: the same on each
            self.await_weights()
        self.training = None
        training.done.set()
        if training.watcher is not None:  # it ends at once: no thread of this loop outlives its update
            training.watcher.join()
        batch = training.batch
        timings = {
            "weight_syncs": batch.weight_syncs,
            "time_collect_s": batch.collect_s,
            "time_update_s": time.perf_counter() - training.submitted,  # as this thread saw it end
            "queue_depth": training.queue_depth,
            "policy_version": self.versions.actor_version,
            "rollout_version": self.versions.rollout_version,
            "env_steps_collected": self.collected_steps,
        }
        return Update(metrics, batch.reports, training.ages, timings)

    def await_weights(self) -> None:
        """Until the new version's weights, asked for right behind the update, are ready to load
        (not fetched here): the next collection then acts with them, so that a sample is never
        more than `async_queue_batches` + `weight_sync_interval` − 1 versions old."""
        requested = self.versions.requested
        if not requested or requested[-1].version != self.versions.actor_version:
            return  # not due (weight_sync_interval), or a shared policy
        while not self.actor.ready(requested[-1].futures[0]):
            if self.interrupt is not None and self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            time.sleep(WEIGHTS_POLL_S)

    def settle(self) -> Update | None:
        """The update in flight, once done — a stop or a checkpoint must not leave the actor's
        weights ahead of the iterations counted; None when there is none."""
        if self.training is None:
            return None
        with phase(DRAIN):
            return self.finish()

    def take_dropped(self) -> int:
        """Samples dropped since the last call (for the run's count)."""
        dropped, self.samples_dropped = self.samples_dropped, 0
        return dropped

    @property
    def in_flight_samples(self) -> int:
        """Samples collected and not trained: a checkpoint does not keep them."""
        return sum(batch.samples for batch in self.queue)

    # --------------------------------------------------------------- an update's failure, promptly

    def watch(self, training: InFlight) -> None:
        """In a thread of its own: should one of the update's calls fail while the main thread
        is inside a collection, keep the error and make the main thread's waits give up."""
        interrupt = self.interrupt
        while not training.done.is_set() and not (interrupt is not None and interrupt.is_set()):
            ready = [future for future in training.futures if self.actor.ready(future)]
            for future in ready:
                try:
                    self.actor.get(future)
                except Exception as error:  # the worker's error, or Ray's about the worker
                    training.failure.append(error)
                    if interrupt is not None:
                        interrupt.set()
                    return
            if len(ready) == len(training.futures):
                return
            training.done.wait(WATCH_SLICE_S)

    @contextlib.contextmanager
    def update_failures(self) -> Iterator[None]:
        """A wait that gave up because the update in flight failed raises the update's error
        (the incident's cause), not its own `Interrupted`."""
        try:
            yield
        except Interrupted:
            if self.training is not None and self.training.failure:
                raise self.training.failure[0] from None
            raise

"""One notion of a sample's age, shared by synchronous and asynchronous training.

A policy *version* counts the updates the actor has applied to its weights: 0 at the start, one
more per update (per iteration; a resumed run starts at its checkpoint's iteration). The rollout
workers act with the version they last loaded, and every decision they record carries it
(`Trajectory.versions`). A sample's *age* is the actor's version at the start of the update that
trains it minus the version that acted: 0 when the rollout acted with exactly the weights the
update starts from.

Two keys make samples old, and this is the one place that moves weights for both:
- `runner.weight_sync_interval` k: at a collection's start the rollout loads the actor's weights
  once they are k or more versions newer than its own (and always before its first collection:
  its own initial weights are not the actor's). Between loads its samples grow up to k − 1
  versions old; synchronous training with k = 1 trains only samples of age 0.
- `runner.asynchronous`: the actor trains batch j while the rollout collects the next ones (up to
  `runner.async_queue_batches` ahead); the actor is asked for its weights right after each update
  is queued, and the rollout loads the newest version whose weights are ready when a collection
  starts — it never waits for the actor — so samples are up to async_queue_batches + k − 1
  versions old (docs/concepts/async.md).
Where rollout and actor share the policy object (inline, fused ranks) nothing is sent: the
rollout's version is set to the actor's before each collection.

`runner.weight_sync: trainable` sends the full weights until a full set has been loaded, patches
(the trainable tensors) after that (parallel/weight_sync.py); `changed` sends what changed since
the actor's last answer (parallel/changed_values.py): deltas, so every one asked for is loaded,
in order, never only the newest.

How they travel (`Backend.sync_transport`): through Ray, the actor's answer handed to each
rollout worker's loader; or, where the backend formed the weight-sync group
(`runner.weight_sync_transport: collective`, parallel/sync_group.py), actor rank 0 prepares the
encoded bytes and answers with their header (`ActorBase.prepare_weights`), then broadcasts them
(`send_weights`) while every rollout worker receives them (`receive_weights`, given the header):
the rollout enters the broadcast only once the bytes are ready, so its wait there is the
transfer, not the actor's gather. Synchronous training waits for the loads (their errors are the
run's), which the collection's first step would wait for anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.cluster.backends.base import Backend
from fleetrl.cluster.groups import WorkerGroup
from fleetrl.config.schema import Config
from fleetrl.workers.actor_base import SYNC_GATHERS, ActorBase
from fleetrl.workers.rollout_worker import SYNC_LOADS, RolloutWorker


@dataclass(frozen=True)
class Requested:
    """Weights asked of the actor ranks: which version, which kind (`runner.weight_sync`'s full,
    trainable or changed; `SYNC_LOADS[kind]` loads them), the ranks' futures (rank 0's holds the
    weights, or with the collective transport their header; the others' are empty)."""

    version: int
    kind: str
    futures: list


class PolicyVersions:
    def __init__(
        self,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        shares_policy: bool,
        interval: int,
        mode: str = "full",
        version: int = 0,
        collective: bool = False,
    ):
        self.actor: WorkerGroup = actor
        self.rollout: WorkerGroup = rollout
        self.shares_policy: bool = shares_policy
        self.interval: int = interval
        self.mode: str = mode  # runner.weight_sync: full, trainable or changed
        self.collective: bool = collective  # over the weight-sync group, else through Ray
        self.actor_version: int = version  # once the calls queued on the actor so far have run
        self.rollout_version: int | None = None  # None: it has loaded nothing yet
        self.loaded_full: bool = False
        self.requested: list[Requested] = []  # weights asked for and not loaded, oldest first

    @classmethod
    def of_run(cls, backend: Backend, config: Config, version: int) -> PolicyVersions:
        """The versions of a run whose actor stands at `version` (its iterations so far)."""
        runner = config.runner
        return cls(
            backend.actor,
            backend.rollout,
            backend.shares_policy,
            runner.weight_sync_interval,
            runner.weight_sync,
            version,
            backend.sync_transport == "collective",
        )

    def updated(self) -> None:
        """One more update is queued on (or done by) the actor ranks."""
        self.actor_version += 1

    def age(self) -> int:
        """How many versions the rollout's weights lag the actor's (its samples' age, when
        trained next)."""
        return 0 if self.rollout_version is None else self.actor_version - self.rollout_version

    def due(self) -> bool:
        """The rollout must load the actor's current version at its next collection."""
        return self.rollout_version is None or self.actor_version - self.rollout_version >= self.interval

    def request(self) -> None:
        """Ask every actor rank for the current version's weights, if due and not asked yet: the
        call queues behind the actor's update, so asking never waits."""
        if self.shares_policy or not self.due():
            return
        if self.requested and self.requested[-1].version == self.actor_version:
            return
        if self.mode == "changed":  # the actor's first answer is the full weights, then changes
            kind = "changed"
        elif self.mode == "trainable" and self.loaded_full:  # frozen tensors are there already
            kind = "trainable"
        else:
            kind = "full"
        if self.collective:
            futures = self.actor.call_all(ActorBase.prepare_weights, kind)
        else:
            futures = self.actor.call_all(SYNC_GATHERS[kind])
        self.requested.append(Requested(self.actor_version, kind, futures))

    def refresh(self, wait: bool) -> int:
        """At a collection's start, the rollout workers take the newest version they can:
        with `wait` (synchronous training, and any rollout that has loaded nothing yet) the
        actor's current one when due; otherwise the newest asked for whose weights are ready
        (older ones are dropped unloaded). The load is queued before the collection's first
        `act`; with `wait` it has ended when this returns (a load's error is raised here), while
        asynchronous training's first load is only queued, as its later ones are.
        Returns how many rollout workers were sent weights."""
        if self.shares_policy:
            if self.rollout_version != self.actor_version:
                self.rollout.call_all(RolloutWorker.set_version, self.actor_version)
                self.rollout_version = self.actor_version
            return 0
        due = wait or self.rollout_version is None
        if due:
            self.request()
        ready = [r for r in self.requested if due or self.actor.ready(r.futures[0])]  # due: every one asked
        if not ready:
            return 0
        newest = ready[-1]
        self.requested = [r for r in self.requested if r.version > newest.version]
        loads = []
        for loading in ready if self.mode == "changed" else [newest]:  # changes are deltas: each, in order
            if self.collective:
                loads.append(self.actor.call(0, ActorBase.send_weights))
                loads += self.rollout.call_all(RolloutWorker.receive_weights, loading.futures[0])
            else:
                loads += self.rollout.call_all(SYNC_LOADS[loading.kind], loading.futures[0])
        self.rollout.call_all(RolloutWorker.set_version, newest.version)
        if wait:
            self.rollout.get(loads)
        self.rollout_version = newest.version
        self.loaded_full = self.loaded_full or newest.kind == "full"
        return self.rollout.world_size

"""Where the loop's updates come from: one `Update` per iteration, synchronous or not.

The loop (controller/loop.py) asks `next()` for the next update and records it, whichever
producer it chose: `SyncUpdates` — the weights the rollout is due, then one iteration collected and
trained (wherever collection happens: the controller, or each fused rank) — or, with
`runner.asynchronous`, `AsyncUpdates` (controller/async_updates.py), which overlaps collecting
with training. Both give the same record: the actor's metrics, the env workers' reports of the
batch trained on, its samples by age in policy versions (controller/policy_versions.py), and
timings.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from fleetrl.cluster.backends.base import Backend
from fleetrl.config.schema import Config
from fleetrl.controller.policy_versions import PolicyVersions
from fleetrl.probe.flight_recorder import phase
from fleetrl.run_state import RunState


@dataclass
class Update:
    """One update (an iteration) as the loop records it: the actor's metrics (reduced over its
    ranks), the env workers' reports of the batch it trained on (None: ask them now), the batch's
    samples by age, and the timings and counts for its record."""

    metrics: dict
    reports: list[dict] | None
    ages: Counter
    timings: dict


def staleness_fields(ages: Counter) -> dict:
    """A record's view of a batch's ages: their mean and maximum, in policy versions."""
    samples = sum(ages.values())
    return {
        "staleness_mean": sum(age * count for age, count in ages.items()) / samples if samples else 0.0,
        "staleness_max": max(ages, default=0),
    }


class Updates(Protocol):
    def next(self) -> Update | None:
        """The next update, trained; None once the env-step budget is spent."""

    def settle(self) -> Update | None:
        """On a stop: the update still in flight, once done (None: there is none)."""

    def take_dropped(self) -> int:
        """Samples dropped since the last call (`algorithm.max_staleness`)."""

    @property
    def in_flight_samples(self) -> int:
        """Samples collected and not trained (a checkpoint does not keep them)."""


class SyncUpdates:
    """Collect, then train: the rollout takes the weights it is due (`PolicyVersions.refresh`,
    waiting for them), the group-seeded resets run where the algorithm asks for them, then one
    iteration is collected and trained by the backend's collector. Its samples are all as old as
    the rollout's weights: 0 versions, or up to `runner.weight_sync_interval` − 1."""

    in_flight_samples = 0

    def __init__(self, backend: Backend, config: Config, versions: PolicyVersions, state: RunState):
        self.backend, self.config, self.versions, self.state = backend, config, versions, state

    def next(self) -> Update | None:
        state, config = self.state, self.config
        if state.global_step >= config.runner.total_env_steps:
            return None
        started = time.perf_counter()
        with phase("weight_sync"):
            weight_syncs = self.versions.refresh(wait=True)
        synced = time.perf_counter()
        age = self.versions.age()
        if config.algorithm.resets_envs_each_iteration:  # group-seeded resets (reset_group_size)
            self.backend.collector.start(state.iteration)
        # The schedule position is taken before this iteration's steps, so the last iteration
        # still learns (lr > 0) rather than running with an annealed-to-zero rate.
        with phase("collect_and_train"):
            metrics, collect_s = self.backend.collector.collect_and_train(
                state.global_step / config.runner.total_env_steps
            )
        self.versions.updated()
        timings = {
            "time_weight_sync_s": synced - started,
            "weight_syncs": weight_syncs,
            "time_collect_s": collect_s,
            "time_update_s": time.perf_counter() - synced - collect_s,
        }
        return Update(metrics, None, Counter({age: config.batch_size}), timings)

    def settle(self) -> None:
        return None  # nothing runs between two calls

    def take_dropped(self) -> int:
        return 0  # every sample is at most weight_sync_interval − 1 old, which the bound admits (plan/rules.py)

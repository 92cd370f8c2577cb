"""Env ⇄ rollout for T steps, pipelined over lanes.

A *lane* is one pipeline stage of one env worker, served by one rollout worker. For every step
the controller queues `rollout.act(lane, t, step)` then `env.step(actions, stage)` for each lane,
passing futures rather than waiting for results; each worker runs its calls in order as inputs
arrive, so while an env worker steps stage i, its rollout worker is already inferring stage i+1.
On the inline backend the same calls simply run one after another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetrl.trajectory import Trajectory
from fleetrl.workers.env_worker import StepResult


@dataclass(frozen=True)
class Lane:
    env_rank: int
    stage: int
    rollout_rank: int
    index: int  # position among the lanes of its rollout worker


def plan_lanes(env_world: int, rollout_world: int, stages: int) -> list[Lane]:
    """Env ranks are split into contiguous blocks, one block per rollout rank; lanes are listed
    in global env order (env rank, then stage), which is the order trajectories are joined in."""
    per_rollout = env_world // rollout_world
    lanes, next_index = [], [0] * rollout_world
    for env_rank in range(env_world):
        rollout_rank = env_rank // per_rollout
        for stage in range(stages):
            lanes.append(Lane(env_rank, stage, rollout_rank, next_index[rollout_rank]))
            next_index[rollout_rank] += 1
    return lanes


class Collector:
    def __init__(self, env_group, rollout_group, stages: int, steps: int):
        self.env, self.rollout, self.steps, self.stages = env_group, rollout_group, steps, stages
        self.lanes = plan_lanes(env_group.world_size, rollout_group.world_size, stages)
        self.pending: dict[Lane, object] = {}  # each lane's latest env outcome (a future)

    def start(self, epoch: int) -> None:
        """Reset every env worker; the reset observations open each lane."""
        observations = self.env.get(self.env.call_all("reset", epoch))
        for lane in self.lanes:
            stage_obs = np.split(observations[lane.env_rank], self.stages)[lane.stage]
            self.pending[lane] = StepResult.initial(stage_obs)

    def collect(self) -> Trajectory:
        for t in range(self.steps):
            for lane in self.lanes:
                actions = self.rollout.call(lane.rollout_rank, "act", lane.index, t, self.pending[lane])
                self.pending[lane] = self.env.call(lane.env_rank, "step", actions, lane.stage)
        closing = [
            self.rollout.call(lane.rollout_rank, "act", lane.index, self.steps, self.pending[lane])
            for lane in self.lanes
        ]
        self.rollout.get(closing)
        return Trajectory.concatenate(self.rollout.get(self.rollout.call_all("trajectory")))


def collect_then_train(
    collector: Collector, train: Callable[[Trajectory, float], dict], progress: float
) -> tuple[dict, float]:
    """One iteration: collect, then `train(trajectory, progress)`; returns the metrics and the
    seconds spent collecting."""
    started = time.perf_counter()
    trajectory = collector.collect()
    collect_s = time.perf_counter() - started
    return train(trajectory, progress), collect_s

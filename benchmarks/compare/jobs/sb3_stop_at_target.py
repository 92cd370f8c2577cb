"""What both SB3 jobs share (imported from beside them, inside benchmarks/.venvs/sb3): training
until a target return, their common arguments, and the record they write."""

from __future__ import annotations

import argparse
import time
from collections import deque

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from stable_baselines3.common.callbacks import BaseCallback


class StopAtTarget(BaseCallback):
    """Tracks the last-100 training-episode returns from the Monitor infos of every vector step
    (SB3's own ep_info_buffer is only updated *after* on_step, i.e. one step late) and stops
    learn() the moment their mean reaches the target, noting the step, the wall seconds since
    `t_train0` and this process's CPU seconds since `cpu0`."""

    def __init__(self, target: float, t_train0: float, cpu0: float):
        super().__init__()
        self.target, self.t_train0, self.cpu0 = target, t_train0, cpu0
        self.returns: deque[float] = deque(maxlen=100)
        self.episodes = 0
        self.reached_step: int | None = None
        self.reached_s: float | None = None
        self.reached_cpu_s: float | None = None
        self.reached_mean: float | None = None

    def _on_step(self) -> bool:
        ended = False
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                self.episodes += 1
                ended = True
        if ended and len(self.returns) == self.returns.maxlen:
            mean = float(np.mean(self.returns))
            if mean >= self.target:
                self.reached_s = time.perf_counter() - self.t_train0
                self.reached_cpu_s = time.process_time() - self.cpu0
                self.reached_step = int(self.num_timesteps)
                self.reached_mean = mean
                return False
        return True


def learn_until_target(model, target: float, total_timesteps: int) -> tuple[StopAtTarget, float]:
    """`model.learn()` until the last-100 mean reaches `target` or `total_timesteps` are done;
    returns the callback (what was reached, when) and learn()'s wall seconds."""
    callback = StopAtTarget(target, time.perf_counter(), time.process_time())
    model.learn(total_timesteps=total_timesteps, callback=callback)
    return callback, time.perf_counter() - callback.t_train0


def job_parser(total_timesteps: int, target: float) -> argparse.ArgumentParser:
    """The arguments every SB3 job takes (--spawn-time: the harness's time.time() at spawn)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total-timesteps", type=int, default=total_timesteps)
    parser.add_argument("--target", type=float, default=target)
    parser.add_argument("--spawn-time", type=float, default=None)
    parser.add_argument("--out", required=True)
    return parser


def run_to_target(model, args: argparse.Namespace, spawn: float) -> dict:
    """Learn until the target (see learn_until_target); the job's record: who, the versions,
    start-up (spawn → learn()) and the outcome."""
    startup_s = time.time() - spawn
    callback, train_total_s = learn_until_target(model, args.target, args.total_timesteps)
    return {
        "library": "sb3",
        "seed": args.seed,
        "versions": versions(),
        "torch_threads": torch.get_num_threads(),
        "startup_s": startup_s,
        **outcome(callback, model, train_total_s),
    }


def outcome(callback: StopAtTarget, model, train_total_s: float) -> dict:
    """The fields every SB3 job reports about its run to the target."""
    return {
        "target_return": callback.target,
        "target_reached": callback.reached_step is not None,
        "steps_to_target": callback.reached_step,
        "train_s_to_target": callback.reached_s,
        "train_cpu_s_to_target": callback.reached_cpu_s,
        "last100_at_target": callback.reached_mean,
        "train_s_total": train_total_s,
        "global_step": int(model.num_timesteps),
        "episodes": callback.episodes,
        "last100_final": float(np.mean(callback.returns)) if callback.returns else None,
    }


def versions() -> dict:
    return {
        "stable_baselines3": stable_baselines3.__version__,
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
    }

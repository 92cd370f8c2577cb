"""The run's state: what a run has done so far, saved as a checkpoint and restored on a resume.

`RunState` holds the loop's counters (iterations, env steps, episodes, training time) and the last
100 episodes' returns and lengths. A checkpoint (written atomically by checkpoint.py) holds them
with every actor rank's state (policy and optimizer; with `actor.checkpoint_format: sharded`, the
shards each rank wrote), every env worker's (normaliser statistics, counters), this process's
random streams and those of every actor rank and rollout worker (in processes of their own they
draw from their own: minibatch shuffles, action noise), so that a resumed run continues where
the saved one stopped, drawing what it would have drawn. `load_resumed` finds
a resume's newest intact checkpoint; `save_resume_config` keeps the config it continued with.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetrl.checkpoint import NoIntactCheckpoint, load_latest, save_checkpoint, staging_dir
from fleetrl.cluster.backends.base import Backend
from fleetrl.config.loader import save_config
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.parallel.seeds import random_state, set_random_state
from fleetrl.probe.flight_recorder import phase
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")
RECENT = 100  # episodes in the moving means (`episode_return_last100`, runner.target_return)
# The worker groups that draw random numbers in their own processes, and how to read and set them
WORKER_RANDOM_STATE = {
    "actor": (ActorBase.random_state, ActorBase.load_random_state),
    "rollout": (RolloutWorker.random_state, RolloutWorker.load_random_state),
}


def load_resumed(run_dir: Path, resume: str) -> dict:
    """The newest intact checkpoint of the run to continue; none intact is a config error on
    runner.resume naming each file and what is wrong with it (before anything has started)."""
    try:
        return load_latest(run_dir)
    except NoIntactCheckpoint as error:
        raise ConfigError(
            "runner.resume",
            resume,
            "a run directory holding an intact checkpoint",
            f"{error}. Name another run (runner.resume=<run dir>) or move {run_dir} away to start a new run",
        ) from None


def save_resume_config(config: Config, run_dir: Path) -> Path:
    """Keep a resume's resolved config as config-resume-<n>.yaml, once its checkpoint has loaded:
    config.yaml stays the one the run started with, and no failed resume changes the record."""
    n = 1
    while (run_dir / f"config-resume-{n}.yaml").exists():
        n += 1
    path = run_dir / f"config-resume-{n}.yaml"
    save_config(config, path)
    return path


def actor_state_of(backend: Backend) -> dict:
    """Actor rank 0's state (every rank is asked: FSDP gathers its shards collectively)."""
    actor = backend.actor
    return actor.get(actor.call_all(ActorBase.state_dict))[0]


def worker_random_states(backend: Backend) -> dict[str, list[dict]]:
    """Every actor rank's and rollout worker's random state, by rank: in processes of their own they
    draw from their own generators, which a resume must continue, not seed afresh."""
    states = {}
    for name, (get, _) in WORKER_RANDOM_STATE.items():
        group = getattr(backend, name)
        states[name] = group.get(group.call_all(get))
    return states


@dataclass
class RunState:
    """What the run has done so far, as of its last finished iteration; the loop (controller/
    loop.py) advances it, `save` makes it a checkpoint with the workers' own states, `load`
    restores all of it from one."""

    iteration: int = 0
    train_s: float = 0.0  # seconds spent in iterations (start-up and evaluation excluded)
    global_step: int = 0
    episodes: int = 0
    env_counters: list[dict] = field(default_factory=list)  # per env rank, as of the last finished iteration
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_lengths: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT))
    staleness: Counter = field(default_factory=Counter)  # samples trained, by age in policy versions
    samples_dropped: int = 0  # older than algorithm.max_staleness, or collected and never saved
    in_flight_samples: int = 0  # collected and not trained (asynchronous): a checkpoint does not keep them

    def mean_recent_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def count_update(self, ages: Counter, dropped: int, in_flight: int) -> None:
        """An update's samples by age, the samples dropped since the last one, and those
        collected and waiting for the actor now."""
        self.staleness.update(ages)
        self.samples_dropped += dropped
        self.in_flight_samples = in_flight

    def save(self, backend: Backend, run_dir: Path, config: Config) -> None:
        """The run's state as checkpoint `iteration`; with `actor.checkpoint_format: sharded`
        the actor ranks first write their shards (phase `checkpoint.dcp_save`)."""
        shards = None
        with phase("checkpoint.save"):
            if config.actor.checkpoint_format == "sharded":
                shards = staging_dir(run_dir, self.iteration)
                with phase("checkpoint.dcp_save"):
                    actor = backend.actor
                    actor_state = actor.get(actor.call_all(ActorBase.save_sharded, str(shards)))[0]
            else:
                actor_state = actor_state_of(backend)
            state = self.state_dict(backend, actor_state)
            save_checkpoint(run_dir, self.iteration, state, config.runner.keep_checkpoints, shards)

    def state_dict(self, backend: Backend, actor_state: dict | None = None) -> dict:
        return {
            "iteration": self.iteration,
            "train_s": self.train_s,
            "global_step": self.global_step,
            "episodes": self.episodes,
            "actor": actor_state_of(backend) if actor_state is None else actor_state,
            "env": self.env_states(backend),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "staleness": dict(self.staleness),
            "samples_dropped": self.samples_dropped,
            "in_flight_samples": self.in_flight_samples,  # not saved: dropped on a resume (docs: concepts/async.md)
            "rng": random_state(),
            "worker_rng": worker_random_states(backend),
        }

    def env_states(self, backend: Backend) -> list[dict]:
        """One state per env rank, with the counters of the last finished iteration: steps of an
        iteration cut short (Ctrl-C) were never trained on and must not count."""
        env = backend.env
        states = env.get(env.call_all(EnvWorker.state_dict))
        if self.env_counters:
            states = [{**state, **counters} for state, counters in zip(states, self.env_counters)]
        return states

    def load(self, backend: Backend, state: dict) -> None:
        """Restore `state`, a checkpoint's contents, into this object, the workers and the random streams."""
        actor, env = backend.actor, backend.env
        self.iteration, self.train_s = state["iteration"], state["train_s"]
        self.global_step, self.episodes = state["global_step"], state["episodes"]
        saved_actor = state["actor"]
        if "shards_path" in state:  # a sharded checkpoint: every rank reads the shards it needs
            saved_actor = {**saved_actor, "shards_path": state["shards_path"]}
        with phase("checkpoint.dcp_load" if "shards_path" in state else "checkpoint.load_actor"):
            actor.get(actor.call_all(ActorBase.load_state_dict, saved_actor))
        if len(state["env"]) != env.world_size:
            log.warning(
                "checkpoint has %d env worker states, this run %d: normaliser statistics start from env rank 0's",
                len(state["env"]),
                env.world_size,
            )
        env.get(
            [
                env.call(rank, EnvWorker.load_state_dict, state["env"][min(rank, len(state["env"]) - 1)])
                for rank in range(env.world_size)
            ]
        )
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.staleness.update(state.get("staleness", {}))  # .get: checkpoints from before versions were counted
        in_flight = state.get("in_flight_samples", 0)
        self.samples_dropped = state.get("samples_dropped", 0) + in_flight
        if in_flight:
            log.info(
                "%d samples were collected and not yet trained when checkpoint %d was taken: not saved, "
                "counted as dropped (their env steps are taken again)",
                in_flight,
                self.iteration,
            )
        for name, saved in state.get("worker_rng", {}).items():  # (checkpoints before it have none)
            group, load = getattr(backend, name), WORKER_RANDOM_STATE[name][1]
            # ranks the checkpoint has: a run resumed at more ranks seeds the others as a new run does
            group.get([group.call(rank, load, saved[rank]) for rank in range(min(group.world_size, len(saved)))])
        set_random_state(state["rng"])  # last: inline, the workers' state is this process's

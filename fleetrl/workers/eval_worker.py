"""The eval component: deterministic episodes of the current policy, on envs of its own.

An `EvalWorker` holds its own simulators (seeded `seed + i`; never the training envs, so
training's episodes, counters and random streams are untouched) and its own copy of the policy:
the algorithm's rollout worker, which knows how to load what the actor publishes
(`ActorBase.policy_weights`) and what a checkpoint holds. `run` loads the weights and env rank 0's
normaliser statistics (frozen here: `training=False`), resets the envs with the same seeds every
time, so that successive evaluations compare policies from the same start states, and plays a
fixed quota of episodes per env (`play`): short episodes cannot crowd out long ones, which would
bias the mean downwards.

One worker, one episode loop, for both users: `fleetrl eval` on a checkpoint (evaluate.py) and
evaluation during training (the `eval` component; `evaluate.EvalSchedule`). With the same seed a
checkpoint's `fleetrl eval` gives the returns its weights got during training. With `video` the
episodes are played one after another on one env and the first is filmed (rgb_array frames,
returned as GIF bytes: the worker may run on a node that cannot see the run directory).
"""

from __future__ import annotations

import io
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fleetrl.algos.registry import algorithm_spec
from fleetrl.config.schema import Config
from fleetrl.workers.env_worker import EnvWorker, success_metrics
from fleetrl.workers.rollout_worker import RolloutWorker

EVAL_SEED = 10_000  # the eval envs' seed: `fleetrl eval --seed`'s default, and during training
MAX_EVAL_ENVS = 10


class EvalWorker:
    def __init__(self, config: Config, episodes: int, seed: int = EVAL_SEED, video: bool = False):
        env_config = config.env
        if video:
            env_config = replace(env_config, kwargs={**env_config.kwargs, "render_mode": "rgb_array"})
        num_envs = 1 if video else min(episodes, MAX_EVAL_ENVS)
        self.episodes, self.video = episodes, video
        self.whole_games = config.env.wrappers == "atari"  # an env episode is one life: count games
        self.env = EnvWorker(
            env_config, config.algorithm.gamma, seed, num_envs=num_envs, training=False, chunk=config.model.action_chunk
        )
        self.rollout: RolloutWorker = (
            algorithm_spec(config.algorithm.name)
            .rollout_class()
            .from_config(config, self.env.observation_space, self.env.action_space)
        )

    @classmethod
    def for_training(cls, config: Config) -> EvalWorker:
        """The eval worker of a training run (`runner.eval_episodes`, `runner.eval_video`)."""
        return cls(config, config.runner.eval_episodes, EVAL_SEED, config.runner.eval_video)

    def run(self, weights, env_state: dict, deterministic: bool = True) -> dict:
        """Play `episodes` episodes with `weights` (the actor's `policy_weights`, or a checkpoint's
        'policy'); their return and length statistics, and the first one as GIF bytes (video).
        Under `env.wrappers: atari` the episodes are whole games and the returns their raw scores."""
        started = time.perf_counter()
        self.env.load_state_dict(env_state)
        self.rollout.load_weights(weights)
        returns, lengths, frames, successes, episodes = play(
            self.env, self.rollout, self.episodes, deterministic, self.video, self.whole_games
        )
        return {
            "episodes": len(returns),
            "unit": "game" if self.whole_games else "episode",
            "return_mean": float(np.mean(returns)),
            "return_std": float(np.std(returns)),
            "return_min": float(np.min(returns)),
            "return_max": float(np.max(returns)),
            "length_mean": float(np.mean(lengths)),
            "gif": encode_gif(frames) if frames else None,
            "eval_s": time.perf_counter() - started,
            **success_metrics(successes),  # where the env reports success
            "per_episode": episodes,
        }

    def close(self) -> None:
        self.env.close()


class Played(NamedTuple):
    """What `play` played: the episodes' returns and lengths, env 0's first episode's frames (with
    `film`), the (task, success) of the episodes where the env reports success, and one record
    per episode, in the order they ended: `env` (its index: env i was reset with seed + i),
    `episode` (its number on that env), `return`, `length`, and `task`, `success` where the env
    says (what `fleetrl eval --json` lists, so that every rate can be recomputed from it)."""

    returns: list[float]
    lengths: list[int]
    frames: list[np.ndarray]
    successes: list[tuple[str, bool]]
    episodes: list[dict]


def play(
    env: EnvWorker, rollout: RolloutWorker, episodes: int, deterministic: bool, film: bool, whole_games: bool = False
) -> Played:
    """`episodes` episodes (returns raw, unnormalised), each env playing its quota (`Played`).
    With `whole_games` (`env.wrappers: atari`, where an episode is one life and its reward
    clipped) an episode here is a whole game: its raw score (`EnvWorker.drain_games`) and its env
    steps over every life."""
    quota = np.full(env.num_envs, episodes // env.num_envs)
    quota[: episodes % env.num_envs] += 1
    done_count = np.zeros(env.num_envs, np.int64)
    game_length = np.zeros(env.num_envs, np.int64)  # env steps of each env's game so far, over its lives
    returns: list[float] = []
    lengths: list[int] = []
    frames: list[np.ndarray] = []
    successes: list[tuple[str, bool]] = []
    records: list[dict] = []
    obs = env.reset()
    env.drain_episodes(), env.drain_games(), env.drain_successes()  # earlier plays' leftovers are not this play's
    while (done_count < quota).any():
        if film and done_count[0] == 0:
            frames.append(env.stages[0].call("render")[0])
        actions, _, _ = rollout.infer(obs, deterministic)
        step = env.step(rollout.env_actions(actions).numpy())
        ended = np.flatnonzero(step.terminated | step.truncated)
        finished, finished_lengths = env.drain_episodes()  # in env order
        outcomes = {index: (task, flag) for index, task, flag in env.drain_successes()}
        successes.extend(outcome for index, outcome in outcomes.items() if done_count[index] < quota[index])
        if whole_games:
            game_length[ended] += np.asarray(finished_lengths, np.int64)
            ends = [(index, score, int(game_length[index])) for index, score in env.drain_games()]
            game_length[[index for index, _, _ in ends]] = 0
        else:
            ends = list(zip(ended, finished, finished_lengths))
        for index, episode_return, length in ends:
            if done_count[index] < quota[index]:
                returns.append(episode_return)
                lengths.append(length)
                record = {"env": int(index), "episode": int(done_count[index]), "return": float(episode_return)}
                record["length"] = int(length)
                if index in outcomes:
                    record["task"], record["success"] = outcomes[index]
                records.append(record)
            done_count[index] += 1
        obs = step.obs
    return Played(returns, lengths, frames, successes, records)


def encode_gif(frames: list[np.ndarray], fps: int = 30) -> bytes:
    from PIL import Image  # Pillow comes with matplotlib

    images = [Image.fromarray(frame) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)
    return buffer.getvalue()


def save_gif(gif: bytes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gif)
    return path

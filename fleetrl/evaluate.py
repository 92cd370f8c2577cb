"""`fleetrl eval`: the saved policy's mean ± std return over N episodes.

Each sub-env plays a fixed quota of episodes, so short episodes cannot crowd out long ones (which
would bias the mean downwards). Normalisation statistics come from the checkpoint and stay frozen.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fleetrl.algos.registry import algorithm_spec
from fleetrl.checkpoint import load_latest
from fleetrl.config.loader import load_config
from fleetrl.errors import UserError
from fleetrl.run_dir import CONFIG_FILE
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

MAX_EVAL_ENVS = 10


def evaluate(
    run_dir: Path, episodes: int, deterministic: bool = True, seed: int = 10_000, video_dir: Path | None = None
) -> dict:
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{run_dir} is not a fleetrl run directory (no {CONFIG_FILE})")
    if episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {episodes}")
    started = time.perf_counter()
    config = load_config(run_dir / CONFIG_FILE)
    if config.runner.torch_threads:
        torch.set_num_threads(config.runner.torch_threads)
    state = load_latest(run_dir)
    env_config = config.env
    if video_dir is not None:
        env_config = replace(env_config, kwargs={**env_config.kwargs, "render_mode": "rgb_array"})
    num_envs = 1 if video_dir is not None else min(episodes, MAX_EVAL_ENVS)
    env = EnvWorker(env_config, config.algorithm.gamma, seed, num_envs=num_envs, training=False)
    env.load_state_dict(state["env"][0])  # env rank 0's normaliser statistics
    # the algorithm's own rollout worker plays: it knows its policy and how to load it
    rollout = algorithm_spec(config.algorithm.name).rollout.from_config(config, env.observation_space, env.action_space)
    rollout.load_weights(state["actor"]["policy"])
    try:
        returns = play(env, rollout, episodes, deterministic, video_dir)
    finally:
        env.close()
    return {
        "run_dir": str(run_dir),
        "episodes": len(returns),
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "min": float(np.min(returns)),
        "max": float(np.max(returns)),
        "deterministic": deterministic,
        "eval_s": time.perf_counter() - started,
    }


def play(
    env: EnvWorker, rollout: RolloutWorker, episodes: int, deterministic: bool, video_dir: Path | None
) -> list[float]:
    quota = np.full(env.num_envs, episodes // env.num_envs)
    quota[: episodes % env.num_envs] += 1
    done_count = np.zeros(env.num_envs, np.int64)
    returns: list[float] = []
    frames: list[np.ndarray] = []
    obs = env.reset()
    while (done_count < quota).any():
        if video_dir is not None and done_count[0] == 0:  # film the first episode
            frames.append(env.stages[0].call("render")[0])
        actions, _, _ = rollout.infer(obs, deterministic)
        step = env.step(actions.numpy())
        ended = step.terminated | step.truncated
        finished, _ = env.drain_episodes()  # raw returns, in env order
        for index, episode_return in zip(np.flatnonzero(ended), finished):
            if done_count[index] < quota[index]:
                returns.append(episode_return)
        done_count += ended
        obs = step.obs
    if frames:
        write_gif(frames, video_dir / "episode.gif")
    return returns


def write_gif(frames: list[np.ndarray], path: Path, fps: int = 30) -> None:
    from PIL import Image  # Pillow comes with matplotlib

    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)

"""Demonstrations: a scripted expert's episodes on disk, for the supervised stage (`fleetrl sft`).

The format is a folder anyone can read with NumPy and a text editor — no fleetrl needed:

    index.json            {"format", "env": {"id", "kwargs"}, "attempted", "episodes": [...]}
    episode_00000.npz     obs.<key> (T, ...) for each observation key, actions (T, A), rewards (T,)

Each `episodes` entry names its file, reset seed, task, instruction, length and success. The
observations are stored as the policy sees them (`envs.text.ArrayObservations`: the instruction
as word ids, the image uint8), so the ids are valid only for the env they were recorded on: the
index keeps `env` and loading checks it against the run's `env` section. Only successful
episodes are kept (`attempted` counts the others too): behaviour cloning copies what works.

Why .npz plus JSON rather than Parquet or HDF5: per-episode files append without rewriting a
table, the arrays keep their dtype and shape (images stay uint8 (T, H, W, 3)), and nothing beyond
NumPy is needed to read them, in fleetrl or elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetrl.config.schema import EnvConfig
from fleetrl.errors import ConfigError, UserError

FORMAT = "fleetrl-demonstrations/1"
INDEX = "index.json"


@dataclass
class Demonstrations:
    """Every step of every episode, concatenated: what behaviour cloning samples from."""

    obs: dict[str, np.ndarray]  # (N, ...) per key
    actions: np.ndarray  # (N, A) float32; with chunks of K (N, K, A): the K actions from each step on
    returns: np.ndarray  # (N,) float32: the discounted return from each step to its episode's end
    episodes: int
    steps: np.ndarray | None = None  # (N,) int64 with chunks: how many of the K actions the expert took

    def __len__(self) -> int:
        return len(self.actions)


def env_record(config: EnvConfig) -> dict:
    return {"id": config.id, "kwargs": config.kwargs}


def record(config: EnvConfig, episodes: int, out: Path, seed: int = 0, max_attempts: int | None = None) -> dict:
    """Play the scripted expert of `config`'s env until `episodes` successful episodes are kept
    (reset seeds seed, seed + 1, ...; at most `max_attempts`, default 3 × episodes); the index."""
    from fleetrl.envs.make import env_factory

    env = env_factory(config)()
    if not callable(getattr(env.unwrapped, "expert_action", None)):
        env.close()
        raise ConfigError(
            "env.id",
            config.id,
            "an env with a scripted expert (an `expert_action()` method): "
            "fleetrl.envs.manipulation:PandaTasks, fleetrl.envs.metaworld_tasks:MetaWorldTasks",
        )
    out = Path(out)
    if (out / INDEX).exists():
        raise UserError(f"{out} already holds demonstrations ({INDEX}): choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    index = {"format": FORMAT, "env": env_record(config), "attempted": 0, "episodes": []}
    try:
        for attempt_seed in range(seed, seed + (max_attempts or 3 * episodes)):
            if len(index["episodes"]) == episodes:
                break
            index["attempted"] += 1
            entry = play_expert(env, attempt_seed, out / f"episode_{len(index['episodes']):05d}.npz")
            if entry is not None:
                index["episodes"].append(entry)
    finally:
        env.close()
    (out / INDEX).write_text(json.dumps(index, indent=1))
    return index


def play_expert(env, seed: int, path: Path) -> dict | None:
    """One expert episode from `seed`, written to `path` if it succeeds (its index entry)."""
    simulator = env.unwrapped
    obs, info = env.reset(seed=seed)
    steps: list[dict] = []
    actions, rewards = [], []
    done, success = False, False
    while not done:
        action = simulator.expert_action()
        steps.append(obs)
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        done, success = terminated or truncated, info["success"]
    if not success:
        return None
    arrays = {f"obs.{key}": np.stack([step[key] for step in steps]) for key in steps[0]}
    np.savez_compressed(path, **arrays, actions=np.stack(actions), rewards=np.asarray(rewards, np.float32))
    return {
        "file": path.name,
        "seed": seed,
        "task": info["task"],
        "instruction": simulator.instruction,
        "length": len(actions),
        "success": True,
    }


def read_index(path: str | Path, config: EnvConfig, key: str = "algorithm.demonstrations") -> dict:
    """The index of the demonstrations in folder `path`, checked against the run's env section:
    a missing folder, a foreign format, another env or no episode is a `ConfigError` at `key`."""
    folder = Path(path)
    if not (folder / INDEX).is_file():
        raise ConfigError(key, str(path), f"a folder of demonstrations holding {INDEX} (fleetrl record)")
    index = json.loads((folder / INDEX).read_text())
    if index.get("format") != FORMAT:
        raise ConfigError(key, str(path), f"demonstrations in the format {FORMAT}", f"it says {index.get('format')}")
    if index["env"] != env_record(config):
        raise ConfigError(
            key,
            str(path),
            f"demonstrations recorded on this run's env {env_record(config)}",
            f"they were recorded on {index['env']}",
        )
    if not index["episodes"]:
        raise ConfigError(key, str(path), "at least one successful episode", "the index lists none")
    return index


def load(path: str | Path, config: EnvConfig, gamma: float, chunk: int = 1) -> Demonstrations:
    """The demonstrations in folder `path` (checked: `read_index`), their returns discounted with
    `gamma`; with `chunk` K > 1 (`model.action_chunk`) each step's action is the chunk of the K
    actions the expert took from it on (`chunked`)."""
    folder = Path(path)
    index = read_index(path, config)
    obs: dict[str, list] = {}
    actions, returns, steps = [], [], []
    for entry in index["episodes"]:
        with np.load(folder / entry["file"]) as data:
            for name in data.files:
                if name.startswith("obs."):
                    obs.setdefault(name[4:], []).append(data[name])
            episode_actions = data["actions"].astype(np.float32)
            returns.append(discounted(data["rewards"], gamma))
        if chunk > 1:
            episode_actions, episode_steps = chunked(episode_actions, chunk)
            steps.append(episode_steps)
        actions.append(episode_actions)
    return Demonstrations(
        {name: np.concatenate(parts) for name, parts in obs.items()},
        np.concatenate(actions),
        np.concatenate(returns).astype(np.float32),
        len(index["episodes"]),
        np.concatenate(steps) if chunk > 1 else None,
    )


def chunked(actions: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode's (T, A) actions → (T, K, A) chunks, row t holding actions t … t+K−1, and (T,)
    how many of them exist: fewer than K in the episode's last K−1 steps, where the rest are
    zeros — a chunk cut short by the episode's end, as in RL (the loss counts only the first k)."""
    length = len(actions)
    padded = np.concatenate([actions, np.zeros((chunk - 1, *actions.shape[1:]), actions.dtype)])
    windows = np.stack([padded[t : t + chunk] for t in range(length)])
    return windows, np.minimum(chunk, length - np.arange(length)).astype(np.int64)


def discounted(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go of each step of one episode."""
    out = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out

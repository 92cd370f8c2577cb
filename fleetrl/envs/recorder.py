"""`fleetrl record`: a scripted expert's successful episodes, written as a LeRobotDataset v3.0.

Any env can be recorded whose unwrapped simulator has the method `expert_action() -> action` (the
scripted expert's action in the current state: `PandaTasks` has one) and whose `metadata` gives
its steps per second as `render_fps` (the dataset's fps). The observations are recorded raw, as
the simulator gives them, named by `demonstrations.feature_names`: the instruction is LeRobot's
`task`, a camera `observation.images.<key>`, any other array `observation.<key>`. Each step also
has its `action`, and the `next.reward`, `next.done` and `next.success` that followed it, as
LeRobot's simulation datasets have them.

The episodes start from reset seeds `seed`, `seed + 1`, ...: the same command writes the same
folder, byte for byte (`lerobot.writer`). Only successful episodes are kept (behaviour cloning
copies what works); `meta/fleetrl_recording.json` says which seeds they came from, which env and
how many were attempted, so that anyone can play them again. Every attempted seed is played to its
end, in order, kept or not (PyBullet carries solver state across resets), so a task's episodes do
not depend on the other tasks' counts: with per-task counts (`task_episodes`), n episodes of task T
are the first n of T that a recording with more of T keeps (same env, same first seed), from the
same seeds, frame for frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from fleetrl.config.schema import EnvConfig
from fleetrl.envs.demonstrations import feature_names, leaves_of
from fleetrl.errors import ConfigError, UserError, nearest
from fleetrl.lerobot import layout
from fleetrl.lerobot.features import IMAGE_NAMES
from fleetrl.lerobot.reader import TASK
from fleetrl.lerobot.writer import DatasetWriter
from fleetrl.observations import is_image

RECORDING = "meta/fleetrl_recording.json"  # what was played to make the dataset (fleetrl's own, beside LeRobot's)


@dataclass
class Recording:
    """What `record` kept: successful episodes per task, of how many attempted."""

    wanted: dict[str, int] = field(default_factory=dict)  # episodes to keep of each task (empty: of any task)
    kept: dict[str, int] = field(default_factory=dict)
    attempted: int = 0
    seeds: list[int] = field(default_factory=list)  # the reset seed of each kept episode, in order

    def summary(self, episodes: int) -> str:
        """One line: what was kept of how many attempted, and which count fell short (of `episodes`
        without per-task counts)."""
        counts = ", ".join(f"{task} {count}" for task, count in sorted(self.kept.items()))
        line = f"{len(self.seeds)} successful episodes of {self.attempted} attempted ({counts})"
        if not self.wanted:
            return line + (f"; fewer than the {episodes} asked for" if len(self.seeds) < episodes else "")
        short = [f"{task} {self.kept[task]} of {n}" for task, n in sorted(self.wanted.items()) if self.kept[task] < n]
        return line + (f"; fewer than asked for: {', '.join(short)}" if short else "")


def record(
    config: EnvConfig,
    episodes: int,
    out: Path,
    seed: int = 0,
    per_task: bool = False,
    task_episodes: Mapping[str, int] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Recording:
    """Play `config`'s env's scripted expert from reset seeds seed, seed + 1, ... until `episodes`
    successful episodes are kept (with `per_task`, `episodes` of each task the env has: its
    `task_names`, or `task_episodes[task]` of the tasks it names), at most 3 × as many attempts
    (per task: 3 × the largest count × the number of tasks, as each reset draws its task); write
    them to the folder `out` (LeRobot v3.0)."""
    from fleetrl.envs.make import simulator_factory

    out = Path(out)
    if task_episodes and not per_task:
        raise UserError("--task-episodes counts episodes per task: add --per-task")
    if (out / layout.INFO).exists():
        raise UserError(f"{out} already holds a dataset ({layout.INFO}): choose another --out")
    env = simulator_factory(config)()
    try:
        simulator = env.unwrapped
        check_recordable(config, env, per_task)
        wanted = task_counts(config.id, list(simulator.task_names), episodes, task_episodes) if per_task else {}
        total = sum(wanted.values()) if per_task else episodes
        writer = DatasetWriter(out, int(env.metadata["render_fps"]), declare(env), env.metadata.get("robot_type"))
        recording = Recording(wanted=wanted, kept=dict.fromkeys(wanted, 0))
        # a task drawn once in len(wanted) resets needs about that many attempts per episode kept
        attempts = 3 * (max(wanted.values()) * len(wanted) if per_task else episodes)
        for attempt_seed in range(seed, seed + attempts):
            if len(recording.seeds) == total:
                break
            recording.attempted += 1
            played = play_expert(env, attempt_seed, config.id)
            if played is None:
                continue
            task_name, frames, task = played
            if per_task and recording.kept[task_name] == wanted[task_name]:
                continue
            writer.add_episode(frames, task)
            recording.kept[task_name] = recording.kept.get(task_name, 0) + 1
            recording.seeds.append(attempt_seed)
            progress(
                f"episode {len(recording.seeds)}/{total}: {task_name}, {len(frames['action'])} steps (seed {attempt_seed})"
            )
    finally:
        env.close()
    if not recording.seeds:
        raise UserError(f"the expert succeeded in none of {recording.attempted} episodes: nothing written to {out}")
    writer.close()
    layout.write_json(
        {
            "env": {"id": config.id, "kwargs": config.kwargs},
            "first_seed": seed,
            "attempted": recording.attempted,
            "episode_seeds": recording.seeds,
        },
        out / RECORDING,
    )
    return recording


def parse_task_episodes(text: str) -> dict[str, int]:
    """--task-episodes' value, TASK=N[,TASK=N...] with each N >= 1, as {task: N}."""
    counts: dict[str, int] = {}
    for item in text.split(","):
        name, equals, count = (part.strip() for part in item.partition("="))
        if not (name and equals and count.isdigit() and int(count) >= 1) or name in counts:
            raise UserError(
                f"--task-episodes: got {text!r} (at {item!r}); expected TASK=N[,TASK=N...], each task once, "
                "each N an integer >= 1, e.g. door-open-v3=3,window-open-v3=3"
            )
        counts[name] = int(count)
    return counts


def task_counts(
    env_id: str, tasks: list[str], episodes: int, task_episodes: Mapping[str, int] | None
) -> dict[str, int]:
    """Episodes to keep of each of `tasks`: `episodes`, or what `task_episodes` (--task-episodes)
    gives a task; a name there that is not one of `tasks` is a user error naming the valid ones."""
    task_episodes = dict(task_episodes or {})
    for name in task_episodes:
        if name not in tasks:
            hint = nearest(name, tasks)
            raise UserError(
                f"--task-episodes: {name!r} is not a task of {env_id}"
                + (f" ({hint})" if hint else "")
                + f"; its tasks: {', '.join(tasks)}"
            )
    return {task: task_episodes.get(task, episodes) for task in tasks}


def check_recordable(config: EnvConfig, env: gym.Env, per_task: bool) -> None:
    """A user error unless the env has a scripted expert, a step rate and (`per_task`) task names."""
    simulator = env.unwrapped
    if not callable(getattr(simulator, "expert_action", None)):
        raise ConfigError(
            "env.id",
            config.id,
            "an env with a scripted expert: an expert_action() method on its simulator "
            "(fleetrl.envs.manipulation:PandaTasks has one)",
        )
    if not env.metadata.get("render_fps"):
        raise ConfigError("env.id", config.id, "an env whose metadata['render_fps'] gives its steps per second")
    if per_task and not getattr(simulator, "task_names", None):
        raise UserError(f"--per-task needs an env that lists its tasks (task_names); {config.id} does not")


def declare(env: gym.Env) -> dict[str, dict]:
    """The dataset's features (LeRobot declarations) from the simulator's spaces."""
    leaves = leaves_of(env.observation_space)
    features = {}
    for key, name in feature_names(env.observation_space).items():
        leaf = leaves[key]
        if name == TASK:
            continue
        if is_image(leaf):
            features[name] = {"dtype": "image", "shape": list(leaf.shape), "names": IMAGE_NAMES}
        else:
            features[name] = {"dtype": stored_dtype(leaf), "shape": list(leaf.shape) or [1], "names": None}
    action = env.action_space
    features["action"] = {"dtype": stored_dtype(action), "shape": list(action.shape) or [1], "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
    return features


def stored_dtype(space: gym.Space) -> str:
    dtype = np.dtype(space.dtype)
    return "float32" if dtype.kind == "f" else dtype.name


def play_expert(env: gym.Env, seed: int, env_id: str) -> tuple[str, dict[str, np.ndarray], str] | None:
    """One expert episode from `seed`: (its task's name, its frames by feature, its task text), or
    None if it did not succeed. The task text is the text observation's (the instruction) or,
    without one, the task's name (`info["task"]`) or the env's id."""
    space = env.observation_space
    names = feature_names(space)
    obs, info = env.reset(seed=seed)
    observations, actions, rewards, dones, successes = [], [], [], [], []
    done = False
    while not done:
        action = np.asarray(env.unwrapped.expert_action())
        observations.append(obs if isinstance(space, gym.spaces.Dict) else {None: obs})
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        rewards.append(reward)
        dones.append(done)
        successes.append(bool(info.get("success", False)))
    if not successes[-1]:
        return None
    frames = {}
    for key, name in names.items():
        if name != TASK:
            values = np.stack([step[key] for step in observations])
            frames[name] = values.astype(np.float32) if values.dtype.kind == "f" else values
    texts = [observations[0][key] for key, name in names.items() if name == TASK]
    task_name = str(info.get("task", env_id))
    frames["action"] = np.stack(actions).astype(stored_dtype(env.action_space))
    frames["next.reward"] = np.asarray(rewards, np.float32)
    frames["next.done"] = np.asarray(dones, bool)
    frames["next.success"] = np.asarray(successes, bool)
    return task_name, frames, str(texts[0]) if texts else task_name

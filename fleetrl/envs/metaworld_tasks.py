"""`env.id: fleetrl.envs.metaworld_tasks:MetaWorldTasks` — Meta-World v3's task suites as one env.

Meta-World (Yu et al. 2019; the `metaworld` package, 3.1.1, `pip install 'fleetrl[metaworld]'`) is
50 tasks of a Sawyer arm on one table, with a scripted expert for each. `tasks` picks a suite:
`MT10` (the default), `MT50`, ML10's and ML45's splits (`ML10-train`, `ML10-test`, `ML45-train`,
`ML45-test`), or a list of task names (`[push-v3, reach-v3]`).

Each reset picks one task and its start state from the env's random stream, which the reset's seed
fixes: a group of envs reset with one seed (for group-relative advantages) plays the same task from
the same start in every member.
Tasks come in shuffled rounds (every task once per round, in an order drawn at the round's start),
so an env that plays k rounds of episodes plays each task k times: 500 evaluation episodes on 10
envs are exactly 50 per MT10 task. The start state is Meta-World's own draw (its object and goal
positions, `_random_reset_space`), from a generator this env seeds: Meta-World's benchmarks fix 50
of them per task, this env draws a new one every episode, so held-out seeds are held-out states.

Observations, a Dict:
- `instruction`: the task in words, one of its three training phrasings (drawn per episode), or
  with `instructions="held_out"` the fourth, never trained on (`metaworld_instructions`). The
  space declares all 200 sentences of the 50 tasks: one vocabulary for every suite;
- `proprio`: the end effector's position and the gripper's opening (4 floats);
- `observation: state` (default): `state`, Meta-World's object and goal state — the objects'
  positions and quaternions, the previous frame's hand and objects, the goal (35 floats). The goal
  is zeros where the suite hides it (ML, as Meta-World does; `goal_observable` overrides);
- `observation: pixels`: `image`, the `cameras[0]` view (`corner` by default), (image_size,
  image_size, 3) uint8, and `image2` for a second camera; `critic_state: true` adds `state` for an
  asymmetric critic (`model.critic_keys: [state]`). Rendered off-screen (`mujoco_camera`).

Actions: Meta-World's Box(-1, 1, (4,)): the hand's displacement (x, y, z; ×1 cm) and the gripper.
An episode ends on the step `info["success"]` (Meta-World's own test) first holds, or at its task's
limit (`max_steps`: one for all, or `{task: steps}`; Meta-World's is 500). `info` has `success`
and `task`.

Rewards (`reward`):
- `sparse`: 1 on the step the task succeeds, else 0;
- `dense`: Meta-World's own reward (its v2 shaping, 0-10 a step) / 10, and on the success step
  also 1 for each step left to the limit: what staying at the goal would have paid. Ending the
  episode there then never pays less than going on, so the best policies are the ones that
  would be best without the ending.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.manipulation import InstructionSpace, time_limits
from fleetrl.envs.metaworld_instructions import INSTRUCTIONS, TRAINING_PHRASINGS, all_sentences
from fleetrl.errors import ConfigError, nearest

SUITES = ("MT10", "MT50", "ML10-train", "ML10-test", "ML45-train", "ML45-test")
OBSERVATIONS = ("state", "pixels")
REWARDS = ("sparse", "dense")
INSTRUCTION_SETS = ("train", "held_out")
PROPRIO_SIZE = 4  # hand position (3), gripper opening (1)
STATE_SIZE = 35  # Meta-World's 39-float observation less the hand: objects (14), previous frame (18), goal (3)
DENSE_MAX = 10.0  # Meta-World's reward per step at its best: the dense reward's unit
MAX_CAMERAS = 2


def suite(name: str) -> tuple[list[str], bool]:
    """A suite's task names, in Meta-World's order, and whether its goal is observed (MT: yes;
    ML: no, the meta-learner must find it)."""
    from metaworld import env_dict  # the metaworld extra

    if name == "MT10":
        return list(env_dict.MT10_V3), True
    if name == "MT50":
        return list(env_dict.MT50_V3), True
    family, split = name.split("-")
    return list((env_dict.ML10_V3 if family == "ML10" else env_dict.ML45_V3)[split]), False


def resolve_tasks(tasks: str | list[str]) -> tuple[list[str], bool]:
    """`tasks` (a suite's name or task names) → the task names and whether the goal is observed."""
    if isinstance(tasks, str):
        if tasks not in SUITES:
            raise ConfigError(
                "env.kwargs.tasks", tasks, f"one of {list(SUITES)} or a list of tasks", nearest(tasks, SUITES)
            )
        return suite(tasks)
    names = list(tasks)
    unknown = [name for name in names if name not in INSTRUCTIONS]
    if unknown or not names or len(set(names)) != len(names):
        hint = nearest(unknown[0], INSTRUCTIONS) if unknown else "each task once"
        raise ConfigError("env.kwargs.tasks", names, f"a suite {list(SUITES)} or Meta-World v3 task names", hint)
    return names, True


def choose(key: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ConfigError(key, value, f"one of {list(options)}", nearest(str(value), options))
    return value


def build_task(name: str, limit: int):
    """Meta-World's env of task `name`, its goal in the observation (this env hides it itself), its
    start states drawn from its own `np_random` (which `MetaWorldTasks.reset` seeds)."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    env = ALL_V3_ENVIRONMENTS[name]()
    env._partially_observable = False  # Meta-World zeros the goal otherwise; ML hides it here
    del env.sawyer_observation_space  # a cached property: recomputed with the goal's bounds
    env._set_task_called = True  # no `Task` object: the start state is drawn per reset instead
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True  # from env.np_random, not NumPy's global generator
    env.max_path_length = limit
    return env


@dataclass
class TaskEnv:
    """One task's Meta-World env, the (task, step limit) it was built for, and the cameras built on
    its scene (by camera names and size)."""

    key: tuple[str, int]
    env: Any
    cameras: dict[tuple, Any] = field(default_factory=dict)

    def close(self) -> None:
        for camera in self.cameras.values():
            camera.close()
        self.env.close()


class TaskEnvPool:
    """This process's task envs that no `MetaWorldTasks` holds, by (task, step limit).

    A `MetaWorldTasks` plays one task at a time: it holds one task env, taken here when a reset
    changes its task and given back at the next change. Kept per env instead, the scenes added up
    to num_envs x tasks MuJoCo scenes of ~20 MiB each (MT10 on 128 envs: ~25 GB, past this host's
    memory); shared, a process holds about as many of a task's scenes as its envs play at once.
    Each reset seeds the task env and Meta-World's reset sets its scene from that seed, so which
    object plays an episode changes nothing (tests/test_metaworld.py). Envs of one process may be
    stepped from threads: taking and giving are locked. The last `MetaWorldTasks` of the process
    to close closes the pool's envs."""

    def __init__(self) -> None:
        self.idle: defaultdict[tuple[str, int], list[TaskEnv]] = defaultdict(list)
        self.users = 0
        self.lock = threading.Lock()

    def take(self, name: str, limit: int) -> TaskEnv:
        with self.lock:
            idle = self.idle[(name, limit)]
            if idle:
                return idle.pop()
        return TaskEnv((name, limit), build_task(name, limit))  # built outside the lock: ~0.1-0.3 s

    def give(self, held: TaskEnv) -> None:
        with self.lock:
            self.idle[held.key].append(held)

    def join(self) -> None:
        with self.lock:
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users:
                return
            closing = [held for idle in self.idle.values() for held in idle]
            self.idle.clear()
        for held in closing:
            held.close()


POOL = TaskEnvPool()


class MetaWorldTasks(gym.Env):
    """See the module docstring. Task envs (one MuJoCo model each) and their cameras are built on
    a task's first episode (a constructor over MT50 would otherwise compile 50 models), and shared
    with the process's other instances through `POOL`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}  # Meta-World's: 5 physics steps of 2.5 ms

    def __init__(
        self,
        tasks: str | list[str] = "MT10",
        observation: str = "state",
        image_size: int = 64,
        cameras: tuple[str, ...] | list[str] = ("corner",),
        max_steps: int | dict[str, int] = 500,
        reward: str = "sparse",
        instructions: str = "train",
        goal_observable: bool | None = None,
        critic_state: bool = False,
        render_mode: str | None = None,
    ):
        self.task_names, suite_goal = resolve_tasks(tasks)
        self.goal_observable = suite_goal if goal_observable is None else bool(goal_observable)
        self.pixels = choose("env.kwargs.observation", observation, OBSERVATIONS) == "pixels"
        self.dense = choose("env.kwargs.reward", reward, REWARDS) == "dense"
        self.held_out = choose("env.kwargs.instructions", instructions, INSTRUCTION_SETS) == "held_out"
        self.limits = time_limits(self.task_names, max_steps)
        if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 8:
            raise ConfigError("env.kwargs.image_size", image_size, "an integer of at least 8 (pixels a side)")
        self.camera_names = list(cameras)
        if not 1 <= len(self.camera_names) <= MAX_CAMERAS:
            raise ConfigError(
                "env.kwargs.cameras", self.camera_names, "one or two of the model's cameras, e.g. [corner]"
            )
        self.image_size, self.render_mode = image_size, render_mode
        spaces: dict[str, gym.Space] = {
            "instruction": InstructionSpace(all_sentences()),
            "proprio": gym.spaces.Box(-np.inf, np.inf, (PROPRIO_SIZE,), np.float32),
        }
        if not self.pixels or critic_state:
            spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (STATE_SIZE,), np.float32)
        if self.pixels:
            for key in self.image_keys:
                spaces[key] = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.held: TaskEnv | None = None  # the active task's env, from POOL
        self.order = np.arange(len(self.task_names))
        self.cursor = len(self.order)  # a new round at the first reset
        self.active, self.phrasing, self.steps = 0, 0, 0
        self.raw = np.zeros(39)  # Meta-World's last observation, goal included: what its experts read
        POOL.join()
        self.closed = False

    @property
    def image_keys(self) -> list[str]:
        return ["image", *(f"image{i + 1}" for i in range(1, len(self.camera_names)))]

    @property
    def task_name(self) -> str:
        return self.task_names[self.active]

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.task_name][self.phrasing]

    @property
    def task_env(self):
        """The active task's Meta-World env."""
        return self.held.env

    def hold(self, index: int) -> None:
        """Hold task `index`'s env, giving back the one held for another task."""
        key = (self.task_names[index], self.limits[index])
        if self.held is not None:
            if self.held.key == key:
                return
            POOL.give(self.held)
        self.held = POOL.take(*key)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        if seed is not None or self.cursor == len(self.order):
            self.order, self.cursor = rng.permutation(len(self.task_names)), 0
        self.active = int(self.order[self.cursor])
        self.cursor += 1
        drawn = int(rng.integers(TRAINING_PHRASINGS))  # drawn either way: the same stream for both sets
        self.phrasing = TRAINING_PHRASINGS if self.held_out else drawn
        self.hold(self.active)
        env = self.task_env
        env.np_random = np.random.default_rng(int(rng.integers(2**63)))
        self.raw, _ = env.reset()
        self.steps = 0
        return self.observe(), {"task": self.task_name}

    def step(self, action):
        self.raw, reward, _, _, info = self.task_env.step(np.asarray(action, np.float32))
        self.steps += 1
        success = bool(info["success"])
        limit = self.limits[self.active]
        if self.dense:
            reward = float(reward) / DENSE_MAX + (limit - self.steps if success else 0.0)
        else:
            reward = float(success)
        truncated = not success and self.steps >= limit
        return self.observe(), reward, success, truncated, {"task": self.task_name, "success": success}

    def observe(self) -> dict:
        raw = self.raw.astype(np.float32)
        obs: dict[str, Any] = {"instruction": self.instruction, "proprio": raw[:PROPRIO_SIZE]}
        if "state" in self.observation_space.spaces:
            state = raw[PROPRIO_SIZE:].copy()
            if not self.goal_observable:
                state[-3:] = 0.0
            obs["state"] = state
        if self.pixels:
            obs.update(zip(self.image_keys, self.images()))
        return obs

    def images(self) -> list[np.ndarray]:
        """This step's image from each camera."""
        from fleetrl.envs.mujoco_camera import Camera

        views = (tuple(self.camera_names), self.image_size)
        camera = self.held.cameras.get(views)
        if camera is None:
            try:
                camera = Camera(self.task_env.model, self.camera_names, self.image_size, self.image_size)
            except ValueError as error:
                raise ConfigError(
                    "env.kwargs.cameras", self.camera_names, "cameras of Meta-World's scene", str(error)
                ) from None
            self.held.cameras[views] = camera
        return camera.render(self.task_env.data)

    def expert_action(self) -> np.ndarray:
        """Meta-World's scripted policy for the active task, acting on its full observation."""
        from metaworld.policies import ENV_POLICY_MAP

        return np.asarray(ENV_POLICY_MAP[self.task_name]().get_action(self.raw), np.float32)

    def render(self) -> np.ndarray:
        return self.images()[0]

    def close(self) -> None:
        """Give the held task env back; the process's last instance closes them all."""
        if self.closed:
            return
        self.closed = True
        if self.held is not None:
            POOL.give(self.held)
            self.held = None
        POOL.leave()

"""`env.id: fleetrl.envs.manipulation:PandaTasks` — a multi-task robot-arm set with a camera.

A Franka Panda arm in PyBullet (panda-gym's tasks, `pip install 'fleetrl[manipulation]'`), several
tasks in one env, as the MT10 / LIBERO suites do: each reset draws one task from `tasks` (from the
reset's seed, so a seed fixes the task and its start state: a reset group shares both), and its
instruction says which. Observations are a Dict:

- `image`: uint8 (size, size, 3), a fixed camera over the table, rendered off-screen on the CPU
  by PyBullet's TinyRenderer (no OpenGL, no display; ~27 ms a frame here, whatever the size up to
  84: benchmarks/robot/render_cost.py). Two changes to panda-gym make every task's goal visible
  in it: the target is drawn opaque red (panda-gym's is a translucent green that the TinyRenderer
  draws as the cube's own green), and reach's target rests on the table (panda-gym floats it in a
  30 cm cube, whose depth one camera cannot see);
- `instruction`: the task's sentence (a `Text` space listing its sentences: `envs.text` turns it
  into word ids);
- `state`: proprioception only — end-effector position and velocity, finger width (7 floats).
  Where the target (and the cube) are is in the image alone;
- `sim_state` (with `sim_state=True`): what the simulator knows and the camera shows — the
  target's position and the object's (the cube's; the end effector's for reach), 6 floats. For
  an asymmetric critic only (`model.critic_keys: [sim_state]`): the policy never reads it.

Actions: a Box(-1, 1, (4,)) for every task — an end-effector displacement (x, y, z; ×5 cm) and a
finger command; tasks whose gripper is blocked ignore the fourth. An episode ends on the step the
task succeeds (panda-gym's own success test) or at its task's time limit (`max_steps`: one for
all tasks, or one per task — a reach takes the expert 3–4 steps, a push up to 46). `info` carries
`success` and `task` (its name), which the env worker turns into `success_rate` metrics.

Rewards (`reward`):
- `sparse`: 1 on the step the task succeeds, 0 otherwise;
- `dense`: the same, plus `DENSE_SCALE` × the step's progress in `distance_to_go` (how far the
  object is from the target, plus how far the gripper is from where it must hold the object: for
  push the point behind the cube, away from the target, that `push_point` names; for reach the
  gripper is the object). A potential-based shaping (Ng et al. 1999): an episode's shaping sums to its
  whole progress, whatever the path, so it rewards getting closer without changing which
  policies are best — what RL from a weak start needs to get a signal before it first succeeds.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.experts import expert_action, push_point
from fleetrl.errors import ConfigError

INSTRUCTIONS = {
    "reach": "move the gripper to the red target",
    "push": "push the green cube to the red target",
    "pick_and_place": "pick up the green cube and place it at the red target",
}
# panda-gym's target is the cube's green at 30 % opacity; the TinyRenderer draws no transparency,
# so target and cube came out the same green square and a push could not tell which is which.
TARGET_RGBA = (0.9, 0.1, 0.1, 1.0)
REACH_TARGET_HEIGHT = 0.02  # the reach target's centre: a 2 cm sphere resting on the table
REWARDS = ("sparse", "dense")
DENSE_SCALE = 10.0  # reward per metre of progress: 10 cm closer is worth one success
STATE_SIZE = 7  # end-effector position (3), velocity (3), finger width (1)
SIM_STATE_SIZE = 6  # the target's position (3), the object's (3)
ACTION_SIZE = 4


class InstructionSpace(gym.spaces.Text):
    """A `Text` space that knows its sentences, so that `envs.text.Vocabulary` can give it word ids."""

    def __init__(self, sentences: list[str]):
        self.sentences = list(sentences)
        characters = sorted({c for sentence in sentences for c in sentence})
        super().__init__(max_length=max(map(len, sentences)), charset="".join(characters))


def time_limits(tasks: list[str], max_steps: int | dict[str, int]) -> list[int]:
    """Each task's time limit, in `tasks`' order: `max_steps` for all, or `max_steps[task]`."""
    per_task = max_steps if isinstance(max_steps, dict) else dict.fromkeys(tasks, max_steps)
    limits = [per_task.get(task) for task in tasks]
    if set(per_task) != set(tasks) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in limits):
        raise ConfigError(
            "env.kwargs.max_steps",
            max_steps,
            "a positive integer, or one per task of env.kwargs.tasks: {" + ", ".join(f"{t}: N" for t in tasks) + "}",
        )
    return limits


def make_task(name: str) -> gym.Env:
    """panda-gym's env for task `name`, rendering with the TinyRenderer (CPU, off-screen)."""
    from panda_gym.envs import panda_tasks  # the manipulation extra

    classes = {
        "reach": panda_tasks.PandaReachEnv,
        "push": panda_tasks.PandaPushEnv,
        "pick_and_place": panda_tasks.PandaPickAndPlaceEnv,
    }
    env = classes[name](render_mode="rgb_array", renderer="Tiny")
    sim = env.unwrapped.sim
    # panda-gym has no colour setter; it keeps its bodies' PyBullet ids by name in `_bodies_idx`
    sim.physics_client.changeVisualShape(sim._bodies_idx["target"], -1, rgbaColor=TARGET_RGBA)
    if name == "reach":
        # panda-gym floats reach's target anywhere in a 30 cm cube; one camera fixes only the ray
        # it lies on, not how far along it. On the table plane a pixel fixes the point, as for
        # push's cube and target.
        task = env.unwrapped.task
        task.goal_range_low[2] = task.goal_range_high[2] = REACH_TARGET_HEIGHT
    return env


class PandaTasks(gym.Env):
    """See the module docstring. `tasks`: names from `INSTRUCTIONS`; `image_size`: pixels a side;
    `max_steps`: the episode's time limit (a truncation), one for all tasks or `{task: steps}`;
    `reward`: `sparse` or `dense` (`REWARDS`); `sim_state`: add the `sim_state` key."""

    # panda-gym steps its simulation 20 × 2 ms per action: 25 actions a second (a recorded dataset's fps)
    metadata = {"render_modes": ["rgb_array"], "render_fps": 25}

    def __init__(
        self,
        tasks: tuple[str, ...] | list[str] = ("reach", "push"),
        image_size: int = 64,
        max_steps: int | dict[str, int] = 50,
        render_mode: str | None = None,
        reward: str = "sparse",
        sim_state: bool = False,
    ):
        unknown = [task for task in tasks if task not in INSTRUCTIONS]
        if unknown or not tasks:
            raise ConfigError("env.kwargs.tasks", list(tasks), f"a non-empty list of {sorted(INSTRUCTIONS)}")
        if reward not in REWARDS:
            raise ConfigError("env.kwargs.reward", reward, f"one of {list(REWARDS)}")
        self.task_names = list(tasks)
        self.limits = time_limits(self.task_names, max_steps)
        self.dense = reward == "dense"
        self.envs = [make_task(name) for name in self.task_names]
        self.image_size, self.render_mode = image_size, render_mode
        spaces = {
            "image": gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
            "instruction": InstructionSpace([INSTRUCTIONS[name] for name in self.task_names]),
            "state": gym.spaces.Box(-np.inf, np.inf, (STATE_SIZE,), np.float32),
        }
        self.sim_state = sim_state
        if sim_state:
            spaces["sim_state"] = gym.spaces.Box(-np.inf, np.inf, (SIM_STATE_SIZE,), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_SIZE,), np.float32)
        self.active = 0
        self.steps = 0
        self.distance = 0.0  # distance_to_go() after the last reset or step (dense rewards)
        sim = self.envs[0].unwrapped.sim
        self.view = sim.physics_client.computeViewMatrixFromYawPitchRoll(
            cameraTargetPosition=[-0.04, 0.0, 0.03], distance=0.7, yaw=90, pitch=-50, roll=0, upAxisIndex=2
        )  # from the table's free end: the 30 cm workspace fills the image (a 4 cm cube: 4-5 pixels at 64),
        # low enough to see a target under the hand at the start
        self.projection = sim.physics_client.computeProjectionMatrixFOV(fov=45, aspect=1.0, nearVal=0.1, farVal=3.0)

    @property
    def task(self) -> gym.Env:
        """The active task's panda-gym env (its `robot`, `task` and `sim`: what an expert reads)."""
        return self.envs[self.active].unwrapped

    @property
    def task_name(self) -> str:
        return self.task_names[self.active]

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.task_name]

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the active task (`envs.experts`): what `fleetrl record` plays."""
        return expert_action(self)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.active = int(self.np_random.integers(len(self.envs)))
        self.steps = 0
        self.envs[self.active].reset(seed=int(self.np_random.integers(2**31)))
        self.distance = self.distance_to_go()
        return self.observe(), {"task": self.task_name}

    def step(self, action):
        env = self.envs[self.active]
        action = np.asarray(action, np.float32)
        _, _, success, _, _ = env.step(action if env.action_space.shape == (ACTION_SIZE,) else action[:3])
        self.steps += 1
        truncated = not success and self.steps >= self.limits[self.active]
        info: dict[str, Any] = {"task": self.task_name, "success": bool(success)}
        reward = float(success)
        if self.dense:
            before, self.distance = self.distance, self.distance_to_go()
            reward += DENSE_SCALE * (before - self.distance)
        return self.observe(), reward, bool(success), truncated, info

    def distance_to_go(self) -> float:
        """Metres from done: the object's distance to the target plus the gripper's to where it must
        hold the object — `push_point` for push, the object itself otherwise (the object of reach
        is the gripper, so its second term is 0)."""
        task, robot = self.task.task, self.task.robot
        achieved, goal = task.get_achieved_goal(), task.get_goal()
        hold = push_point(achieved, goal) if self.task_name == "push" else achieved
        return float(np.linalg.norm(achieved - goal) + np.linalg.norm(robot.get_ee_position() - hold))

    def observe(self) -> dict:
        robot = self.task.robot
        state = np.concatenate([robot.get_ee_position(), robot.get_ee_velocity(), [robot.get_fingers_width()]]).astype(
            np.float32
        )
        obs = {"image": self.camera(), "instruction": self.instruction, "state": state}
        if self.sim_state:
            task = self.task.task
            obs["sim_state"] = np.concatenate([task.get_goal(), task.get_achieved_goal()]).astype(np.float32)
        return obs

    def camera(self) -> np.ndarray:
        import pybullet

        size = self.image_size
        _, _, rgba, _, _ = self.task.sim.physics_client.getCameraImage(
            size,
            size,
            viewMatrix=self.view,
            projectionMatrix=self.projection,
            shadow=False,
            renderer=pybullet.ER_TINY_RENDERER,
            flags=pybullet.ER_NO_SEGMENTATION_MASK,
        )
        return np.asarray(rgba, np.uint8).reshape(size, size, 4)[..., :3]

    def render(self) -> np.ndarray:
        return self.camera()

    def close(self) -> None:
        for env in self.envs:
            env.close()

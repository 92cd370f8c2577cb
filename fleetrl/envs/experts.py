"""Scripted experts for `PandaTasks`: one proportional controller per task, reading the simulator's
true state (end effector, cube, target), which the policy never sees — it has the camera image.

They are what the demonstrations of the supervised stage come from (`fleetrl record`), and what
the tests use to show that a task can be solved inside its time limit. Actions are in the env's
own units: an end-effector displacement in [-1, 1]³ (×5 cm) and a finger command.
"""

from __future__ import annotations

import numpy as np

PUSH_STANDOFF = 0.05  # metres from the cube's centre to the pushing gripper's: half the cube and a finger


def push_heading(cube: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """The unit vector on the table from the cube towards the target (0 when the cube is on it)."""
    heading = goal[:2] - cube[:2]
    return heading / max(float(np.linalg.norm(heading)), 1e-6)


def push_point(cube: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Where a push starts: behind the cube on the side away from the target, at the cube's height.

    The dense reward pays the gripper for closing on this point, not on the cube: a gripper that
    comes straight at the cube from the target's side pushes it away, and was paid for coming."""
    return np.append(cube[:2] - PUSH_STANDOFF * push_heading(cube, goal), cube[2])


GAIN = 10.0  # a 10 cm error asks for the largest step
OPEN, CLOSE = 1.0, -1.0


def toward(ee: np.ndarray, target: np.ndarray, fingers: float = 0.0) -> np.ndarray:
    return np.append(np.clip(GAIN * (target - ee), -1.0, 1.0), fingers).astype(np.float32)


def reach(env) -> np.ndarray:
    return toward(env.robot.get_ee_position(), env.task.get_goal())


def push(env) -> np.ndarray:
    """Go behind the cube (on the side away from the target), come down, push it to the target."""
    ee, cube, goal = env.robot.get_ee_position(), env.task.get_achieved_goal(), env.task.get_goal()
    heading, behind = push_heading(cube, goal), push_point(cube, goal)
    if np.linalg.norm(ee[:2] - behind[:2]) > 0.02 and np.dot(ee[:2] - cube[:2], heading) > -0.035:
        return toward(ee, behind + [0.0, 0.0, 0.06])  # over the cube's far side first, then down
    if ee[2] > cube[2] + 0.01 and np.linalg.norm(ee[:2] - behind[:2]) > 0.01:
        return toward(ee, behind)
    return toward(ee, np.append(goal[:2] - 0.02 * heading, cube[2]))


def pick_and_place(env) -> np.ndarray:
    """Open above the cube, come down, close, carry it to the target."""
    ee, cube, goal = env.robot.get_ee_position(), env.task.get_achieved_goal(), env.task.get_goal()
    width = env.robot.get_fingers_width()
    if np.linalg.norm(ee[:2] - cube[:2]) > 0.01 and np.linalg.norm(ee - cube) > 0.02:
        if ee[2] < cube[2] + 0.04 and np.linalg.norm(ee[:2] - cube[:2]) > 0.02:
            return toward(ee, ee + [0.0, 0.0, 0.05], OPEN)
        return toward(ee, cube + [0.0, 0.0, 0.05], OPEN)
    if np.linalg.norm(ee - cube) > 0.01 and width > 0.045:
        return toward(ee, cube, OPEN)
    if width > 0.045:
        return toward(ee, cube, CLOSE)
    return toward(ee, goal, CLOSE)


EXPERTS = {"reach": reach, "push": push, "pick_and_place": pick_and_place}


def expert_action(env) -> np.ndarray:
    """The scripted expert's action for the active task of `env` (a `PandaTasks`, unwrapped: this
    module is below it, so the type is not imported)."""
    return EXPERTS[env.task_name](env.task)

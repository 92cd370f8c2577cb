"""Step + render cost per env step of the CPU manipulation simulators, side by side.

    nice python benchmarks/robot/render_cost.py panda            # the project's venv
    MUJOCO_GL=egl benchmarks/.venvs/metaworld/bin/python benchmarks/robot/render_cost.py metaworld

panda: panda-gym's push task in PyBullet, rendered by TinyRenderer (CPU, no OpenGL) — fleetrl's
camera (`PandaTasks.camera`: no shadows) and panda-gym's own `render()` (shadows), and the
whole `PandaTasks` step (physics + camera + observation). metaworld: Meta-World's push-v3 in
MuJoCo, rendered through MuJoCo's renderer on the GL backend MUJOCO_GL names (egl, osmesa), in a
throwaway venv (`python3 -m venv benchmarks/.venvs/metaworld && .../pip install metaworld==3.1.1`:
it pins mujoco 3.3.0, fleetrl pins 3.3.7). Prints one JSON line per measurement: milliseconds per
step of physics alone, of rendering alone, and of both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import per_call_us  # noqa: E402

STEPS = 100


def per_step_ms(fn, steps: int = STEPS) -> float:
    """Wall milliseconds per call, after a warm-up call (the first render compiles shaders and
    allocates buffers)."""
    return per_call_us(fn, steps, clock=time.perf_counter) / 1e3


def panda() -> None:
    from fleetrl.envs.manipulation import PandaTasks

    for size in (32, 64, 84):
        env = PandaTasks(["push"], image_size=size)
        env.reset(seed=0)
        action = np.zeros(4, np.float32)
        inner = env.envs[0]
        physics = per_step_ms(lambda inner=inner, action=action: inner.step(action[:3]))
        camera = per_step_ms(env.camera)
        whole = per_step_ms(lambda env=env, action=action: env.step(action))
        inner.unwrapped.render_width = inner.unwrapped.render_height = size
        shadows = per_step_ms(inner.render, 30)
        print(
            json.dumps(
                {
                    "sim": "panda-gym 3.0.7 / pybullet TinyRenderer",
                    "size": size,
                    "physics_ms": round(physics, 2),
                    "render_ms": round(camera, 2),
                    "render_with_shadows_ms": round(shadows, 2),
                    "step_and_render_ms": round(whole, 2),
                }
            ),
            flush=True,
        )
        env.close()


def metaworld() -> None:
    import os

    import gymnasium as gym
    import metaworld  # noqa: F401  (registers Meta-World/...)

    for size in (32, 64, 84):
        env = gym.make("Meta-World/MT1", env_name="push-v3", render_mode="rgb_array", width=size, height=size)
        env.reset(seed=0)
        action = np.zeros(env.action_space.shape, np.float32)
        physics = per_step_ms(lambda env=env, action=action: env.step(action))
        render = per_step_ms(env.render)
        frame = env.render()
        print(
            json.dumps(
                {
                    "sim": f"metaworld / mujoco, MUJOCO_GL={os.environ.get('MUJOCO_GL')}",
                    "size": size,
                    "frame": list(frame.shape),
                    "physics_ms": round(physics, 2),
                    "render_ms": round(render, 2),
                    "step_and_render_ms": round(physics + render, 2),
                }
            ),
            flush=True,
        )
        env.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("simulator", choices=("panda", "metaworld"), help="which simulator to measure (its venv)")
    {"panda": panda, "metaworld": metaworld}[parser.parse_args().simulator]()

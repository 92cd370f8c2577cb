"""A Meta-World camera frame's cost on the CPU: fleetrl's renderer against Meta-World's own, side by side.

    nice .venv/bin/python benchmarks/robot/metaworld_render.py --sizes 32 64 84 --rounds 3

`meta-world`: Meta-World's render path (gymnasium's MuJoCo renderer: a GL context per env, the
model's 480×480 off-screen buffer with 4× multisampling, shadows and reflections), push-v3's
`corner` camera. `fleetrl`: `fleetrl.envs.mujoco_camera.Camera` on the same scene and state (one
GL context per process, a buffer of the image's size, no multisampling, shadows, reflections or
skybox), and each of its choices undone alone: `+shadows`, `+multisampling` (4 samples),
`+full buffer` (480×480), `+skybox+reflections`. `one light`: fleetrl's with only the scene's first
light on. The variants run in turn, `--rounds` times, so that the host's load falls on each alike;
each line gives the median over rounds of milliseconds per frame (wall, and CPU of this process),
the ratio to Meta-World's, and the load average. MUJOCO_GL picks the backend (egl by default:
Mesa's llvmpipe on a machine without a GPU). Also the physics of one env step, for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import machine, machine_line, median  # noqa: E402

FRAMES = 30


def timed(fn, frames: int = FRAMES) -> tuple[float, float]:
    """(wall ms, process CPU ms) per call, after a warm-up call (shaders, buffers)."""
    fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(frames):
        fn()
    return (time.perf_counter() - wall) * 1e3 / frames, (time.process_time() - cpu) * 1e3 / frames


def variants(size: int) -> dict:
    """name → a zero-argument renderer of push-v3's corner camera at `size` pixels."""
    import gymnasium as gym
    import metaworld  # noqa: F401  (registers Meta-World/...)
    import mujoco

    from fleetrl.envs.metaworld_tasks import build_task
    from fleetrl.envs.mujoco_camera import Camera

    theirs = gym.make(
        "Meta-World/MT1", env_name="push-v3", render_mode="rgb_array", camera_name="corner", width=size, height=size
    )
    theirs.reset(seed=0)
    env = build_task("push-v3", 500)
    env.reset()

    def ours(change=None, before=None):
        model = env.model
        saved = (model.vis.global_.offwidth, model.vis.global_.offheight, model.vis.quality.offsamples)
        camera = Camera(model, ["corner"], size, size)
        if before is not None:  # a buffer setting: a context of its own, made after the change
            before(model)
            camera.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, camera.context)
        if change is not None:
            change(camera)
        model.vis.global_.offwidth, model.vis.global_.offheight, model.vis.quality.offsamples = saved
        return lambda: camera.render(env.data)

    def flag(*names):
        def change(camera):
            for name in names:
                camera.scene.flags[getattr(mujoco.mjtRndFlag, name)] = 1

        return change

    def buffer(width, samples):
        def before(model):
            model.vis.global_.offwidth = model.vis.global_.offheight = width
            model.vis.quality.offsamples = samples

        return before

    def one_light(camera):
        camera.model.light_active[1:] = 0

    return {
        "meta-world": theirs.render,
        "fleetrl": ours(),
        "+shadows": ours(flag("mjRND_SHADOW")),
        "+multisampling": ours(before=buffer(size, 4)),
        "+full buffer": ours(before=buffer(480, 0)),
        "+skybox+reflections": ours(flag("mjRND_SKYBOX", "mjRND_REFLECTION")),
        "one light": ours(one_light),
        "physics": lambda: env.step(np.zeros(4, np.float32)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 84])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")  # before MuJoCo's import: Meta-World's path through EGL too
    print(machine_line(machine()), f"MUJOCO_GL={os.environ['MUJOCO_GL']}", flush=True)
    for size in args.sizes:
        renderers = variants(size)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in renderers}
        loads = []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name, render in renderers.items():
                times[name].append(timed(render))
        base = median([wall for wall, _ in times["meta-world"]])
        for name, measured in times.items():
            wall, cpu = median([w for w, _ in measured]), median([c for _, c in measured])
            row = {"size": size, "variant": name, "wall_ms": round(wall, 2), "cpu_ms": round(cpu, 2)}
            row["vs_meta_world"] = round(wall / base, 3)
            row["load_1min"] = round(median(loads), 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""Off-screen camera images of MuJoCo scenes, made as cheap as a CPU renderer allows.

On a machine without a GPU, MuJoCo renders through Mesa's software EGL (llvmpipe). A 64×64
Meta-World frame through Meta-World's own path (gymnasium's renderer) cost 25.5 ms of CPU here,
17× the 1.5 ms of its physics step; this module's, 10.8 ms (0.42×; `benchmarks/robot/
metaworld_render.py`, 3 rounds at load ~26, docs/benchmarks/metaworld.md). What costs, and what it
leaves out:

- **no multisampling** (`vis.quality.offsamples = 0`; Meta-World's 4 samples: +16 ms a frame);
- **no skybox or reflections** (`mjRND_SKYBOX`, `mjRND_REFLECTION`: +5.6 ms), and no shadows
  (`mjRND_SHADOW`: no measurable cost in these scenes, left out all the same);
- **an off-screen buffer of the image's own size** (`vis.global_.offwidth/offheight`), not the
  model's 480×480 (+1.7 ms at 64×64);
- **one GL context per process**, made current once: every model (each Meta-World task is its
  own) gets its own `MjrContext` (its textures and buffers) inside it. gymnasium's renderer makes
  one context per env, so 16 envs × 10 tasks would hold 160 contexts.

The GL backend is `MUJOCO_GL`'s (`egl`, `osmesa` or `glfw`), EGL when it is unset, whenever MuJoCo
was imported: MuJoCo reads the variable once, at its import, which another env of the same
process may have done first. EGL needs Debian's `libegl1` and `libegl-mesa0` (or a GPU's driver);
`docs/guides/manipulation.md` says how to install them.
"""

from __future__ import annotations

import os

import numpy as np

_context = None  # the process's one GL context (mujoco.GLContext), made on the first camera


def gl_context(width: int, height: int):
    """The process's GL context, made current: the first caller's size is the window size, which
    off-screen rendering does not use (each model's `MjrContext` has a buffer of its own)."""
    global _context
    if _context is None:
        backend = os.environ.get("MUJOCO_GL", "egl").lower()
        if backend == "egl":
            from mujoco.egl import GLContext
        elif backend == "osmesa":
            from mujoco.osmesa import GLContext
        else:
            from mujoco.glfw import GLContext
        _context = GLContext(width, height)
    _context.make_current()  # another library's context may have been made current since
    return _context


class Camera:
    """Images (height, width, 3) uint8 of one model's named cameras, rendered off-screen.

    `cameras`: names of the model's cameras, one image each per `render`. The model's visual
    settings are changed (its off-screen buffer size and sampling); build one `Camera` per model."""

    def __init__(self, model, cameras: list[str], width: int, height: int):
        import mujoco

        unknown = [name for name in cameras if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name) < 0]
        if unknown:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"unknown cameras {unknown}: the model has {names}")
        gl_context(width, height)
        model.vis.global_.offwidth, model.vis.global_.offheight = width, height
        model.vis.quality.offsamples = 0
        self.model, self.width, self.height = model, width, height
        self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(model, maxgeom=1000)
        for flag in (
            mujoco.mjtRndFlag.mjRND_SHADOW,
            mujoco.mjtRndFlag.mjRND_REFLECTION,
            mujoco.mjtRndFlag.mjRND_SKYBOX,
        ):
            self.scene.flags[flag] = 0
        self.option = mujoco.MjvOption()
        self.cameras = []
        for name in cameras:
            camera = mujoco.MjvCamera()
            camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
            camera.fixedcamid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name)
            self.cameras.append(camera)
        self.viewport = mujoco.MjrRect(0, 0, width, height)

    def render(self, data) -> list[np.ndarray]:
        """One image per camera of the simulation state `data`, top row first."""
        import mujoco

        gl_context(self.width, self.height)
        images = []
        for camera in self.cameras:
            mujoco.mjv_updateScene(self.model, data, self.option, None, camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene)
            mujoco.mjr_render(self.viewport, self.scene, self.context)
            pixels = np.empty((self.height, self.width, 3), np.uint8)
            mujoco.mjr_readPixels(pixels, None, self.viewport, self.context)
            images.append(np.flipud(pixels))  # OpenGL's first row is the bottom one
        return images

    def close(self) -> None:
        self.context.free()

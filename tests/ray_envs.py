"""Simulators for the Ray backend tests (`tests.ray_envs:...` entry points)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gymnasium as gym

PLACEMENT_VARIABLES = (
    "FLEETRL_COMPONENT",
    "FLEETRL_RANK",
    "FLEETRL_WORLD_SIZE",
    "FLEETRL_NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "FLEETRL_TEST_MARK",
)


class WhereAmI(gym.Wrapper):
    """CartPole that writes what its process sees: the placement variables into
    `<folder>/<pid>.json` and its PYTHONPATH into `<folder>/<pid>.path` when built, and when closed
    (the run's end: every start-up step and call done) the torch modules its process has loaded
    into `<folder>/<pid>.torch`."""

    def __init__(self, folder: str):
        super().__init__(gym.make("CartPole-v1"))
        self.folder = folder
        seen = {name: os.environ.get(name) for name in PLACEMENT_VARIABLES}
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(seen))
        Path(folder, f"{os.getpid()}.path").write_text(os.environ.get("PYTHONPATH", ""))

    def close(self) -> None:
        torch_modules = sorted(name for name in sys.modules if name.partition(".")[0] == "torch")
        seen = {"component": os.environ.get("FLEETRL_COMPONENT"), "torch_modules": torch_modules[:5]}
        Path(self.folder, f"{os.getpid()}.torch").write_text(json.dumps(seen))
        super().close()

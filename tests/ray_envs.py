"""Simulators for the Ray backend tests (`tests.ray_envs:...` entry points)."""

from __future__ import annotations

import json
import os
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
    """CartPole that writes the placement variables it sees into `<folder>/<pid>.json`, and its
    PYTHONPATH into `<folder>/<pid>.path`."""

    def __init__(self, folder: str):
        super().__init__(gym.make("CartPole-v1"))
        seen = {name: os.environ.get(name) for name in PLACEMENT_VARIABLES}
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(seen))
        Path(folder, f"{os.getpid()}.path").write_text(os.environ.get("PYTHONPATH", ""))

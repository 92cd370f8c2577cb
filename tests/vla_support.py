"""What the VLA tests share: a batch of language-conditioned MiniGrid observations, and a
Hugging Face VLA policy built from a model folder as `model.id: hf` builds it."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import torch

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.config.schema import EnvConfig
from fleetrl.envs.make import make_vector_env
from fleetrl.models.policy import Policy
from tests.support import REPO

VLA_CONFIG = REPO / "configs" / "ppo_minigrid_vla.yaml"
MINIGRID = EnvConfig(id="MiniGrid-GoToDoor-5x5-v0", num_envs=4, vectorization="sync")


def minigrid_batch() -> tuple[gym.spaces.Dict, gym.spaces.Discrete, dict[str, torch.Tensor]]:
    """(observation space, action space, the first observations of 4 envs as tensors)."""
    env = make_vector_env(MINIGRID)
    try:
        obs, _ = env.reset(seed=0)
        return env.single_observation_space, env.single_action_space, {k: torch.from_numpy(v) for k, v in obs.items()}
    finally:
        env.close()


def vla(path: Path | str, observation_space: gym.Space, action_space: gym.Space, **keys) -> Policy:
    """The policy `model: {id: hf, path: PATH, **keys}` makes, its own layers seeded alike every time."""
    torch.manual_seed(0)
    return Policy.from_config(HfModelConfig(path=str(path), **keys), observation_space, action_space)

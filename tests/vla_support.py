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


def vla_overrides(path: Path | str, *model_keys: str) -> list[str]:
    """Overrides for an actor of the VLA in `path` on `fsdp_transformer_ranks`' synthetic
    MiniGrid-shaped trajectories (its mission is no text: the prompt names no instruction)."""
    from tests.dist_support import BASE

    keys = ", ".join([f"path: {path}", "prompt_template: 'Out:'", "lora: {rank: 2}", *model_keys])
    return [*BASE, f"model={{id: hf, {keys}}}", "algorithm.update_epochs=1"]


def vla_offload_rank(rank: int, world: int, path: str) -> dict:
    """One rank of the real VLA under FSDP2 with CPU offload and gradient checkpointing: its
    units, and one iteration's loss (all-reduced: the same on every rank)."""
    from torch.distributed.fsdp import FSDPModule

    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.plan.load import load_config
    from tests.fsdp_transformer_ranks import SPACES, trajectory

    overrides = ["actor.strategy=fsdp", "actor.fsdp_cpu_offload=true", "actor.gradient_checkpointing=true"]
    config = load_config(None, [*vla_overrides(path), *overrides])
    worker = ActorWorker(config, *SPACES, rank=rank, world_size=world)
    worker.init_distributed("127.0.0.1", 0)  # the group exists already: joined
    before = {name: p.detach().full_tensor().clone() for name, p in worker.policy.named_parameters() if p.requires_grad}
    metrics = worker.train(trajectory(config, 0).shard(rank, world), 0.0)
    after = {name: p.detach().full_tensor() for name, p in worker.policy.named_parameters() if p.requires_grad}
    return {
        "units": sum(isinstance(module, FSDPModule) for module in worker.policy.modules()),
        "finite": all(torch.isfinite(value).all() for value in after.values()),
        "moved": any(not torch.equal(before[name], after[name]) for name in before),
        "policy_loss": metrics["policy_loss"],
    }

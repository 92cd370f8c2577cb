"""The batch that flows from env ⇄ rollout to the actor: (T, N) tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Trajectory:
    obs: torch.Tensor  # (T, N, *obs_shape)
    actions: torch.Tensor  # (T, N) long, or (T, N, action_dim) float
    logprobs: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T, N)
    rewards: torch.Tensor  # (T, N)
    terminated: torch.Tensor  # (T, N) bool
    dones: torch.Tensor  # (T, N) bool: terminated or truncated
    next_values: torch.Tensor  # (T, N) V(true next state), final obs on truncation

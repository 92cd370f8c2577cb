"""Generalised Advantage Estimation (Schulman et al. 2016) with terminations ≠ truncations."""

from __future__ import annotations

import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                terminated: torch.Tensor, dones: torch.Tensor, gamma: float, lam: float):
    """Advantages and returns for (T, N) tensors.

    next_values[t] is V of the state that truly followed step t: the next observation, or for a
    truncated episode its final observation (never the reset one). terminated[t] drops that
    bootstrap; dones[t] (terminated or truncated) stops the advantage from flowing back across
    the episode boundary.
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - dones.float()
    deltas = rewards + gamma * not_terminated * next_values - values
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values

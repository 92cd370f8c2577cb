"""Generalised Advantage Estimation (Schulman et al. 2016) with terminations ≠ truncations."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
    steps: torch.Tensor | None = None,
):
    """Advantages and returns for (T, N) tensors.

    next_values[t] is V of the state that truly followed step t: the next observation, or for a
    truncated episode its final observation (never the reset one). terminated[t] drops that
    bootstrap; dones[t] (terminated or truncated) stops the advantage from flowing back across
    the episode boundary.

    Action chunks: step t is a decision that executed `steps[t]` = k env steps, its reward
    already Σ_j γ^j r_{t+j} over them (`ActionChunk`). Its discount is then γ^k — the semi-MDP
    form: δ_t = R_t + γ^k V(s') − V(s_t), A_t = δ_t + γ^k λ A_{t+1} — so a chunk cut short by the
    episode's end (a truncation's bootstrap from the final observation included) is discounted
    by the steps that ran. λ weighs decisions. Without `steps` every decision is one env step.
    """
    discount = gamma if steps is None else torch.pow(torch.tensor(gamma, dtype=rewards.dtype), steps.to(rewards.dtype))
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - dones.float()
    deltas = rewards + discount * not_terminated * next_values - values
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + (gamma if steps is None else discount[t]) * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values

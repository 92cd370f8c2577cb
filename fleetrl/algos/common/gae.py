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


def grpo_advantages(rewards: torch.Tensor, dones: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024) for (T, N) tensors.

    Env columns n·g … n·g+g−1 form group n (g = `group_size`, N divisible by g). In each column
    the steps up to the first `dones` are episode 0, the steps after it up to the next episode 1,
    and so on; an episode is *complete* when its end lies within the T steps. Episode k of the
    members of a group is compared with episode k of the others: with the members reset with one
    seed at step 0, episode 0 starts from the same state for all of them (and so does every later
    episode of a simulator that draws randomness only in `reset`). On a multi-task env that draws
    the task and its start from the reset seed (`envs.manipulation.PandaTasks`) a group is thus
    the episodes of one task from one reset seed, as RLinf's GRPO groups on LIBERO. Its advantage is

        (R − mean R) / (std R + eps)   over the members whose episode k is complete,

    where R is the episode's undiscounted sum of rewards (with action chunks: of the decisions'
    raw chunk returns, `Trajectory.chunk_returns`) and std the unbiased standard deviation;
    it is given to every step of the episode. Steps of incomplete episodes, and of episodes with
    fewer than two complete counterparts in their group, get advantage 0: they add nothing to the
    policy gradient (still to the entropy bonus and the value loss, and to the sample count).
    """
    steps, envs = rewards.shape
    if envs % group_size:
        raise ValueError(f"{envs} env columns do not split into groups of {group_size}")
    ends = dones.long()
    episode = torch.cumsum(ends, 0) - ends  # (T, N) index of each step's episode in its column
    completed = ends.sum(0)  # (N,) complete episodes per column
    complete = episode < completed  # (T, N) the step's episode ends within the window
    advantages = torch.zeros_like(rewards)
    most = int(completed.max()) if envs else 0
    if most == 0:
        return advantages
    column = torch.arange(envs, device=rewards.device).expand(steps, envs)
    flat = (column * most + episode)[complete]
    episode_returns = torch.zeros(envs * most, dtype=torch.float64, device=rewards.device)
    episode_returns.index_add_(0, flat, rewards[complete].double())
    groups = envs // group_size
    returns = episode_returns.view(groups, group_size, most)
    exists = (torch.arange(most, device=rewards.device) < completed[:, None]).view(groups, group_size, most)
    count = exists.sum(1, keepdim=True)  # (G, 1, K) members whose episode k is complete
    mean = (returns * exists).sum(1, keepdim=True) / count.clamp_min(1)
    variance = ((returns - mean).pow(2) * exists).sum(1, keepdim=True) / (count - 1).clamp_min(1)
    relative = (returns - mean) / (variance.sqrt() + eps)
    relative = torch.where(exists & (count >= 2), relative, torch.zeros_like(relative))
    advantages[complete] = relative.reshape(-1)[flat].to(rewards.dtype)
    return advantages

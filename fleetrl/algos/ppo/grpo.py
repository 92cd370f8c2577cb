"""GRPO's group-relative advantages (`algorithm.adv_type: grpo`): PPO's update on advantages that
compare each episode with the episodes of its group, started from the same state (the env
workers reset a group's envs with one seed each iteration: `PPOConfig.reset_group_size`)."""

from __future__ import annotations

import torch


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

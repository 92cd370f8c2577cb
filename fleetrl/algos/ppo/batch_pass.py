"""One forward pass of a policy over an update's whole batch, before the update's first step and
without gradients: what the update then reads instead of running that policy once per minibatch
piece in every epoch. Two policies need it: the proximal policy (the actor's own weights at the
update's start: `fleetrl.algos.ppo.correction.proximal_pass`) and the frozen reference policy of
`algorithm.kl_coef` (`fleetrl.algos.ppo.reference`), whose log-probs of a sample are the same in
every epoch, so one pass serves them all."""

from __future__ import annotations

import torch
from torch import nn

from fleetrl.observations import map_obs
from fleetrl.trajectory import Trajectory


def batch_pass(
    module: nn.Module, trajectory: Trajectory, piece: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`module`'s log-probs of the taken actions (shaped as `trajectory.logprobs`) and its values
    (T, N), both float32 on the host: `piece` rows at a time, without gradients. Every rank holds
    an equal shard, so every rank runs as many pieces, in the same order: a sharded module's
    all-gathers line up."""
    steps, envs = trajectory.rewards.shape
    obs = map_obs(lambda x: x.flatten(0, 1), trajectory.obs)
    actions = trajectory.actions.flatten(0, 1)
    logprobs, values = [], []
    with torch.no_grad():
        for start in range(0, steps * envs, piece):
            rows = slice(start, start + piece)
            outputs = module(map_obs(lambda x, rows=rows: x[rows].to(device), obs), actions[rows].to(device))
            logprobs.append(outputs.logprobs.float().cpu())
            values.append(outputs.value.float().cpu())
    return torch.cat(logprobs).reshape(trajectory.logprobs.shape), torch.cat(values).reshape(steps, envs)

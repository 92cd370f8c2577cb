"""PPO's clipped actor-critic update over minibatches × epochs (Schulman et al. 2017)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fleetrl.config.schema import AlgorithmConfig


@dataclass
class PPOBatch:
    """Flat (B, ...) training data of one iteration."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __getitem__(self, index: torch.Tensor) -> "PPOBatch":
        return PPOBatch(self.obs[index], self.actions[index], self.logprobs[index],
                        self.values[index], self.advantages[index], self.returns[index])

    def __len__(self) -> int:
        return self.obs.shape[0]


def ppo_loss(policy: nn.Module, batch: PPOBatch, config: AlgorithmConfig, clip_coef: float):
    """(scalar loss, detached [policy loss, value loss, entropy], detached log-ratio).

    Nothing here calls `.item()`: the statistics stay tensors, so a minibatch never waits.
    """
    logprobs, entropy, values = policy(batch.obs, batch.actions)
    log_ratio = logprobs - batch.logprobs
    ratio = log_ratio.exp()
    advantages = batch.advantages
    if config.norm_adv and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = torch.max(-advantages * ratio,
                            -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    value_error = (values - batch.returns).pow(2)
    if config.clip_vloss:
        clipped = batch.values + (values - batch.values).clamp(-clip_coef, clip_coef)
        value_error = torch.max(value_error, (clipped - batch.returns).pow(2))
    value_loss = 0.5 * value_error.mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + config.vf_coef * value_loss
    if config.ent_coef:
        loss = loss - config.ent_coef * entropy_mean
    parts = torch.stack([policy_loss.detach(), value_loss.detach(), entropy_mean.detach()])
    return loss, parts, log_ratio.detach()


def kl_and_clip_fraction(log_ratio: torch.Tensor, clip_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate KL(old‖new) by the k3 estimator (unbiased, always ≥ 0) and the clipped share."""
    ratio = log_ratio.exp()
    return ((ratio - 1) - log_ratio).mean(), ((ratio - 1).abs() > clip_coef).float().mean()


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch: PPOBatch,
               config: AlgorithmConfig, clip_coef: float, generator: torch.Generator) -> dict:
    """Run the epochs; returns mean losses, KL, clip fraction, grad steps and the epochs done.

    KL and clip fraction are computed once per epoch over all its minibatches, not per minibatch.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    size, minibatch = len(batch), config.minibatch_size
    totals = torch.zeros(3)
    grad_steps, epochs_done = 0, 0
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator) if size > minibatch else None
        log_ratios = []
        for start in range(0, size, minibatch):
            part = batch if order is None else batch[order[start:start + minibatch]]
            loss, parts, log_ratio = ppo_loss(policy, part, config, clip_coef)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=True)
            optimizer.step()
            totals += parts
            log_ratios.append(log_ratio)
            grad_steps += 1
        epochs_done += 1
        approx_kl, clip_fraction = kl_and_clip_fraction(torch.cat(log_ratios), clip_coef)
        if config.target_kl is not None and approx_kl.item() > config.target_kl:
            break
    policy_loss, value_loss, entropy = (totals / grad_steps).tolist()
    return {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "approx_kl": approx_kl.item(), "clip_fraction": clip_fraction.item(),
            "grad_steps": grad_steps, "epochs": epochs_done}

"""PPO's clipped actor-critic update over minibatches × epochs (Schulman et al. 2017).

Two drivers share the same objective:
- `ppo_update`: one process, no gradient accumulation — the fast path, no collective anywhere;
- `ppo_update_sharded`: this rank's env columns of a trajectory spread over W actor ranks, and/or
  gradient accumulation over micro-batches. It trains on exactly the minibatches `ppo_update`
  would draw from the whole trajectory (see `fleetrl.parallel.sharding`) and its result equals it up
  to float reordering.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from fleetrl.config.schema import AlgorithmConfig
from fleetrl.parallel.sharding import EnvShard, plan_epoch


@dataclass
class PPOBatch:
    """Flat (B, ...) training data of one iteration."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __getitem__(self, index: torch.Tensor) -> PPOBatch:
        return PPOBatch(
            self.obs[index],
            self.actions[index],
            self.logprobs[index],
            self.values[index],
            self.advantages[index],
            self.returns[index],
        )

    def __len__(self) -> int:
        return self.obs.shape[0]

    def to(self, device: torch.device) -> PPOBatch:
        return PPOBatch(
            self.obs.to(device),
            self.actions.to(device),
            self.logprobs.to(device),
            self.values.to(device),
            self.advantages.to(device),
            self.returns.to(device),
        )


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Per-sample policy loss: max(-A·r, -A·clip(r, 1±ε))."""
    ratio = log_ratio.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))


def aggregate_tokens(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, entropy: torch.Tensor, config: AlgorithmConfig
):
    """A token policy's per-token (B, K) log-probs and entropies → what the loss uses.

    logprob_type action_level: log π(a|s) = Σ_k log π(token_k|s), one ratio per sample (B,);
                 token_level: the (B, K) per-token log-probs stay, one ratio per token (see
                 `policy_objective`).
    entropy_type action_level: Σ_k H(token_k) — the entropy of the whole (factorised) action;
                 token_level: mean_k H(token_k).
    Log-probs and entropies of other policies are (B,) and pass through unchanged.
    """
    if logprobs.dim() == 1:
        return logprobs, old_logprobs, entropy
    if config.logprob_type == "action_level":
        logprobs, old_logprobs = logprobs.sum(-1), old_logprobs.sum(-1)
    entropy = entropy.sum(-1) if config.entropy_type == "action_level" else entropy.mean(-1)
    return logprobs, old_logprobs, entropy


def policy_objective(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Per-sample clipped policy loss (B,). With per-token log-ratios (B, K) (token_level) each
    token's ratio is clipped on its own against the sample's advantage, and the sample's loss is
    the mean over its K tokens."""
    if log_ratio.dim() > 1:
        return clipped_surrogate(log_ratio, advantages.unsqueeze(-1), clip_coef).mean(-1)
    return clipped_surrogate(log_ratio, advantages, clip_coef)


def per_sample(value: torch.Tensor) -> torch.Tensor:
    """(B,) as is; per-token (B, K) statistics averaged over the tokens."""
    return value.mean(-1) if value.dim() > 1 else value


def value_error(values: torch.Tensor, batch: PPOBatch, config: AlgorithmConfig, clip_coef: float) -> torch.Tensor:
    """Per-sample squared value error, clipped around the old values with `clip_vloss`."""
    error = (values - batch.returns).pow(2)
    if config.clip_vloss:
        clipped = batch.values + (values - batch.values).clamp(-clip_coef, clip_coef)
        error = torch.max(error, (clipped - batch.returns).pow(2))
    return error


def ppo_loss(policy: nn.Module, batch: PPOBatch, config: AlgorithmConfig, clip_coef: float):
    """(scalar loss, detached [policy loss, value loss, entropy], detached log-ratio).

    Nothing here calls `.item()`: the statistics stay tensors, so a minibatch never waits.
    """
    logprobs, entropy, values = policy(batch.obs, batch.actions)
    logprobs, old_logprobs, entropy = aggregate_tokens(logprobs, batch.logprobs, entropy, config)
    log_ratio = logprobs - old_logprobs
    advantages = batch.advantages
    if config.norm_adv and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = policy_objective(log_ratio, advantages, clip_coef).mean()
    value_loss = 0.5 * value_error(values, batch, config, clip_coef).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + config.vf_coef * value_loss
    if config.ent_coef:
        loss = loss - config.ent_coef * entropy_mean
    parts = torch.stack([policy_loss.detach(), value_loss.detach(), entropy_mean.detach()])
    return loss, parts, log_ratio.detach()


def kl_and_clip_fraction(log_ratio: torch.Tensor, clip_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate KL(old‖new) by the k3 estimator (unbiased, always ≥ 0) and the clipped share
    (per token, averaged, for token_level log-ratios)."""
    ratio = log_ratio.exp()
    return ((ratio - 1) - log_ratio).mean(), ((ratio - 1).abs() > clip_coef).float().mean()


def ppo_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PPOBatch,
    config: AlgorithmConfig,
    clip_coef: float,
    generator: torch.Generator,
    minibatch_size: int | None = None,
) -> dict:
    """Run the epochs; returns mean losses, KL, clip fraction, grad steps and the epochs done.

    KL and clip fraction are computed once per epoch over all its minibatches, not per minibatch.
    `minibatch_size` defaults to `config.minibatch_size` (`actor.global_batch_size` overrides it).
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    size, minibatch = len(batch), minibatch_size or config.minibatch_size
    totals = torch.zeros(3)
    grad_steps, epochs_done = 0, 0
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator) if size > minibatch else None
        log_ratios = []
        for start in range(0, size, minibatch):
            part = batch if order is None else batch[order[start : start + minibatch]]
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
    return {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl.item(),
        "clip_fraction": clip_fraction.item(),
        "grad_steps": grad_steps,
        "epochs": epochs_done,
    }


def minibatch_advantage_stats(
    advantages: torch.Tensor,
    plan: list[list[torch.Tensor]],
    size: int,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
):
    """Per-minibatch mean and std (unbiased, as `Tensor.std`) of the advantages over the whole
    global minibatch — all ranks' members — from one all-reduce of [Σa, Σa²] per minibatch,
    accumulated in float64 so the one-pass variance loses nothing at float32 precision."""
    sums = torch.stack(
        [
            torch.stack([a.sum(), a.pow(2).sum()])
            for a in (advantages[torch.cat(micro).to(advantages.device)].double() for micro in plan)
        ]
    )
    sums = all_reduce(sums)
    mean = sums[:, 0] / size
    variance = ((sums[:, 1] - sums[:, 0] * mean) / (size - 1)).clamp_min(0)
    return mean.float(), variance.sqrt().float()


def check_every_parameter_has_a_gradient(policy: nn.Module, ignored=frozenset(), loss: str = "PPO") -> None:
    """A trainable parameter the loss never reached would leave DDP waiting for its gradient
    (or FSDP reducing garbage); name it instead. The graph is the same on every rank, so every
    rank raises together. `ignored`: names this phase's wrapping leaves out on purpose (PPG's
    auxiliary head in the policy phase)."""
    missing = [
        name for name, p in policy.named_parameters() if p.requires_grad and p.grad is None and name not in ignored
    ]
    if missing:
        raise RuntimeError(
            f"the {loss} loss produced no gradient for the trainable parameter(s) {missing}: "
            "every trainable parameter must take part in Policy.forward(obs, actions), "
            "or be frozen (requires_grad=False)"
        )


def ppo_update_sharded(
    loss_path,
    optimizer: torch.optim.Optimizer,
    batch: PPOBatch,
    config: AlgorithmConfig,
    clip_coef: float,
    generator: torch.Generator,
    shard: EnvShard,
    minibatch_size: int,
    micro_batch_size: int | None,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
) -> dict:
    """`ppo_update` for one rank of `shard.world_size`, holding `batch` = its env columns
    (flattened step-major), optionally accumulating gradients over micro-batches.

    `loss_path` is a `fleetrl.parallel.wrap.LossPath`; `all_reduce` sums a tensor over ranks.
    What makes it equal to `ppo_update` on the whole batch:
    - the same minibatches (one global permutation per epoch; `fleetrl.parallel.sharding`);
    - each micro-batch's loss is its *sum* over samples × W / M (M: global minibatch size): DDP
      and FSDP average gradients over the W ranks, so the optimizer sees Σ over the minibatch / M
      — the single-process mean — however the members are split;
    - advantages are normalised with the global minibatch's mean and std;
    - the target-KL decision uses the all-reduced KL of the epoch, the same value on every rank;
    - every rank runs the same number of micro-batches (empty ones where it holds fewer members),
      with gradient sync off for all but the last, so every rank joins every reduction.
    Returned metrics are global (reduced over ranks), identical on every rank.
    """
    size = shard.global_size
    minibatch = minibatch_size
    scale = shard.world_size / minibatch
    device = batch.obs.device
    normalise = config.norm_adv and minibatch > 1
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # Σ policy loss, value loss, entropy
    epoch_stats = torch.zeros(2, dtype=torch.float64, device=device)  # Σ k3 KL, clipped count
    grad_steps, epochs_done, reduced_kl = 0, 0, None
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator) if size > minibatch else None
        plan = plan_epoch(order, minibatch, shard, micro_batch_size)
        if normalise:
            means, stds = minibatch_advantage_stats(batch.advantages, plan, minibatch, all_reduce)
        epoch_stats = torch.zeros(2, dtype=torch.float64, device=device)
        reduced_kl = None
        for k, micro_batches in enumerate(plan):
            optimizer.zero_grad(set_to_none=True)
            for j, index in enumerate(micro_batches):
                last = j == len(micro_batches) - 1
                with nullcontext() if last else loss_path.no_sync():
                    part = batch[index.to(device)]
                    advantages = part.advantages
                    if normalise:
                        advantages = (advantages - means[k]) / (stds[k] + 1e-8)
                    logprobs, entropy, values = loss_path.module(part.obs, part.actions)
                    logprobs, old_logprobs, entropy = aggregate_tokens(logprobs, part.logprobs, entropy, config)
                    log_ratio = logprobs - old_logprobs
                    policy_sum = policy_objective(log_ratio, advantages, clip_coef).sum()
                    value_sum = 0.5 * value_error(values, part, config, clip_coef).sum()
                    entropy_sum = entropy.sum()
                    loss = policy_sum + config.vf_coef * value_sum
                    if config.ent_coef:
                        loss = loss - config.ent_coef * entropy_sum
                    (loss * scale).backward()
                totals += torch.stack([policy_sum.detach(), value_sum.detach(), entropy_sum.detach()])
                log_ratio = log_ratio.detach()
                ratio = log_ratio.exp()
                epoch_stats += torch.stack(
                    [
                        per_sample((ratio - 1) - log_ratio).sum().double(),
                        per_sample(((ratio - 1).abs() > clip_coef).float()).sum().double(),
                    ]
                )
            if grad_steps == 0:
                check_every_parameter_has_a_gradient(loss_path.policy, loss_path.ignored)
            if config.max_grad_norm > 0:
                loss_path.clip_grad_norm_(config.max_grad_norm)
            optimizer.step()
            grad_steps += 1
        epochs_done += 1
        if config.target_kl is not None:
            # Agreed across ranks: all see the same reduced KL, so all break at the same epoch.
            reduced_kl = all_reduce(epoch_stats.clone())
            if (reduced_kl[0] / size).item() > config.target_kl:
                break
    if reduced_kl is None:
        reduced = all_reduce(torch.cat([totals, epoch_stats]))
    else:
        reduced = torch.cat([all_reduce(totals), reduced_kl])
    samples = grad_steps * minibatch
    policy_loss, value_loss, entropy = (reduced[:3] / samples).tolist()
    return {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": float(reduced[3] / size),
        "clip_fraction": float(reduced[4] / size),
        "grad_steps": grad_steps,
        "epochs": epochs_done,
    }

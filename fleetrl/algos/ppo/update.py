"""PPO's clipped actor-critic update over minibatches × epochs (Schulman et al. 2017).

One loss (`ppo_loss`) and one driver (`ppo_update`) for every layout: one process, or this rank's
env columns of a trajectory spread over W actor ranks, with or without gradient accumulation over
micro-batches. Every rank trains on exactly the minibatches one process would draw from the whole
trajectory (`fleetrl.parallel.sharding`), so the result equals the single process's up to float
reordering. What differs is only how a minibatch's losses are reduced:

- whole (one rank, no accumulation: `Minibatches.whole`): the minibatch is one piece on this
  rank; its losses are means and its advantages are normalised with its own mean and std — no
  collective anywhere;
- pieces (several ranks and/or micro-batches): each piece's loss is its *sum* × W / M (M: the
  global minibatch size). DDP and FSDP average gradients over the W ranks, so the optimizer sees
  Σ over the minibatch / M — the single-process mean — however the members are split; advantages
  are normalised with the global minibatch's mean and std (one all-reduce per epoch); every rank
  runs the same number of micro-batches (empty ones where it holds fewer members), gradient sync
  off for all but the last, so every rank joins every reduction.

The target-KL decision uses the epoch's KL summed over ranks, the same value on every rank; the
returned metrics are global (reduced over ranks), identical on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from fleetrl.algos.common.logprobs import combine, per_sample
from fleetrl.algos.common.optim import fused_step
from fleetrl.algos.ppo.config import PPOConfig
from fleetrl.constants import constant
from fleetrl.observations import Observation, map_obs
from fleetrl.parallel.grad_check import check_all_ranks_reach_every_parameter
from fleetrl.parallel.sharding import Minibatches
from fleetrl.parallel.wrap import LossPath


@dataclass
class PPOBatch:
    """Flat (B, ...) training data of one iteration."""

    obs: Observation  # a tensor, or a dict of tensors (Dict observations)
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    steps: torch.Tensor | None = None  # (B,) env steps each decision executed (action chunks)

    def __getitem__(self, index: torch.Tensor) -> PPOBatch:
        return PPOBatch(
            map_obs(lambda x: x[index], self.obs),
            self.actions[index],
            self.logprobs[index],
            self.values[index],
            self.advantages[index],
            self.returns[index],
            None if self.steps is None else self.steps[index],
        )

    def __len__(self) -> int:
        return self.actions.shape[0]

    def to(self, device: torch.device) -> PPOBatch:
        return PPOBatch(
            map_obs(lambda x: x.to(device), self.obs),
            self.actions.to(device),
            self.logprobs.to(device),
            self.values.to(device),
            self.advantages.to(device),
            self.returns.to(device),
            None if self.steps is None else self.steps.to(device),
        )


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Per-sample policy loss: max(-A·r, -A·clip(r, 1±ε))."""
    ratio = log_ratio.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))


def policy_objective(
    log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample clipped policy loss (B,). With per-piece log-ratios (B, M) — tokens or chunk
    actions (`fleetrl.algos.common.logprobs`) — each piece's ratio is clipped on its own against the
    sample's advantage, and the sample's loss is their (weighted) mean."""
    if log_ratio.dim() > 1:
        return per_sample(clipped_surrogate(log_ratio, advantages.unsqueeze(-1), clip_coef), weights)
    return clipped_surrogate(log_ratio, advantages, clip_coef)


def value_error(values: torch.Tensor, batch: PPOBatch, config: PPOConfig, clip_coef: float) -> torch.Tensor:
    """Per-sample squared value error, clipped around the old values with `clip_vloss`."""
    error = (values - batch.returns).pow(2)
    if config.clip_vloss:
        clipped = batch.values + (values - batch.values).clamp(-clip_coef, clip_coef)
        error = torch.max(error, (clipped - batch.returns).pow(2))
    return error


def ppo_loss(
    module: nn.Module,
    batch: PPOBatch,
    advantages: torch.Tensor,
    config: PPOConfig,
    clip_coef: float,
    reduce: Callable[[torch.Tensor], torch.Tensor] = torch.mean,
    train_policy: bool = True,
):
    """(scalar loss, detached [policy loss, value loss, entropy], detached `Ratios`) of `batch`
    with these (normalised) `advantages`; `reduce` (mean or sum) makes the per-sample terms scalars.
    Without `train_policy` (a critic warm-up) the policy loss and entropy bonus weigh 0: still in
    the graph, so every parameter gets its (zero) gradient and DDP's reductions line up.

    Nothing here calls `.item()`: the statistics stay tensors, so a minibatch never waits.
    """
    logprobs, entropy, values = module(batch.obs, batch.actions)
    logprobs, old_logprobs, entropy, weights = combine(
        logprobs, batch.logprobs, entropy, batch.steps, config.logprob_type, config.entropy_type
    )
    log_ratio = logprobs - old_logprobs
    policy_loss = reduce(policy_objective(log_ratio, advantages, clip_coef, weights))
    value_loss = reduce(value_error(values, batch, config, clip_coef)) * constant(0.5)
    entropy = reduce(entropy)
    loss = (policy_loss if train_policy else policy_loss * constant(0.0)) + value_loss * constant(config.vf_coef)
    if config.ent_coef:
        loss = loss - entropy * constant(config.ent_coef if train_policy else 0.0)
    parts = torch.stack([policy_loss.detach(), value_loss.detach(), entropy.detach()])
    return loss, parts, Ratios(log_ratio.detach(), weights)


def normalised(advantages: torch.Tensor, normalise: bool) -> torch.Tensor:
    """Advantages shifted and scaled to mean 0, std 1 with their own statistics (when `normalise`)."""
    return standardised(advantages, advantages.mean(), advantages.std()) if normalise else advantages


def standardised(values: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """`values` shifted by `mean` and scaled by `std` (guarded against a zero std)."""
    return (values - mean) / (std + 1e-8)


@dataclass
class Ratios:
    """A piece's log-ratios and their weights (`fleetrl.algos.common.logprobs`), for the KL statistics."""

    log_ratio: torch.Tensor
    weights: torch.Tensor | None

    @staticmethod
    def cat(parts: list[Ratios]) -> Ratios:
        weighted = parts[0].weights is not None
        return Ratios(
            torch.cat([p.log_ratio for p in parts]), torch.cat([p.weights for p in parts]) if weighted else None
        )


def kl_and_clipped(ratios: Ratios, clip_coef: float) -> torch.Tensor:
    """[Σ approximate KL(old‖new), Σ clipped] over the samples, float64: the k3 estimator
    (unbiased, always ≥ 0) and the clipped share, per piece (token, chunk action) averaged for
    per-piece ratios."""
    log_ratio, weights = ratios.log_ratio, ratios.weights
    ratio = log_ratio.exp()
    return torch.stack(
        [
            per_sample((ratio - 1) - log_ratio, weights).sum().double(),
            per_sample(((ratio - 1).abs() > clip_coef).float(), weights).sum().double(),
        ]
    )


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


def minibatch_step(
    loss_path: LossPath,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[torch.Tensor],
    micro_loss: Callable[[torch.Tensor], torch.Tensor],
    max_grad_norm: float,
    check: str | None = None,
    loss_name: str = "PPO",
    grad_step: int = 1,
) -> None:
    """One optimizer step on a minibatch, the `grad_step`-th of the update: `micro_loss(index)`
    backpropagated for each of its micro-batches (gradient sync off for all but the last), the
    global gradient norm clipped. Under DDP, before the backward that synchronises, every rank's
    loss is checked to reach every parameter (parallel/grad_check.py: else the ranks' reductions
    differ); elsewhere `check` (the loss's name) checks once that every parameter got a gradient."""
    step = None if loss_path.strategy == "fsdp" else fused_step(optimizer)  # FSDP's DTensor shards: torch's own
    if step is None:
        optimizer.zero_grad(set_to_none=True)
    else:
        step.zero_grad()
    for j, index in enumerate(micro_batches):
        syncs = j == len(micro_batches) - 1
        with nullcontext() if syncs else loss_path.no_sync():
            loss = micro_loss(index)
            if syncs and loss_path.strategy == "ddp":
                check_all_ranks_reach_every_parameter(loss, loss_path.policy, loss_path.ignored, loss_name, grad_step)
            loss.backward()
    if check is not None:
        check_every_parameter_has_a_gradient(loss_path.policy, loss_path.ignored, check)
    if max_grad_norm > 0:
        loss_path.clip_grad_norm_(max_grad_norm)
    if step is None:
        optimizer.step()
    else:
        step()


def ppo_update(
    loss_path: LossPath,
    optimizer: torch.optim.Optimizer,
    batch: PPOBatch,
    config: PPOConfig,
    clip_coef: float,
    minibatches: Minibatches,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
    train_policy: bool = True,
) -> dict:
    """Run the epochs on this rank's `batch` (its env columns, flattened step-major); returns the
    mean losses, KL, clip fraction, grad steps and the epochs done, global over ranks.
    `all_reduce` sums a tensor over ranks (identity with one); without `train_policy` only the
    value loss trains (`ppo_loss`).

    Per gradient step only the loss, its backward, the clip and the optimizer step run: the loss
    terms are collected and summed once per update, and the KL / clip fraction statistics are
    computed once per epoch where `target_kl` reads them, else once for the last epoch (the one
    reported). When the one minibatch is the whole batch in order (one rank, minibatch ≥ batch:
    RL-Zoo's CartPole set), it is used as is and its advantages normalised once per update."""
    whole, size, minibatch = minibatches.whole, minibatches.shard.global_size, minibatches.size
    scale = minibatches.shard.world_size / minibatch
    device = batch.actions.device
    normalise = config.norm_adv and minibatch > 1
    reduce = torch.mean if whole else torch.sum
    whole_batch = whole and len(batch) <= minibatch  # every epoch's only minibatch: the batch, in order
    parts: list[torch.Tensor] = []  # [policy loss, value loss, entropy] of each piece
    weights: list[int] = []  # what each piece's parts are multiplied by to make sums over samples
    log_ratios: list[Ratios] = []  # this epoch's, for its KL and clip fraction
    grad_steps, epochs_done, reduced_kl = 0, 0, None
    means = stds = None  # whole: each minibatch's own; pieces: the global minibatches', per epoch
    fixed_advantages = normalised(batch.advantages, normalise) if whole_batch else None
    whole_plan = [[torch.arange(len(batch))]]  # what `minibatches.epoch()` plans then, without the planning

    def micro_loss(index: torch.Tensor, k: int) -> torch.Tensor:
        if whole_batch:
            part, advantages = batch, fixed_advantages
        else:
            part = batch[index.to(device)]
            advantages = part.advantages
            if normalise:
                advantages = normalised(advantages, True) if whole else standardised(advantages, means[k], stds[k])
        loss, loss_parts, log_ratio = ppo_loss(
            loss_path.module, part, advantages, config, clip_coef, reduce, train_policy
        )
        parts.append(loss_parts)
        weights.append(len(part) if whole else 1)
        log_ratios.append(log_ratio)
        return loss if whole else loss * scale

    for _ in range(config.update_epochs):
        plan = whole_plan if whole_batch else minibatches.epoch()
        if normalise and not whole:
            means, stds = minibatch_advantage_stats(batch.advantages, plan, minibatch, all_reduce)
        log_ratios.clear()
        for k, micro_batches in enumerate(plan):
            check = "PPO" if grad_steps == 0 and not whole else None
            step = partial(micro_loss, k=k)
            minibatch_step(
                loss_path, optimizer, micro_batches, step, config.max_grad_norm, check, "PPO", grad_steps + 1
            )
            grad_steps += 1
        epochs_done += 1
        if config.target_kl is not None:
            # Agreed across ranks: all see the same reduced KL, so all break at the same epoch.
            reduced_kl = all_reduce(kl_and_clipped(Ratios.cat(log_ratios), clip_coef))
            if (reduced_kl[0] / size).item() > config.target_kl:
                break
    totals = (torch.stack(parts).double() * torch.tensor(weights, dtype=torch.float64, device=device)[:, None]).sum(0)
    if reduced_kl is None:
        reduced = all_reduce(torch.cat([totals, kl_and_clipped(Ratios.cat(log_ratios), clip_coef)]))
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

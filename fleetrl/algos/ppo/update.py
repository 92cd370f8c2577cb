"""PPO's clipped actor-critic update (Schulman et al. 2017), read as CleanRL's `ppo.py`: for each
epoch, for each minibatch — the policy's new log-probs, entropy and value; the probability ratio;
the clipped surrogate; the value loss (clipped around the old values with `clip_vloss`); the
entropy bonus; backward; gradient clipping; the optimizer step.

One path for every layout: one process, or this rank's env columns of a trajectory spread over W
actor ranks, with or without gradient accumulation over micro-batches. Every rank trains on
exactly the minibatches one process would draw from the whole trajectory
(`fleetrl.parallel.sharding`): minibatch k is, on this rank, a list of *pieces* (one piece when
it lies whole on one rank; micro-batches, some possibly empty, otherwise), and

- a piece's loss is its per-sample terms summed and divided by M / W (M: the global minibatch
  size). DDP and FSDP average gradients over the W ranks, so the optimizer sees Σ over the
  minibatch / M — the single-process mean — however the members are split; with one rank and one
  piece it is the plain mean (on the CPU `torch.mean` is exactly the sum divided by M);
- gradients are reduced over ranks in the backward of the minibatch's last piece only, and every
  rank runs the same number of pieces, so every rank joins every reduction;
- advantages are normalised with the minibatch's mean and std: its own when it lies whole on this
  rank, else the global minibatch's from one all-reduce per epoch (`minibatch_advantage_stats`).

The target-KL decision uses the epoch's KL summed over ranks, the same value on every rank; the
returned metrics are global (reduced over ranks), identical on every rank. Nothing in a
gradient step calls `.item()`: the loss terms and the KL statistics stay tensors until the end
of the update (or of an epoch, where `target_kl` reads the KL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import nn

from fleetrl.algos.common.finite import UpdateChecks
from fleetrl.algos.common.logprobs import combine, per_sample
from fleetrl.algos.common.optim import fused_step
from fleetrl.algos.ppo.config import PPOConfig
from fleetrl.algos.ppo.correction import interpolated_log_ratio, weight_metrics, weight_sums
from fleetrl.algos.ppo.reference import k3
from fleetrl.constants import constant
from fleetrl.observations import Observation, map_obs
from fleetrl.parallel.grad_check import check_every_parameter_has_a_gradient
from fleetrl.parallel.sharding import Minibatches
from fleetrl.parallel.wrap import LossPath

# `ppo_loss`'s detached parts
LOSS_TERMS = ("policy loss", "value loss", "entropy", "prediction error", "KL to the reference")
EVIDENCE = len(LOSS_TERMS)  # where the reduced totals' non-finite evidence starts, then the KL statistics


@dataclass
class PPOBatch:
    """Flat (B, ...) training data of one iteration. `logprobs` are the ratio's denominator: the
    acting policy's, or with the decoupled objective the proximal policy's (the actor's weights
    at the update's start), the acting policy's then entering through `importance` — unless the
    proximal log-probs are interpolated (`interpolation`): then `logprobs` are the acting
    policy's and the ratio and weights are made from them in `ppo_loss`."""

    obs: Observation  # a tensor, or a dict of tensors (Dict observations)
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    steps: torch.Tensor | None = None  # (B,) env steps each decision executed (action chunks)
    # The decoupled objective's truncated importance weight min(ρ̄, π_prox/π_behaviour), at the
    # ratio's level ((B,), or (B, M) per piece: fleetrl.algos.common.logprobs); None: on-policy.
    importance: torch.Tensor | None = None
    # `algorithm.proximal_logprob: loglinear`: each sample's α (B,), log π_prox ≈ log μ + α (log π_θ −
    # log μ) (fleetrl.algos.ppo.correction.interpolation_weights); None: nothing interpolated.
    interpolation: torch.Tensor | None = None
    # `algorithm.kl_coef`: the reference policy's log-probs of the taken actions, shaped as
    # `logprobs` (fleetrl.algos.ppo.batch_pass, once an update); None: no KL penalty.
    reference_logprobs: torch.Tensor | None = None

    def __getitem__(self, index: torch.Tensor) -> PPOBatch:
        return PPOBatch(*(None if x is None else map_obs(lambda v: v[index], x) for x in self.columns()))

    def __len__(self) -> int:
        return self.actions.shape[0]

    def to(self, device: torch.device) -> PPOBatch:
        return PPOBatch(*(None if x is None else map_obs(lambda v: v.to(device), x) for x in self.columns()))

    def columns(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass
class Ratios:
    """A piece's log-ratios and their weights (`fleetrl.algos.common.logprobs`), for the KL statistics;
    with interpolated proximal log-probs also its decisions' log π_prox − log μ (B,), for the
    importance weights'."""

    log_ratio: torch.Tensor
    weights: torch.Tensor | None
    proximal: torch.Tensor | None = None

    @staticmethod
    def cat(parts: list[Ratios]) -> Ratios:
        def joined(name: str) -> torch.Tensor | None:
            return None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts])

        return Ratios(joined("log_ratio"), joined("weights"), joined("proximal"))


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Per-sample policy loss: max(-A·r, -A·clip(r, 1±ε))."""
    ratio = log_ratio.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))


def policy_objective(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
    weights: torch.Tensor | None = None,
    importance: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sample clipped policy loss (B,). With per-piece log-ratios (B, M) — tokens or chunk
    actions (`fleetrl.algos.common.logprobs`) — each piece's ratio is clipped on its own against the
    sample's advantage, and the sample's loss is their (weighted) mean. With `importance` (the
    decoupled objective, Hilton et al. 2021: the ratio is to the proximal policy) each piece's term
    is weighed by its truncated behaviour → proximal importance weight."""
    if log_ratio.dim() > 1:
        advantages = advantages.unsqueeze(-1)
    loss = clipped_surrogate(log_ratio, advantages, clip_coef)
    if importance is not None:
        loss = loss * importance
    return per_sample(loss, weights) if log_ratio.dim() > 1 else loss


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
    share: float | None = None,
    train_policy: bool = True,
    predict_coef: float | None = None,
):
    """(scalar loss, detached [policy loss, value loss, entropy, prediction error, KL to the
    reference], detached `Ratios`) of `batch` with these (normalised) `advantages`: each per-sample
    term summed and divided by `share` (None: the batch's size — the mean; `ppo_update` passes
    M / W, module docstring). With `predict_coef` the policy's auxiliary prediction error
    (`model.predict_keys`) weighs that much; without, it is 0. With the reference policy's log-probs
    in the batch (`algorithm.kl_coef`, fleetrl/algos/ppo/reference.py) each sample's k3 KL estimate
    at the ratio's level weighs `config.kl_coef`; without, the KL is 0 and nothing more runs.
    Without `train_policy` (a critic warm-up) the policy loss, entropy bonus, prediction error and
    KL weigh 0: still in the graph, so every parameter gets its (zero) gradient and DDP's
    reductions line up."""
    divisor = constant(float(len(batch) if share is None else share))
    outputs = module(batch.obs, batch.actions)
    values = outputs.value
    logprobs, old_logprobs, entropy, weights = combine(
        outputs.logprobs, batch.logprobs, outputs.entropy, batch.steps, config.logprob_type, config.entropy_type
    )
    log_ratio, importance, proximal = logprobs - old_logprobs, batch.importance, None
    if batch.interpolation is not None:  # the ratio to the interpolated proximal policy, weighed by it
        proximal = interpolated_log_ratio(logprobs, old_logprobs, batch.interpolation)
        log_ratio = log_ratio - proximal
        importance = proximal.exp().clamp(max=config.importance_cap)
        proximal = proximal.sum(-1) if proximal.dim() > 1 else proximal  # the decisions': Σ over their pieces
    policy_loss = policy_objective(log_ratio, advantages, clip_coef, weights, importance).sum() / divisor
    value_loss = value_error(values, batch, config, clip_coef).sum() / divisor * constant(0.5)
    entropy = entropy.sum() / divisor
    loss = (policy_loss if train_policy else policy_loss * constant(0.0)) + value_loss * constant(config.vf_coef)
    if config.ent_coef:
        loss = loss - entropy * constant(config.ent_coef if train_policy else 0.0)
    prediction = torch.zeros_like(value_loss)
    if predict_coef is not None:
        prediction = outputs.prediction_error.sum() / divisor
        loss = loss + prediction * constant(predict_coef if train_policy else 0.0)
    kl = torch.zeros_like(value_loss)
    if batch.reference_logprobs is not None:
        reference_logprobs = combine(
            outputs.logprobs,
            batch.reference_logprobs,
            outputs.entropy,
            batch.steps,
            config.logprob_type,
            config.entropy_type,
        )[1]
        kl = per_sample(k3(reference_logprobs, logprobs), weights).sum() / divisor
        loss = loss + kl * constant(config.kl_coef if train_policy else 0.0)
    parts = torch.stack([policy_loss.detach(), value_loss.detach(), entropy.detach(), prediction.detach(), kl.detach()])
    return loss, parts, Ratios(log_ratio.detach(), weights, proximal)


def ppo_update(
    loss_path: LossPath,
    optimizer: torch.optim.Optimizer,
    batch: PPOBatch,
    config: PPOConfig,
    clip_coef: float,
    minibatches: Minibatches,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
    train_policy: bool = True,
    predict_coef: float | None = None,
) -> dict:
    """Run the epochs on this rank's `batch` (its env columns, flattened step-major); returns the
    mean losses, KL, clip fraction, grad steps and the epochs done, global over ranks, with
    `predict_coef` (`model.predict_keys`) the mean prediction error, with the reference policy's
    log-probs in the batch (`algorithm.kl_coef`) the mean k3 KL to it, `reference_kl`, and with
    interpolated proximal log-probs (`batch.interpolation`) the importance weights' metrics of the
    last epoch, like its KL. `all_reduce` sums a tensor over ranks (identity with one); without
    `train_policy` only the value loss trains (`ppo_loss`)."""
    size, device = minibatches.shard.global_size, batch.actions.device
    share = minibatches.size / minibatches.shard.world_size  # what a piece's sums are divided by
    normalise = config.norm_adv and minibatches.size > 1
    step = fused_step(optimizer)  # optimizer.step() and zero_grad(), less their per-call Python
    shard = minibatches.shard  # NaN/inf: algos/common/finite.py
    params = loss_path.parameters()
    checks = UpdateChecks(loss_path.policy, LOSS_TERMS, "the PPO update", shard.rank, shard.world_size, params)
    grad_steps, epochs_done, reduced_kl = 0, 0, None
    for _ in range(config.update_epochs):
        plan = minibatches.epoch()  # per minibatch, this rank's pieces (sample indices)
        if normalise and not minibatches.whole:
            means, stds = minibatch_advantage_stats(batch.advantages, plan, minibatches.size, all_reduce)
        ratios: list[Ratios] = []  # this epoch's, for its KL and clip fraction
        for k, pieces in enumerate(plan):
            step.zero_grad()
            for j, index in enumerate(pieces):
                last = j == len(pieces) - 1
                with loss_path.sync(last):
                    piece = batch[index.to(device)]
                    advantages = piece.advantages
                    if normalise:  # the minibatch's own statistics where it lies whole here
                        mean, std = (advantages.mean(), advantages.std()) if minibatches.whole else (means[k], stds[k])
                        advantages = standardised(advantages, mean, std)
                    loss, loss_parts, ratio = ppo_loss(
                        loss_path.module,
                        piece,
                        advantages,
                        config,
                        clip_coef,
                        share,
                        train_policy,
                        predict_coef,
                    )
                    loss_path.backward(loss, last, "PPO", grad_steps + 1)
                checks.loss(loss_parts, grad_steps + 1)  # LOSS_TERMS / share
                ratios.append(ratio)
            if grad_steps == 0 and not minibatches.whole:
                check_every_parameter_has_a_gradient(loss_path.policy, loss_path.ignored, "PPO")
            if config.max_grad_norm > 0:  # the gradients checked before clipping, which takes their norms
                loss_path.clip_grad_norm_(config.max_grad_norm, checks.gradient_norms(params, grad_steps + 1))
            step()
            grad_steps += 1
        epochs_done += 1
        if config.target_kl is not None:
            # Agreed across ranks: all see the same reduced KL, so all break at the same epoch.
            reduced_kl = all_reduce(kl_and_clipped(Ratios.cat(ratios), clip_coef))
            if (reduced_kl[0] / size).item() > config.target_kl:
                break
    totals = (checks.loss_table().double() * share).sum(0)  # Σ over this rank's samples
    last = Ratios.cat(ratios)  # the last epoch's: its KL, clip fraction and importance weights are reported
    weighed = [] if last.proximal is None else [weight_sums(last.proximal, config.importance_cap)]
    # [EVIDENCE:EVIDENCE + 2]: ranks whose loss, whose gradients went non-finite; then the weights'
    # sums (interpolated proximal log-probs); [-2:]: the KL statistics
    totals = torch.cat([totals, checks.evidence(), *weighed])
    if reduced_kl is None:
        reduced = all_reduce(torch.cat([totals, kl_and_clipped(last, clip_coef)]))
    else:
        reduced = torch.cat([all_reduce(totals), reduced_kl])
    # a NaN or inf loss, gradient or parameter: NonFiniteError, nothing returned
    checks.verify(reduced[EVIDENCE : EVIDENCE + 2])
    means = (reduced[:EVIDENCE] / (grad_steps * minibatches.size)).tolist()
    policy_loss, value_loss, entropy, prediction, reference_kl = means
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": float(reduced[-2] / size),
        "clip_fraction": float(reduced[-1] / size),
        "grad_steps": grad_steps,
        "epochs": epochs_done,
    }
    if predict_coef is not None:
        metrics["prediction_error"] = prediction
    if batch.reference_logprobs is not None:
        metrics["reference_kl"] = reference_kl
    if weighed:
        metrics.update(weight_metrics(reduced[EVIDENCE + 2 : -2]))
    return metrics


def standardised(values: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """`values` shifted by `mean` and scaled by `std` (guarded against a zero std)."""
    return (values - mean) / (std + 1e-8)


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
            for a in (advantages[torch.cat(pieces).to(advantages.device)].double() for pieces in plan)
        ]
    )
    sums = all_reduce(sums)
    mean = sums[:, 0] / size
    variance = ((sums[:, 1] - sums[:, 0] * mean) / (size - 1)).clamp_min(0)
    return mean.float(), variance.sqrt().float()


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

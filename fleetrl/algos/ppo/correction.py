"""PPO on samples that an older policy acted: the proximal pass, the decoupled objective's
importance weights and V-trace's targets (`algorithm.off_policy_correction`, `algorithm.adv_type:
vtrace`; docs/concepts/algorithms.md, Samples an older policy acted).

Three policies meet in an update on stale samples: the *acting* (behaviour) policy μ, whose
log-probs the rollout recorded; the *proximal* policy π_prox, the actor's weights at the update's
start; and the policy π_θ being trained. The decoupled objective (Hilton et al. 2021) clips the
ratio π_θ / π_prox — the trust region is around the weights the update starts from, however old
the samples — and weighs each sample's term by min(ρ̄, π_prox / μ): the importance weight that
makes the expectation over μ's samples one over π_prox's, truncated at ρ̄ so that one unlikely
action cannot dominate the batch. V-trace uses the same ratio for its targets. On-policy
(π_prox = μ) the weights are 1 and both reduce to PPO with GAE(λ).

The proximal log-probs come from a forward pass over the batch (`proximal_pass`), or with
`algorithm.proximal_logprob: loglinear` from no pass at all (AReaL's proximal log-probability
approximation): log π_prox ≈ log μ + α (log π_θ − log μ), interpolated in policy versions between
the acting policy (version v − a for a sample a versions old) and the policy being trained, which
becomes version v + 1 — the proximal policy being version v, α = a / (a + 1)
(`interpolation_weights`). π_θ enters without gradient, so the clipped ratio's log is
(1 − α)(log π_θ − log μ) with log π_θ's gradient, and the importance weight moves with π_θ
through the update (`interpolated_log_ratio`, applied in update.py's `ppo_loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from fleetrl.algos.common.logprobs import combine
from fleetrl.algos.common.vtrace import compute_vtrace
from fleetrl.algos.ppo.batch_pass import batch_pass
from fleetrl.algos.ppo.config import PPOConfig
from fleetrl.non_finite import NonFiniteError, all_finite, first_non_finite
from fleetrl.trajectory import Trajectory

# A ratio within this (relative) of the cap is not counted as truncated: on-policy, the proximal
# pass recomputes the acting log-probs (another batch shape, the rollout's autocast) to float rounding.
ROUNDING = 1e-3


class Proximal(NamedTuple):
    """The actor's policy at an update's start, on that update's batch (`proximal_pass`)."""

    logprobs: torch.Tensor  # the taken actions' log-probs, shaped as Trajectory.logprobs
    values: torch.Tensor  # (T, N)


def proximal_pass(module: nn.Module, trajectory: Trajectory, piece: int, device: torch.device) -> Proximal:
    """`module`'s (the loss path's: DDP, FSDP or the policy) log-probs of the taken actions and
    its values, before any step of the update (`batch_pass`), checked finite."""
    return checked(Proximal(*batch_pass(module, trajectory, piece, device)))


def checked(proximal: Proximal) -> Proximal:
    """`proximal` if its log-probs and values are all finite, else `NonFiniteError` naming the
    first non-finite one by its step and env in this rank's batch: the check the rollout makes of
    the acting policy's outputs before recording them (workers/rollout_worker.py), made of the
    proximal policy's before the decoupled objective weighs by them or V-trace targets them — the
    update would show such a NaN only as its loss. One pass over T x N values already on the host."""
    for what, tensor in (("log-probability", proximal.logprobs), ("value", proximal.values)):
        array = tensor.numpy()
        if not all_finite(array):
            index, value = first_non_finite(array)
            element = f", element {list(index[2:])}" if len(index) > 2 else ""
            where = f"step {index[0]}, env {index[1]} of this rank's batch{element}, in the proximal pass"
            raise NonFiniteError(f"proximal policy {what}", what, value, where)
    return proximal


def log_ratio(proximal: Proximal, trajectory: Trajectory, level: str) -> torch.Tensor:
    """log π_prox − log μ of the executed actions at `level` (`algorithm.logprob_type`'s
    levels: fleetrl/algos/common/logprobs.py), shaped (T, N), or (T, N, M) per piece."""
    steps, envs = trajectory.rewards.shape
    executed = None if trajectory.steps is None else trajectory.steps.flatten()
    prox, acting = proximal.logprobs.flatten(0, 1), trajectory.logprobs.flatten(0, 1)
    new, old, _, _ = combine(prox, acting, prox, executed, level, level)
    return (new - old).reshape(steps, envs, *new.shape[1:])


def importance_weights(proximal: Proximal, trajectory: Trajectory, level: str, cap: float) -> torch.Tensor:
    """min(ρ̄, π_prox / μ) at the clipped ratio's `level`: what the decoupled objective weighs
    each term by (`policy_objective`'s `importance`)."""
    return log_ratio(proximal, trajectory, level).exp().clamp(max=cap)


def vtrace_targets(trajectory: Trajectory, proximal: Proximal, algo: PPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace's (advantages, value targets) with the proximal critic and ratios of whole
    decisions. V(x_{t+1}) is the proximal critic's value of the next step's observation within
    the window; across a truncation and past the window's end it is the acting critic's (the
    final and the last observations are not kept: a stale bootstrap there)."""
    values = proximal.values
    following = torch.where(trajectory.dones[:-1], trajectory.next_values[:-1], values[1:])
    next_values = torch.cat([following, trajectory.next_values[-1:]])
    return compute_vtrace(
        trajectory.rewards,
        values,
        next_values,
        trajectory.terminated,
        trajectory.dones,
        log_ratio(proximal, trajectory, "chunk_level"),
        algo.gamma,
        algo.gae_lambda,
        algo.importance_cap,
        algo.trace_cap,
        trajectory.steps,
    )


def interpolation_weights(ages: torch.Tensor) -> torch.Tensor:
    """α = a / (a + 1) of each sample's age a in policy versions (`Trajectory.ages`), float32:
    how far log π_prox lies from the acting policy's log-prob towards the trained policy's."""
    ages = ages.double()
    return (ages / (ages + 1)).float()


def interpolated_log_ratio(new: torch.Tensor, acting: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """log π_prox − log μ ≈ α (log π_θ − log μ) at the ratio's level — `new` and `acting` (B,), or
    (B, M) per piece, `alpha` (B,) — with no gradient through π_θ."""
    if new.dim() > 1:
        alpha = alpha.unsqueeze(-1)
    return alpha * (new.detach() - acting)


def weight_sums(log_ratios: torch.Tensor, cap: float) -> torch.Tensor:
    """[Σ π_prox / μ, the decisions truncated at `cap` by more than ROUNDING, the decisions], float64,
    of the decisions' log π_prox − log μ (B,): what `weight_metrics` makes of their all-reduce."""
    ratio = log_ratios.double().exp()
    count = torch.tensor(float(ratio.numel()), dtype=torch.float64, device=ratio.device)
    return torch.stack([ratio.sum(), (ratio > cap * (1 + ROUNDING)).double().sum(), count])


def weight_metrics(sums: torch.Tensor) -> dict:
    """The mean π_prox / μ (1 on-policy) and the share of decisions truncated, from every rank's
    `weight_sums` summed — how far the samples lag."""
    total, truncated, count = sums.tolist()
    return {"importance_weight_mean": total / count, "importance_truncated": truncated / count}


def importance_metrics(
    proximal: Proximal, trajectory: Trajectory, cap: float, all_reduce: Callable[[torch.Tensor], torch.Tensor]
) -> dict:
    """`weight_metrics` of the proximal pass over every rank's decisions (one all-reduce)."""
    return weight_metrics(all_reduce(weight_sums(log_ratio(proximal, trajectory, "chunk_level"), cap)))

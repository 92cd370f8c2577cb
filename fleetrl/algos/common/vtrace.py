"""V-trace targets (Espeholt et al. 2018, IMPALA) with terminations ≠ truncations: value targets
and advantages for samples that a policy other than the learner's acted (`algorithm.adv_type:
vtrace`; docs/concepts/algorithms.md, Samples an older policy acted).

The learner's policy π (the proximal policy: the actor's weights at the update's start) and
critic V are compared with the behaviour policy μ that acted: per decision the truncated
importance weights ρ_t = min(ρ̄, π/μ) and c_t = λ·min(c̄, π/μ). With δ_t = ρ_t (r_t + γ_t V(x_{t+1})
− V(x_t)) the targets are

    v_t = V(x_t) + δ_t + γ_t c_t (v_{t+1} − V(x_{t+1}))

and the policy-gradient advantage is r_t + γ_t v_{t+1} − V(x_t) (IMPALA's q_t − V(x_t), left
unweighted here: the policy objective weighs each sample by its own truncated importance weight).
Where the episode ended at step t no correction flows back across the boundary; where it was
terminated the bootstrap is 0, where it was truncated it is V(final observation), its correction 0
(the episode's continuation lies outside the window). On-policy (π = μ, ρ̄ and c̄ ≥ 1) the targets
are GAE(λ)'s returns (tests/test_off_policy_correction.py checks both by hand).

Action chunks: step t is a decision that executed k_t env steps, its reward Σ_j γ^j r_{t+j};
γ_t = γ^{k_t}, as in GAE (algos/common/gae.py).
"""

from __future__ import annotations

import torch


def compute_vtrace(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    log_rhos: torch.Tensor,
    gamma: float,
    lam: float,
    rho_bar: float,
    c_bar: float,
    steps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, value targets) for (T, N) tensors.

    `values[t]` = V(x_t) and `next_values[t]` = V of the state that truly followed step t (the
    final observation on truncation), both the learner's; `log_rhos[t]` = log π(a_t|x_t) −
    log μ(a_t|x_t) of the decision's executed part."""
    discount = gamma if steps is None else torch.pow(torch.tensor(gamma, dtype=rewards.dtype), steps.to(rewards.dtype))
    ratio = log_rhos.exp()
    rho = ratio.clamp(max=rho_bar)
    trace = lam * ratio.clamp(max=c_bar)
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - dones.float()
    deltas = rho * (rewards + discount * not_terminated * next_values - values)
    corrections = torch.empty_like(rewards)  # v_t − V(x_t)
    advantages = torch.empty_like(rewards)
    following = torch.zeros_like(rewards[0])  # v_{t+1} − V(x_{t+1}) within the episode, 0 past the window
    for t in range(rewards.shape[0] - 1, -1, -1):
        gamma_t = discount if steps is None else discount[t]
        following = following * not_done[t]
        advantages[t] = rewards[t] + gamma_t * not_terminated[t] * (next_values[t] + following) - values[t]
        following = deltas[t] + gamma_t * trace[t] * following
        corrections[t] = following
    return advantages, values + corrections

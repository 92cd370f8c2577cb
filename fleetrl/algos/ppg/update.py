"""Phasic Policy Gradient (Cobbe et al. 2020): the auxiliary phase.

The policy phase is PPO (`fleetrl.algos.ppo.update`) on each iteration's data. Every `algorithm.n_pi`
policy iterations the auxiliary phase revisits the observations and value targets (GAE returns)
stored over those iterations for `algorithm.aux_epochs` epochs, minimising per minibatch

    L_aux = ½ (V_aux(s) − V_targ)²  +  β_clone · KL(π_old(·|s) ‖ π(·|s))  +  ½ (V(s) − V_targ)²

— the value distilled into the auxiliary head of the policy network, a behavioural-cloning term
that keeps the policy where the policy phase left it (π_old: the policy at the start of the
auxiliary phase), and the value network trained further on the same targets (the paper's
L_joint + L_value, as in its and CleanRL's implementations).

`aux_update` does this for one rank of W, holding its env columns of the stored data, with the
same rank-invariant minibatches one process would draw (`fleetrl.parallel.sharding`), losses summed
× W / M per micro-batch (DDP averages over ranks: the optimizer sees the single-process mean),
and empty micro-batches where a rank holds fewer members, so every rank joins every reduction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fleetrl.algos.common.finite import UpdateChecks
from fleetrl.algos.common.optim import fused_step
from fleetrl.algos.ppg.config import PPGConfig
from fleetrl.parallel.grad_check import check_every_parameter_has_a_gradient
from fleetrl.parallel.sharding import Minibatches
from fleetrl.parallel.wrap import LossPath


def is_aux_iteration(policy_iterations: int, n_pi: int) -> bool:
    """Whether the auxiliary phase follows policy iteration number `policy_iterations` (1-based):
    after every n_pi-th. A function of the iteration count only, hence the same on every rank."""
    return policy_iterations > 0 and policy_iterations % n_pi == 0


@torch.no_grad()
def distribution_inputs(policy, obs: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """π_old for the stored observations (see `Policy.distribution_inputs`), in chunks."""
    return torch.cat([policy.distribution_inputs(policy.network(part)[0]) for part in obs.split(chunk)])


def aux_update(
    loss_path: LossPath,
    optimizer: torch.optim.Optimizer,
    obs: torch.Tensor,
    returns: torch.Tensor,
    old: torch.Tensor,
    config: PPGConfig,
    minibatches: Minibatches,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
) -> dict:
    """The auxiliary phase on this rank's stored data: `obs`, `returns` and `old` (π_old's
    distribution inputs) flattened step-major over the stored (steps, local envs). `loss_path`:
    a LossPath whose module is `forward_aux` (`fleetrl.algos.ppg.aux_head`; DDP-wrapped with
    several ranks). Returns global metrics, identical on every rank."""
    policy, device = loss_path.policy, obs.device
    scale = minibatches.shard.world_size / minibatches.size  # a piece's sums × W / M (module docstring)
    step = fused_step(optimizer)
    checks = UpdateChecks(
        policy,
        ("aux-head loss", "KL", "value loss"),
        "the PPG auxiliary phase",
        minibatches.shard.rank,
        minibatches.shard.world_size,
    )
    params = loss_path.parameters()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # Σ aux-head loss, KL, value loss
    grad_steps = 0
    for _ in range(config.aux_epochs):
        for pieces in minibatches.epoch():
            step.zero_grad()
            for j, index in enumerate(pieces):
                last = j == len(pieces) - 1
                with loss_path.sync(last):
                    index = index.to(device)
                    inputs, values, aux_values = loss_path.module(obs[index])
                    target = returns[index]
                    aux_sum = 0.5 * (aux_values - target).pow(2).sum()
                    kl_sum = policy.kl(old[index], inputs).sum()
                    value_sum = 0.5 * (values - target).pow(2).sum()
                    loss = (aux_sum + config.beta_clone * kl_sum + value_sum) * scale
                    loss_path.backward(loss, last, "PPG auxiliary", grad_steps + 1)
                terms = torch.stack([aux_sum.detach(), kl_sum.detach(), value_sum.detach()])
                checks.loss(terms, grad_steps + 1)
                totals.add_(terms.double())
            if grad_steps == 0:
                check_every_parameter_has_a_gradient(policy, loss_path.ignored, "PPG auxiliary")
            if config.max_grad_norm > 0:  # the gradients checked before clipping, which takes their norms
                loss_path.clip_grad_norm_(config.max_grad_norm, checks.gradient_norms(params, grad_steps + 1))
            step()
            grad_steps += 1
    reduced = all_reduce(torch.cat([totals, checks.evidence()]))  # [3:5]: ranks whose loss, gradients went non-finite
    checks.verify(reduced[3:5])  # a NaN or inf loss, gradient or parameter: NonFiniteError
    head, kl, value = (reduced[:3] / (grad_steps * minibatches.size)).tolist()
    return {"aux_head_loss": head, "aux_kl": kl, "aux_value_loss": value, "aux_grad_steps": grad_steps}

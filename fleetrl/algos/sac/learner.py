"""Soft Actor-Critic (Haarnoja et al. 2018, with the automatic temperature of the follow-up paper)
for Box actions: a tanh-squashed Gaussian actor, twin Q critics with Polyak-averaged targets.

The maths is Stable-Baselines3's SAC (what `benchmarks/compare/sac_pendulum.py` compares against):
actions live in [-1, 1]^d (the env's Box, rescaled by the rollout worker), log std clamped to
[-20, 2], critic loss ½·Σᵢ MSE(Qᵢ, y), y = r + γ·(1 - terminated)·(min Q̄(s', a') - α·log π(a'|s')),
actor loss mean(α·log π(a|s) - min Q(s, a)), temperature loss -mean(log α · (log π + H̄)); the
actor and temperature losses use the critics as just updated and α as it was before this step.

Per gradient step the cost is the matmuls of the networks (`fleetrl.algos.sac.networks`); the
rest is kept small:
- the actor loss goes through the critics with *detached* weights: the critic weight gradients
  that SB3 and CleanRL compute there and throw away (a third of a critic backward) are never
  computed, and the critics' DDP wrapper is not involved;
- the actor and the temperature share one fused Adam step (one DDP reduction with several
  ranks: `PolicyAndAlpha`), the critics another, both without the optimizer's per-call Python
  overhead (`fleetrl.algos.common.optim.FusedAdamStep`); Polyak averaging is one `_foreach_lerp_`;
- nothing calls `.item()`: statistics accumulate as tensors and are read once per iteration.

(Two critics as one batched matmul — `GroupedLinear` — was measured and is slower here: MKL's
bmm is ~2× slower per flop than mm at these shapes, and its backward copies weights.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fleetrl.algos.common.finite import UpdateChecks
from fleetrl.algos.common.optim import FusedAdamStep, build_optimizer
from fleetrl.algos.sac.config import SACConfig
from fleetrl.algos.sac.networks import EntropyCoefficient, SquashedGaussianActor, TwinQ
from fleetrl.parallel.wrap import clip_grad_norm_


class PolicyAndAlpha(nn.Module):
    """The policy phase's loss path: the actor and log α in one module, so that with several
    ranks one DDP wrapper (one gradient reduction) serves the actor and the temperature loss."""

    def __init__(self, actor: SquashedGaussianActor, entropy: EntropyCoefficient):
        super().__init__()
        self.actor, self.entropy = actor, entropy

    def forward(self, obs: torch.Tensor, noise: torch.Tensor):
        actions, log_prob = self.actor(obs, noise)
        return actions, log_prob, self.entropy.log_alpha


@dataclass
class SACBatch:
    """One gradient step's sample (this rank's part of it)."""

    obs: torch.Tensor  # (B, *obs_shape)
    actions: torch.Tensor  # (B, d) in [-1, 1]
    rewards: torch.Tensor  # (B,)
    discount: torch.Tensor  # (B,) γ·(1 - terminated)
    next_obs: torch.Tensor  # (B, *obs_shape)
    noise: torch.Tensor  # (2, B, d) standard normal: for the next actions, and for the actor loss


@dataclass
class SACWeights:
    """What rollout workers receive: the actor's weights and whether to act at random (warm-up)."""

    actor: dict
    random_actions: bool


class SACLearner:
    """The networks, their optimizers and one gradient step. `critic_path` / `policy_path` are
    what the losses call: the modules themselves, or their DDP wrappers (`wrap`)."""

    def __init__(
        self, config, actor: SquashedGaussianActor, critic: TwinQ, critic_target: TwinQ, entropy: EntropyCoefficient
    ):
        algo: SACConfig = config.algorithm
        self.algo = algo
        self.actor, self.critic, self.critic_target, self.entropy = actor, critic, critic_target, entropy
        self.critic_path: nn.Module = critic
        self.policy_path: nn.Module = PolicyAndAlpha(actor, entropy)
        self.q_lr = algo.q_lr if algo.q_lr is not None else algo.lr
        self.policy_lr = algo.policy_lr if algo.policy_lr is not None else algo.lr
        self.critic_optimizer = build_optimizer(config.actor, [{"params": list(critic.parameters()), "lr": self.q_lr}])
        groups = [{"params": list(actor.parameters()), "lr": self.policy_lr}]
        if algo.autotune:  # the temperature learns at the critics' rate (as CleanRL)
            groups.append({"params": [entropy.log_alpha], "lr": self.q_lr})
        self.policy_optimizer = build_optimizer(config.actor, groups)
        self.critic_step, self.policy_step = FusedAdamStep(self.critic_optimizer), FusedAdamStep(self.policy_optimizer)
        self.critic_params = list(critic.parameters())
        self.target_params = list(critic_target.parameters())
        self.actor_params = list(actor.parameters())
        self.target_entropy = (
            float(algo.target_entropy) if algo.target_entropy is not None else -float(actor.action_dim)
        )
        self.grad_steps = 0  # global: every rank counts the same
        self.reset_stats()

    def wrap(self, make_ddp) -> None:
        """Several ranks: the two loss paths through `make_ddp(module)` (each its own reducer;
        every rank calls them in the same order: critic, then policy)."""
        self.critic_path = make_ddp(self.critic)
        self.policy_path = make_ddp(self.policy_path)

    def set_progress(self, progress: float) -> None:
        """Learning rates at `progress` (global env steps / total): linear decay with anneal_lr."""
        scale = max(0.0, 1.0 - progress) if self.algo.anneal_lr else 1.0
        self.critic_optimizer.param_groups[0]["lr"] = self.q_lr * scale
        self.policy_optimizer.param_groups[0]["lr"] = self.policy_lr * scale
        if self.algo.autotune:
            self.policy_optimizer.param_groups[1]["lr"] = self.q_lr * scale

    def reset_stats(self, rank: int = 0, ranks: int = 1) -> None:
        """Per-step statistics, kept as detached tensors (no reduction, no `.item()` per step),
        and the round's non-finite checks (algos/common/finite.py) of actor rank `rank` of `ranks`."""
        self.critic_stats: list[torch.Tensor] = []  # [critic loss, Q1] of each critic update
        self.policy_stats: list[torch.Tensor] = []  # [actor loss, temperature loss, log π] of each policy update
        self.critic_checks = UpdateChecks(self.critic, ("critic loss",), "the SAC critic update", rank, ranks)
        policy_and_alpha = getattr(self.policy_path, "module", self.policy_path)  # under DDP, what it wraps
        self.policy_checks = UpdateChecks(
            policy_and_alpha, ("actor loss", "temperature loss"), "the SAC policy update", rank, ranks
        )

    def evidence(self) -> torch.Tensor:
        """The critic's and the policy's `UpdateChecks.evidence()`, one after the other."""
        return torch.cat([self.critic_checks.evidence(), self.policy_checks.evidence()]).float()

    def verify(self, evidence: torch.Tensor) -> None:
        """`NonFiniteError` for the first non-finite loss, gradient or parameter of the round;
        `evidence`: `evidence()` summed over ranks."""
        self.critic_checks.verify(evidence[:2])
        self.policy_checks.verify(evidence[2:])

    def mean_stats(self) -> torch.Tensor:
        """[critic loss, mean Q1, actor loss, temperature loss, entropy estimate -log π], means
        over this round's updates (the policy part 0 when there was none)."""
        critic = torch.stack([torch.stack([loss, q.mean()]) for loss, q in self.critic_stats]).mean(0)
        if not self.policy_stats:
            return torch.cat([critic, torch.zeros(3)])
        policy = torch.stack(
            [torch.stack([loss, alpha_loss, -log_prob.mean()]) for loss, alpha_loss, log_prob in self.policy_stats]
        ).mean(0)
        return torch.cat([critic, policy])

    def update(self, batch: SACBatch) -> None:
        """One gradient step: critics, then (every policy_frequency steps) actor and α, then
        (every target_network_frequency steps) the targets."""
        algo = self.algo
        alpha = self.entropy.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_log_prob = self.actor(batch.next_obs, batch.noise[0])
            target_q1, target_q2 = self.critic_target(batch.next_obs, next_actions)
            target = batch.rewards + batch.discount * (torch.minimum(target_q1, target_q2) - alpha * next_log_prob)
        q1, q2 = self.critic_path(batch.obs, batch.actions)
        critic_loss = 0.5 * (F.mse_loss(q1, target) + F.mse_loss(q2, target))
        self.critic_step.zero_grad()
        critic_loss.backward()
        self.critic_checks.loss(critic_loss.detach().reshape(1), self.grad_steps + 1)
        if algo.max_grad_norm > 0:  # the gradients checked before clipping, which takes their norms
            norms = self.critic_checks.gradient_norms(self.critic_params, self.grad_steps + 1)
            clip_grad_norm_(self.critic_params, algo.max_grad_norm, norms)
        self.critic_step()
        self.critic_stats.append((critic_loss.detach(), q1.detach()))

        if self.grad_steps % algo.policy_frequency == 0:
            actions, log_prob, log_alpha = self.policy_path(batch.obs, batch.noise[1])
            q1_pi, q2_pi = self.critic.frozen(batch.obs, actions)
            actor_loss = (alpha * log_prob - torch.minimum(q1_pi, q2_pi)).mean()
            log_prob = log_prob.detach()
            if algo.autotune:
                alpha_loss = -(log_alpha * (log_prob + self.target_entropy)).mean()
                loss = actor_loss + alpha_loss
            else:
                alpha_loss, loss = actor_loss.new_zeros(()), actor_loss
            self.policy_step.zero_grad()
            loss.backward()
            self.policy_checks.loss(torch.stack([actor_loss.detach(), alpha_loss.detach()]), self.grad_steps + 1)
            if algo.max_grad_norm > 0:  # the gradients checked before clipping, which takes their norms
                norms = self.policy_checks.gradient_norms(self.actor_params, self.grad_steps + 1)
                clip_grad_norm_(self.actor_params, algo.max_grad_norm, norms)
            self.policy_step()
            self.policy_stats.append((actor_loss.detach(), alpha_loss.detach(), log_prob))

        self.grad_steps += 1
        if self.grad_steps % algo.target_network_frequency == 0:
            polyak_(self.target_params, self.critic_params, algo.tau)

    def state_dict(self) -> dict:
        return {
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.grad_steps = state["grad_steps"]


@torch.no_grad()
def polyak_(target: list[torch.Tensor], source: list[torch.Tensor], tau: float) -> None:
    """target ← target + τ·(source - target) = (1 - τ)·target + τ·source, all tensors in one call."""
    torch._foreach_lerp_(target, source, tau)

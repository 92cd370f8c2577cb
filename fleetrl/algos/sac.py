"""Soft Actor-Critic (Haarnoja et al. 2018, with the automatic temperature of the follow-up paper)
for Box actions: a tanh-squashed Gaussian actor, twin Q critics with Polyak-averaged targets.

The maths is Stable-Baselines3's SAC (what `benchmarks/sac_pendulum_vs.py` compares against):
actions live in [-1, 1]^d (the env's Box, rescaled by the rollout worker), log std clamped to
[-20, 2], critic loss ½·Σᵢ MSE(Qᵢ, y), y = r + γ·(1 - terminated)·(min Q̄(s', a') - α·log π(a'|s')),
actor loss mean(α·log π(a|s) - min Q(s, a)), temperature loss -mean(log α · (log π + H̄)); the
actor and temperature losses use the critics as just updated and α as it was before this step.

Per gradient step the cost is the matmuls of the networks; the rest is kept small:
- no `torch.distributions` (no argument validation, no objects); the log-prob uses the drawn
  noise directly (the Gaussian part of log π(u) is a function of the noise);
- the actor loss goes through the critics with *detached* weights: the critic weight gradients
  that SB3 and CleanRL compute there and throw away (a third of a critic backward) are never
  computed, and the critics' DDP wrapper is not involved;
- the actor and the temperature share one fused Adam step (one DDP reduction with several
  ranks: `PolicyAndAlpha`), the critics another, both without the optimizer's per-call Python
  overhead (`FusedAdamStep`); Polyak averaging is one `_foreach_lerp_`;
- nothing calls `.item()`: statistics accumulate as tensors and are read once per iteration.

(Two critics as one batched matmul — `GroupedLinear` — was measured and is slower here: MKL's
bmm is ~2× slower per flop than mm at these shapes, and its backward copies weights.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl.config.schema import AlgorithmConfig
from fleetrl.models.mlp import ACTIVATIONS

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
TANH_EPS = 1e-6


def linear_stack(sizes: list[int]) -> nn.ModuleList:
    """Linear layers sizes[0] → sizes[1] → ..., PyTorch's default initialisation (as SB3's SAC)."""
    return nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in zip(sizes[:-1], sizes[1:]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """F.linear, or with `dtype` (bfloat16) its matmuls — forward and both backward ones — in that
    dtype, the result back in float32: mixed precision for the hidden-to-hidden layers, which cost
    the time. The input and output layers are small and stay float32."""
    if dtype is None:
        return F.linear(x, weight, bias)
    return F.linear(x.to(dtype), weight.to(dtype), bias.to(dtype)).float()


class SquashedGaussianActor(nn.Module):
    """obs → a = tanh(u), u ~ N(mean(obs), std(obs)): actions in [-1, 1]^d. The rollout worker maps
    them onto the env's Box: `action_bias + action_scale · a` (plain attributes, not buffers)."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes,
        activation: str,
        action_low: np.ndarray,
        action_high: np.ndarray,
        matmul_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.matmul_dtype = matmul_dtype
        self.trunk = linear_stack([obs_dim, *hidden_sizes])
        self.head = nn.Linear(hidden_sizes[-1] if hidden_sizes else obs_dim, 2 * action_dim)
        self.activation = ACTIVATIONS[activation]
        self.action_dim = action_dim
        low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
        self.action_scale, self.action_bias = (high - low) / 2, (high + low) / 2
        # Set by the actor worker (and sent with the weights): the rollout takes uniform random
        # actions while the run warms up (algorithm.learning_starts).
        self.random_actions = False

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1)
        for i, layer in enumerate(self.trunk):
            x = self.activation(linear(x, layer.weight, layer.bias, self.matmul_dtype if i else None))
        mean, log_std = self.head(x).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def forward(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss path: (actions (B, d), log π(actions | obs) (B,)) for the given standard-normal
        `noise` (B, d) — reparameterised, so gradients flow through the actions."""
        mean, log_std = self.distribution(obs)
        actions = torch.tanh(mean + log_std.exp() * noise)
        # log N(u; mean, std) = -½ noise² - log std - log √(2π), minus log |d tanh(u)/du| =
        # log(1 - tanh²u), with SB3's 1e-6 inside the log
        log_prob = -(0.5 * noise.square() + log_std + LOG_SQRT_2PI + torch.log(1 + TANH_EPS - actions.square()))
        return actions, log_prob.sum(-1)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Inference: actions in [-1, 1]^d (the mode's tanh when deterministic)."""
        mean, log_std = self.distribution(obs)
        if deterministic:
            return torch.tanh(mean)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return torch.tanh(mean + log_std.exp() * noise)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return self.action_bias + self.action_scale * actions


class TwinQ(nn.Module):
    """Two independent Q(s, a) MLPs on the same input."""

    def __init__(
        self, obs_dim: int, action_dim: int, hidden_sizes, activation: str, matmul_dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.matmul_dtype = matmul_dtype
        sizes = [obs_dim + action_dim, *hidden_sizes, 1]
        self.q1, self.q2 = linear_stack(sizes), linear_stack(sizes)
        self.activation = ACTIVATIONS[activation]

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q1, Q2), each (B,). The critic loss path."""
        x = torch.cat([obs.flatten(1), actions], dim=-1)
        return self._q(self.q1, x, False), self._q(self.q2, x, False)

    def frozen(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q1, Q2) with the weights detached: gradients reach `actions` (the actor loss), never
        the critics' weights."""
        x = torch.cat([obs.flatten(1), actions], dim=-1)
        return self._q(self.q1, x, True), self._q(self.q2, x, True)

    def _q(self, layers: nn.ModuleList, x: torch.Tensor, detach: bool) -> torch.Tensor:
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            weight, bias = (layer.weight.detach(), layer.bias.detach()) if detach else (layer.weight, layer.bias)
            x = linear(x, weight, bias, self.matmul_dtype if 0 < i < last else None)
            if i < last:
                x = self.activation(x)
        return x.squeeze(-1)


class EntropyCoefficient(nn.Module):
    """log α, trained with `algorithm.autotune`, else a constant (no gradient)."""

    def __init__(self, alpha: float, trainable: bool):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.full((1,), math.log(alpha)), requires_grad=trainable)


class PolicyAndAlpha(nn.Module):
    """The policy phase's loss path: the actor and log α in one module, so that with several
    ranks one DDP wrapper (one gradient reduction) serves the actor and the temperature loss."""

    def __init__(self, actor: SquashedGaussianActor, entropy: EntropyCoefficient):
        super().__init__()
        self.actor, self.entropy = actor, entropy

    def forward(self, obs: torch.Tensor, noise: torch.Tensor):
        actions, log_prob = self.actor(obs, noise)
        return actions, log_prob, self.entropy.log_alpha


MATMUL_DTYPES = {None: None, "float32": None, "bfloat16": torch.bfloat16}


def matmul_dtype(config) -> torch.dtype | None:
    """`algorithm.matmul_dtype` as a torch dtype (None: float32 throughout)."""
    return MATMUL_DTYPES[config.algorithm.matmul_dtype]


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


def build_adam(config, groups: list[dict]) -> torch.optim.Optimizer:
    """Adam(W) with the fused kernel (one call for all parameters of a group)."""
    optimizer_class = torch.optim.Adam if config.actor.optimizer == "adam" else torch.optim.AdamW
    return optimizer_class(groups, eps=config.actor.adam_eps, weight_decay=config.actor.weight_decay, fused=True)


class FusedAdamStep:
    """`optimizer.step()` of a fused torch Adam/AdamW without its per-call Python bookkeeping
    (parameter-group scans, state checks, device grouping: ~150 µs a call here, against ~10 µs for
    the fused kernel itself): the same two kernels — step counters += 1, then `_fused_adam(w)_` —
    on tensor lists cached after the first step. Bitwise the same result; the optimizer object
    keeps the state (checkpoints as usual; call `reset` after loading one)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.groups: list | None = None

    def reset(self) -> None:
        self.groups = None

    def __call__(self) -> None:
        if self.groups is None:
            self.optimizer.step()  # creates the state
            self.groups = []
            for group in self.optimizer.param_groups:
                state = [self.optimizer.state[p] for p in group["params"]]
                fused = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
                self.groups.append(
                    (
                        group,
                        fused,
                        list(group["params"]),
                        [s["exp_avg"] for s in state],
                        [s["exp_avg_sq"] for s in state],
                        [s["step"] for s in state],
                    )
                )
            return
        for group, fused, params, exp_avgs, exp_avg_sqs, steps in self.groups:
            grads = [p.grad for p in params]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            fused(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )


class SACLearner:
    """The networks, their optimizers and one gradient step. `critic_path` / `policy_path` are
    what the losses call: the modules themselves, or their DDP wrappers (`wrap`)."""

    def __init__(
        self, config, actor: SquashedGaussianActor, critic: TwinQ, critic_target: TwinQ, entropy: EntropyCoefficient
    ):
        algo: AlgorithmConfig = config.algorithm
        self.algo = algo
        self.actor, self.critic, self.critic_target, self.entropy = actor, critic, critic_target, entropy
        self.critic_path: nn.Module = critic
        self.policy_path: nn.Module = PolicyAndAlpha(actor, entropy)
        self.q_lr = algo.q_lr if algo.q_lr is not None else algo.lr
        self.policy_lr = algo.policy_lr if algo.policy_lr is not None else algo.lr
        self.critic_optimizer = build_adam(config, [{"params": list(critic.parameters()), "lr": self.q_lr}])
        groups = [{"params": list(actor.parameters()), "lr": self.policy_lr}]
        if algo.autotune:  # the temperature learns at the critics' rate (as CleanRL)
            groups.append({"params": [entropy.log_alpha], "lr": self.q_lr})
        self.policy_optimizer = build_adam(config, groups)
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

    def reset_stats(self) -> None:
        """Per-step statistics, kept as detached tensors (no reduction, no `.item()` per step)."""
        self.critic_stats: list[torch.Tensor] = []  # [critic loss, Q1] of each critic update
        self.policy_stats: list[torch.Tensor] = []  # [actor loss, temperature loss, log π] of each policy update

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
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        if algo.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.critic_params, algo.max_grad_norm, foreach=True)
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
            self.policy_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if algo.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.actor_params, algo.max_grad_norm, foreach=True)
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
        self.critic_step.reset()
        self.policy_step.reset()
        self.grad_steps = state["grad_steps"]


@torch.no_grad()
def polyak_(target: list[torch.Tensor], source: list[torch.Tensor], tau: float) -> None:
    """target ← target + τ·(source - target) = (1 - τ)·target + τ·source, all tensors in one call."""
    torch._foreach_lerp_(target, source, tau)

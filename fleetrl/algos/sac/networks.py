"""SAC's networks (Haarnoja et al. 2018): a tanh-squashed Gaussian actor, twin Q critics, and the
entropy coefficient, as Stable-Baselines3 builds them (PyTorch's default initialisation).

Per gradient step the cost is the networks' matmuls, so the forward passes avoid everything
else: no `torch.distributions` (the log-prob uses the drawn noise directly: the Gaussian part of
log π(u) is a function of the noise), and the critics can be evaluated with detached weights
(`TwinQ.frozen`) for the actor loss. With `algorithm.matmul_dtype: bfloat16` the
hidden-to-hidden layers run their matmuls in bfloat16 (`linear`).

`build_sac_actor` is the one place the actor is built from a config: the actor worker's trainable
copy and a rollout worker's inference copy are the same network.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl.config.schema import Config
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
        x = obs.flatten(1).float()
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

    def to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1]^d (what `act` returns and the replay buffer keeps) → the env's Box:
        `action_bias + action_scale · a`."""
        bias, scale = (torch.as_tensor(v, device=actions.device) for v in (self.action_bias, self.action_scale))
        return bias + scale * actions


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
        x = torch.cat([obs.flatten(1).float(), actions], dim=-1)
        return self._q(self.q1, x, False), self._q(self.q2, x, False)

    def frozen(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q1, Q2) with the weights detached: gradients reach `actions` (the actor loss), never
        the critics' weights."""
        x = torch.cat([obs.flatten(1).float(), actions], dim=-1)
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


MATMUL_DTYPES = {None: None, "float32": None, "bfloat16": torch.bfloat16}


def matmul_dtype(config) -> torch.dtype | None:
    """`algorithm.matmul_dtype` as a torch dtype (None: float32 throughout)."""
    return MATMUL_DTYPES[config.algorithm.matmul_dtype]


def space_dims(observation_space: gym.Space, action_space: gym.Space) -> tuple[int, int]:
    """(flat observation size, action dimension) of a Box observation and a 1-D Box action."""
    return int(np.prod(observation_space.shape)), int(action_space.shape[0])


def build_sac_actor(config: Config, observation_space: gym.Space, action_space: gym.Space) -> SquashedGaussianActor:
    """The actor for `config`'s model keys and the env's spaces."""
    model = config.model
    return SquashedGaussianActor(
        *space_dims(observation_space, action_space),
        model.hidden_sizes,
        model.activation,
        action_space.low,
        action_space.high,
        matmul_dtype(config),
    )


def build_twin_q(config: Config, observation_space: gym.Space, action_space: gym.Space) -> TwinQ:
    """The twin critics for `config`'s model keys and the env's spaces."""
    return TwinQ(
        *space_dims(observation_space, action_space),
        config.model.hidden_sizes,
        config.model.activation,
        matmul_dtype(config),
    )

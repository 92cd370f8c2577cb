"""Action distributions as plain tensor functions.

`torch.distributions` validates its arguments and builds objects on every call (~17 µs each on
this class of machine, more than a small MLP's forward); these functions do the same maths without
either. Each family maps the network's action parameters to sample / log-prob / entropy / mode.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn.functional as F

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Categorical:
    """Discrete actions; the parameters are unnormalised logits (B, n). `log_prob` and
    `entropy` take normalised log-probabilities, so one log-softmax serves both."""

    @staticmethod
    def normalize(logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits, dim=-1)

    @staticmethod
    def sample(log_p: torch.Tensor) -> torch.Tensor:
        # Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) is an exact sample of p
        # (the Gumbel-max trick in two operations instead of five).
        return torch.argmax(log_p.exp() / torch.empty_like(log_p).exponential_(), dim=-1)

    @staticmethod
    def log_prob(log_p: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def entropy(log_p: torch.Tensor) -> torch.Tensor:
        return -(log_p.exp() * log_p).sum(-1)

    @staticmethod
    def mode(log_p: torch.Tensor) -> torch.Tensor:
        return torch.argmax(log_p, dim=-1)


class DiagonalGaussian:
    """Box actions; the parameters are means (B, d), the log std is a separate (d,) tensor."""

    @staticmethod
    def sample(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        return mean + log_std.exp() * torch.randn_like(mean)

    @staticmethod
    def log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - LOG_SQRT_2PI).sum(-1)

    @staticmethod
    def entropy(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1).expand(mean.shape[0])

    @staticmethod
    def mode(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        return mean


def num_action_params(action_space: gym.Space) -> int:
    """How many numbers per sample the network must output for this action space."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return int(action_space.shape[0])
    raise TypeError(f"unsupported action space {action_space}: fleetrl supports Discrete and 1-D Box")

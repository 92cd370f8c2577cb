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

from fleetrl.errors import ConfigError

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
        return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1).expand(mean.shape[:-1])

    @staticmethod
    def mode(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        return mean


class ActionTokens(torch.nn.Module):
    """A 1-D Box action as K tokens (one per dimension, K = action dim, a chunk's actions included),
    each a categorical over `bins` evenly spaced values: token k of dimension i is the action
    value low_i + k·(high_i − low_i)/(bins − 1), so both bounds are reachable. The network emits
    K·bins logits per sample; rollouts and trajectories keep the continuous *values* (what the env
    receives) and `encode` recovers the tokens exactly (nearest value). The bounds are buffers,
    not parameters, and not saved (they come from the action space)."""

    def __init__(self, action_space: gym.Space, bins: int):
        super().__init__()
        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ConfigError(
                "model.action_bins",
                bins,
                "null unless the action space is a 1-D Box",
                f"the action space is {action_space}",
            )
        low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.low, action_space.high))
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ConfigError(
                "model.action_bins",
                bins,
                "null for an action space with infinite bounds",
                f"tokens need finite bounds to discretise; the action space is {action_space}",
            )
        self.bins, self.count = int(bins), int(low.numel())
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("step", (high - low) / (bins - 1), persistent=False)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Continuous actions (B, K) → tokens (B, K) int64: the nearest bin value."""
        tokens = torch.round((actions - self.low) / self.step)
        return tokens.clamp_(0, self.bins - 1).long()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (B, K) → the action values (B, K) float32."""
        return self.low + tokens.to(self.low.dtype) * self.step

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Network output (B, K·bins) → normalised per-token log-probabilities (B, K, bins)."""
        return Categorical.normalize(logits.unflatten(-1, (self.count, self.bins)))

    def expected(self, log_p: torch.Tensor) -> torch.Tensor:
        """Per-token log-probabilities (B, K, bins) → each dimension's bin values weighted by their
        probabilities (B, K): the mean action, which may lie between two bins."""
        bins = torch.arange(self.bins, dtype=log_p.dtype, device=log_p.device)
        return self.low + (log_p.exp() * bins).sum(-1) * self.step


def categorical_kl(old_log_p: torch.Tensor, new_log_p: torch.Tensor) -> torch.Tensor:
    """KL(old ‖ new) over the last axis from normalised log-probabilities."""
    return (old_log_p.exp() * (old_log_p - new_log_p)).sum(-1)


def gaussian_kl(
    old_mean: torch.Tensor, old_log_std: torch.Tensor, new_mean: torch.Tensor, new_log_std: torch.Tensor
) -> torch.Tensor:
    """KL(old ‖ new) of diagonal Gaussians, summed over the action dimensions."""
    variance_ratio = torch.exp(2 * (old_log_std - new_log_std))
    mean_term = (old_mean - new_mean).pow(2) * torch.exp(-2 * new_log_std)
    return (new_log_std - old_log_std + 0.5 * (variance_ratio + mean_term - 1)).sum(-1)


def num_action_params(action_space: gym.Space) -> int:
    """How many numbers per sample the network must output for this action space."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return int(action_space.shape[0])
    raise TypeError(f"unsupported action space {action_space}: fleetrl supports Discrete and 1-D Box")

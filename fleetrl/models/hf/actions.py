"""Actions as vocabulary ids, as OpenVLA emits them.

A continuous action dimension is normalised to [-1, 1] — from the action space's bounds, or from
statistics given in the config (`model.action_stats`: OpenVLA's q01/q99 per dimension, values
outside clipped) — and binned on the edges `linspace(-1, 1, bins)`: the `bins - 1` bin midpoints
are the values a token stands for. The action tokens are the last `bins` ids of the vocabulary
that no special token and no marker of the prompt holds (`action_token_ids`): bin i is the i-th
of them from the end, the last the lowest bin (OpenVLA's `ActionTokenizer`, whose id
`vocab_size - bins` is never decoded: it is never sampled here). A vocabulary that ends in
ordinary tokens — OpenVLA's Llama, fleetrl's init-model folders — has them exactly at
`V - 1 - i`; SmolVLM's ends in its image markers and end-of-utterance token, Qwen's in its chat
and vision markers, which the actions skip.

A Discrete(n) action (MiniGrid) is bin i for action i: the same tokens, the first n of them.

Sampling is masked to these ids: the policy reads the model's logits at exactly those ids, so
each action token is a categorical over `choices` values. With `model.action_chunk` K a sample
holds K actions of D tokens each, K·D tokens in all (`count`), in the order action 0's dimensions
first. Rollouts keep the env's action values; `encode` recovers the bins exactly (a bin's value
lies inside its bin).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from fleetrl.errors import ConfigError


class VocabActions(torch.nn.Module):
    """The map between env actions and action-token bins (module docstring). No parameters;
    every tensor is a non-persistent buffer, rebuilt from the config."""

    def __init__(
        self, action_space: gym.Space, bins: int, token_ids: list[int], chunk: int = 1, stats: dict | None = None
    ):
        super().__init__()
        self.chunk = int(chunk)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            self.dim, self.choices = 1, int(action_space.n)
            if self.choices > bins - 1:
                raise ConfigError(
                    "model.action_bins", bins, f"more than {self.choices} (the env's discrete actions, one bin each)"
                )
            low = high = torch.zeros(1)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.dim, self.choices = int(action_space.shape[0]), bins - 1
            low, high = action_bounds(action_space, stats)
        else:
            raise ConfigError("model.id", "hf", "an env with a Discrete or 1-D Box action space", str(action_space))
        self.count = self.chunk * self.dim
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("high", high, persistent=False)
        self.register_buffer("edges", torch.linspace(-1.0, 1.0, bins), persistent=False)
        centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.register_buffer("centers", centers, persistent=False)
        self.register_buffer("ids", torch.tensor(token_ids[: self.choices], dtype=torch.long), persistent=False)

    @staticmethod
    def placeholder_ids(bins: int) -> list[int]:
        """Ids for checking an action space against the bins before any vocabulary is known."""
        return list(range(bins - 1, -1, -1))

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions — (B,), (B, D), (B, K) or (B, K, D) — → bins (B, K·D) int64."""
        flat = actions.reshape(actions.shape[0], -1)
        if self.discrete:
            return flat.long()
        normalised = 2 * (flat.float().unflatten(1, (self.chunk, self.dim)) - self.low) / (self.high - self.low) - 1
        bucket = torch.bucketize(normalised.clamp(-1, 1).flatten(1).contiguous(), self.edges, right=True)
        return (bucket.clamp(1, self.choices) - 1).long()  # OpenVLA's digitize, then its clip

    def decode(self, bins: torch.Tensor) -> torch.Tensor:
        """Bins (B, K·D) → env actions: (B,) or (B, D) with one action per sample, (B, K) or
        (B, K, D) with a chunk of K."""
        batch = bins.shape[0]
        if self.discrete:
            return bins.reshape(batch) if self.chunk == 1 else bins.reshape(batch, self.chunk)
        normalised = self.centers[bins].unflatten(1, (self.chunk, self.dim))
        actions = (normalised + 1) / 2 * (self.high - self.low) + self.low
        return actions.reshape(batch, self.dim) if self.chunk == 1 else actions

    def token_ids(self, bins: torch.Tensor) -> torch.Tensor:
        """Bins → their vocabulary ids."""
        return self.ids[bins]

    def logits(self, vocabulary_logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (..., V) → the action tokens' (..., choices), in float32."""
        return vocabulary_logits[..., self.ids].float()


def action_bounds(space: gym.spaces.Box, stats: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension (low, high) of a 1-D Box that map to [-1, 1]: the statistics' q01/q99 (model.action_stats),
    else the bounds. Every hf action head normalises this way."""
    if stats:
        missing = {"q01", "q99"} - set(stats)
        low, high = (np.asarray(stats.get(key, []), np.float32) for key in ("q01", "q99"))
        if missing or low.shape != space.shape or high.shape != space.shape or not (high > low).all():
            raise ConfigError(
                "model.action_stats",
                stats,
                f"{{q01: [...], q99: [...]}}, {space.shape[0]} numbers each, q99 > q01 (OpenVLA's statistics)",
            )
    else:
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ConfigError(
                "model.action_stats",
                None,
                "q01/q99 statistics for an action space with infinite bounds",
                str(space),
            )
    return torch.as_tensor(low), torch.as_tensor(high)


def action_token_ids(vocab_size: int, bins: int, reserved: set[int]) -> list[int]:
    """The action tokens' ids, bin 0 first: the last `bins` ids below `vocab_size` not in
    `reserved` (module docstring); exit 2 when the vocabulary has too few."""
    ids = [token for token in range(vocab_size - 1, -1, -1) if token not in reserved][:bins]
    if len(ids) < bins:
        raise ConfigError("model.action_bins", bins, f"at most the vocabulary's {len(ids)} ordinary tokens")
    return ids

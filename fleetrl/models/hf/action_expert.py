"""The flow-matching action expert: a small transformer that predicts the velocity of a noisy action
chunk, reading the VLM's prefix (image and instruction) through cross-attention, as SmolVLA's
expert does.

Why cross-attention to the prefix's hidden states rather than π0's mixture of transformers (the
expert's layers attending to the VLM's own keys and values, layer by layer): the expert then
depends on nothing of a family's internals — not its number of layers, head sizes, grouped-query
layout, rotary positions or KV-cache class — so one expert serves PaliGemma, SmolVLM and Qwen2-VL
alike; the VLM runs once per chunk (its last hidden states are the prefix every denoising step
reads); the expert is a module of its own that FSDP2 shards as one unit; and an export is the
VLM's standard folder plus the expert's safetensors, loadable without fleetrl's patching of any
transformers class. What it gives up is π0's per-layer access to the VLM's intermediate
representations: each expert layer reads the VLM's final ones (projected per layer).

Its sequence is [state token?, K action tokens]: the proprioception (`model.state_key`, when the
env gives it) as one token (π0's state token), and each action of the chunk as one token made
of its noisy values and the time (π0's action-time MLP: [W_a·x, sinusoid(t)] → swish → width),
plus a learned position per token. Each layer: self-attention over the sequence (every token sees
every other, as π0's action tokens do), cross-attention to the prefix (its padding masked), an
MLP — each pre-norm and residual. The action tokens' outputs are projected to the velocity,
(B, K, D). Sizes (`model.flow.width`, `layers`, `heads`) come from the config.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # π0's sinusoidal time embedding: periods from 4 ms to 4 s of "time"


def time_embedding(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B,) times in [0, 1] → (B, width) sines and cosines of geometrically spaced periods."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    angle = t.double().unsqueeze(-1) * (2 * math.pi / period)
    return torch.cat([torch.sin(angle), torch.cos(angle)], -1).to(t.dtype)


class Attention(nn.Module):
    """Multi-head attention of `queries` over `keys` (their own width `source`), with a key mask."""

    def __init__(self, width: int, heads: int, source: int | None = None):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key_value = nn.Linear(source or width, 2 * width)
        self.out = nn.Linear(width, width)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None = None, repeats: int = 1
    ) -> torch.Tensor:
        """`repeats`: each row of `keys` (and `key_mask`) serves that many consecutive query rows,
        projected once."""
        batch, length, width = queries.shape
        q = self.query(queries).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        projected = self.key_value(keys)
        if repeats > 1:
            projected = projected.repeat_interleave(repeats, 0)
            key_mask = None if key_mask is None else key_mask.repeat_interleave(repeats, 0)
        k, v = projected.unflatten(-1, (2, self.heads, -1)).permute(2, 0, 3, 1, 4)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(attended.transpose(1, 2).reshape(batch, length, width))


class ExpertLayer(nn.Module):
    def __init__(self, width: int, heads: int, prefix_width: int):
        super().__init__()
        self.self_norm, self.cross_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.self_attention = Attention(width, heads)
        self.cross_attention = Attention(width, heads, prefix_width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, prefix: torch.Tensor, prefix_mask: torch.Tensor, repeats: int) -> torch.Tensor:
        normed = self.self_norm(x)
        x = x + self.self_attention(normed, normed)
        x = x + self.cross_attention(self.cross_norm(x), prefix, prefix_mask, repeats)
        return x + self.mlp(self.mlp_norm(x))


class ActionExpert(nn.Module):
    """v_θ(x_t, t | prefix, state): (B, K, D) noisy actions, (B,) times, (B, L, H) prefix hidden
    states with their (B, L) mask, (B, S) state or None → (B, K, D) velocity (module docstring).
    With `repeats` R, x and t hold R consecutive rows per sample of the prefix and state (the
    loss path's S steps of one chain): the prefix's keys and values are projected once a sample."""

    def __init__(
        self,
        action_dim: int,
        chunk: int,
        prefix_width: int,
        state_dim: int | None,
        width: int = 256,
        layers: int = 4,
        heads: int = 4,
    ):
        super().__init__()
        if width % heads or width % 2:
            raise ValueError(f"the expert's width {width} must be even and a multiple of its {heads} heads")
        self.width = width
        self.action_in = nn.Linear(action_dim, width)
        self.action_time = nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, width))
        self.state_in = nn.Linear(state_dim, width) if state_dim else None
        self.positions = nn.Parameter(torch.zeros(chunk + (1 if state_dim else 0), width))
        nn.init.normal_(self.positions, std=0.02)
        self.layers = nn.ModuleList(ExpertLayer(width, heads, prefix_width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.velocity = nn.Linear(width, action_dim)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        prefix: torch.Tensor,
        prefix_mask: torch.Tensor,
        state: torch.Tensor | None = None,
        repeats: int = 1,
    ) -> torch.Tensor:
        dtype = self.action_in.weight.dtype
        times = time_embedding(t.to(dtype), self.width).unsqueeze(1).expand(-1, x.shape[1], -1)
        tokens = self.action_time(torch.cat([self.action_in(x.to(dtype)), times], -1))
        if self.state_in is not None:
            token = self.state_in(state.to(dtype))
            tokens = torch.cat([token.repeat_interleave(repeats, 0).unsqueeze(1), tokens], 1)
        tokens = tokens + self.positions
        prefix, mask = prefix.to(dtype), prefix_mask.bool()
        for layer in self.layers:
            tokens = layer(tokens, prefix, mask, repeats)
        actions = tokens[:, -x.shape[1] :]
        return self.velocity(self.norm(actions)).float()

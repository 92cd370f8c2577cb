"""OpenVLA-OFT's L1 regression head, and its Gaussian for RL.

The VLM reads the prompt followed by K·D action positions (placeholders with a zero embedding, as
the tokens head's parallel decoding; `model.action_attention` applies), and the head regresses
the chunk from their last hidden states: action j's D positions, concatenated (D·H), through an
MLP (D·H → width → width → D, GELU) to its D normalised values. Supervised, the loss is the L1
distance to the demonstrated chunk (OFT's). For RL the action is Gaussian around the regressed
mean with a learned, state-independent log-std per dimension (one for every action of the chunk):
a sample's log-probability is the diagonal Gaussian's, per chunk action (summed over D), and its
entropy the Gaussian's, which `algorithm.ent_coef` can reward.
"""

from __future__ import annotations

import torch
from torch import nn


class L1Head(nn.Module):
    """(B, K·D, H) action positions' hidden states → ((B, K, D) the chunk's normalised means, the RL
    Gaussian's log-std (D,) broadcast to them): the log-std is read inside the forward, where FSDP2
    has the head's parameters gathered (module docstring)."""

    def __init__(self, hidden_size: int, action_dim: int, chunk: int, width: int, init_log_std: float):
        super().__init__()
        self.chunk, self.action_dim = chunk, action_dim
        self.mlp = nn.Sequential(
            nn.Linear(action_dim * hidden_size, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, action_dim),
        )
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per_action = hidden.reshape(hidden.shape[0], self.chunk, -1)
        mean = self.mlp(per_action.to(self.mlp[0].weight.dtype)).float()
        # a copy, not a view: FSDP2 frees the gathered parameter when the forward ends
        return mean, self.log_std.float().expand_as(mean).contiguous()


def l1_error(mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """(B, K, D) means and demonstrated normalised actions → (B, K): the L1 distance per chunk
    action, averaged over its dimensions."""
    return (mean - actions).abs().mean(-1)

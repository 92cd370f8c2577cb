"""`model.id: transformer` — a small vision-language-action transformer.

One sequence per sample, read by a stack of pre-norm transformer blocks (`blocks`, named by
`wrap_units()` so that each block is wrapped on its own: its own FSDP unit, all-gathered only
while it runs, and with `actor.gradient_checkpointing` recomputed on its own in backward):

    [image patches] [instruction tokens] [other keys, one token each] [action queries] [value query]

- an image (uint8, HWC or CHW) is cut into `model.patch_size` patches, each projected to
  `model.embed_dim` (a strided convolution, as in ViT); a 7×7 MiniGrid view with patch 1 gives
  one token per cell;
- token ids (a mission, `envs.text`) are embedded; padding is masked out of attention;
- any other key (a one-hot direction, a state vector) is projected to one token;
- the action queries are learned embeddings, one per action token: K for a token policy
  (`model.action_bins`: K action dimensions, each a categorical over the bins), one for a
  Discrete action or a Gaussian's means. Each query's output is projected to its logits (or
  means); the value query's output to the value.

Every input token gets a learned position embedding. The network follows fleetrl's model
interface — obs → (action parameters (B, queries·outputs), value (B,)) — so `Policy` turns the
logits into token log-probs and entropies exactly as for any other network.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.errors import ConfigError
from fleetrl.models.encoders import channels_first, pixel_scale
from fleetrl.observations import image_layout, is_image, is_tokens, leaf_spaces


class ImagePatches(nn.Module):
    """uint8 images → (B, patches, dim)."""

    def __init__(self, space: gym.spaces.Box, dim: int, patch_size: int | None):
        super().__init__()
        channels, height, width, self.channels_last = image_layout(space)
        patch = patch_size or max(1, min(height, width) // 7)  # about 7×7 patches by default
        if patch > min(height, width):
            raise ConfigError(
                "model.patch_size",
                patch_size,
                f"at most the image's side ({min(height, width)})",
                f"shape {space.shape}",
            )
        self.scale = pixel_scale(space)
        self.project = nn.Conv2d(channels, dim, patch, stride=patch)
        self.count = (height // patch) * (width // patch)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, None]:
        pixels = channels_first(images, self.channels_last, self.scale)
        x = self.project(pixels.to(self.project.weight.dtype))  # bfloat16 under FSDP mixed precision
        return x.flatten(2).transpose(1, 2), None


class InstructionTokens(nn.Module):
    """Token ids (B, L), 0-padded → (B, L, dim) and the padding mask (True: ignore)."""

    def __init__(self, space: gym.spaces.Box, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(int(space.high.max()) + 1, dim, padding_idx=0)
        self.count = int(space.shape[0])

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embedding(tokens.long()), tokens == 0


class VectorToken(nn.Module):
    """Any other leaf → one token."""

    def __init__(self, space: gym.spaces.Box, dim: int):
        super().__init__()
        self.project = nn.Linear(int(np.prod(space.shape)), dim)
        self.count = 1

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.project(x.flatten(1).to(self.project.weight.dtype)).unsqueeze(1), None


def tokenizer(space: gym.Space, dim: int, patch_size: int | None) -> nn.Module:
    if is_image(space):
        return ImagePatches(space, dim, patch_size)
    if is_tokens(space):
        return InstructionTokens(space, dim)
    return VectorToken(space, dim)


class TransformerPolicy(nn.Module):
    """See the module docstring. `queries` action queries, each projected to `outputs` numbers."""

    def __init__(
        self,
        observation_space: gym.Space,
        queries: int,
        outputs: int,
        embed_dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        patch_size: int | None = None,
    ):
        super().__init__()
        if embed_dim % num_heads:
            raise ConfigError(
                "model.num_heads", num_heads, f"a divisor of model.embed_dim ({embed_dim})", "each head reads a slice"
            )
        leaves = leaf_spaces(observation_space)
        self.keyed = isinstance(leaves, dict)
        leaves = leaves if self.keyed else {"obs": leaves}
        self.inputs = nn.ModuleDict(
            {key: tokenizer(leaf, embed_dim, patch_size) for key, leaf in sorted(leaves.items())}
        )
        self.queries = queries
        length = sum(part.count for part in self.inputs.values()) + queries + 1
        self.query_embedding = nn.Parameter(torch.randn(queries + 1, embed_dim) * 0.02)
        self.position = nn.Parameter(torch.randn(length, embed_dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                embed_dim, num_heads, 4 * embed_dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.action_head = nn.Linear(embed_dim, outputs)
        self.value_head = nn.Linear(embed_dim, 1)
        nn.init.orthogonal_(self.action_head.weight, 0.01)  # near-uniform initial policy, as the MLP's
        nn.init.zeros_(self.action_head.bias)

    def wrap_units(self) -> list[nn.Module]:
        """The blocks, each sharded (FSDP) and checkpointed on its own (parallel/wrap.py); the
        tokenizers, embeddings, final norm and heads stay with the root unit."""
        return list(self.blocks)

    def forward(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.keyed:
            obs = {"obs": obs}
        tokens, masks = [], []
        for key, part in self.inputs.items():
            embedded, mask = part(obs[key])
            tokens.append(embedded)
            masks.append(mask if mask is not None else embedded.new_zeros(embedded.shape[:2], dtype=torch.bool))
        batch = tokens[0].shape[0]
        tokens.append(self.query_embedding.expand(batch, -1, -1))
        masks.append(torch.zeros(batch, self.queries + 1, dtype=torch.bool, device=tokens[0].device))
        x = torch.cat(tokens, dim=1) + self.position
        padding = torch.cat(masks, dim=1)
        for block in self.blocks:
            x = block(x, src_key_padding_mask=padding)
        x = self.norm(x[:, -(self.queries + 1) :])
        # float32 out whatever the compute dtype: the policy's log-softmax, log-probs and
        # entropies in full precision (under FSDP mixed precision the blocks compute in bfloat16)
        return self.action_head(x[:, :-1]).flatten(1).float(), self.value_head(x[:, -1]).squeeze(-1).float()

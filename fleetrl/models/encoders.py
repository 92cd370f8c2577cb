"""Encoders: an image or a Dict observation → one feature vector per sample.

Chosen from the observation space (`ObservationEncoder`), key by key:

- an image (a uint8 Box of three axes, HWC or CHW) → a CNN: the Nature-DQN CNN (Mnih et al.
  2015: 32·8×8/4, 64·4×4/2, 64·3×3/1, then 512) for camera images of at least 36 pixels a side,
  the small CNN of the MiniGrid baselines (16·2×2, max-pool, 32·2×2, 64·2×2) for symbolic grids
  such as MiniGrid's 7×7 view, flattened below 7 pixels; `model.image_encoder` overrides;
- token ids (a 1-D integer Box: a mission, `envs.text`) → `TextEncoder`: embeddings and a GRU,
  its state after the last real (non-padding) token;
- anything else (a float vector, a one-hot direction) → flattened as it is.

The features of all keys are concatenated in key order. Images arrive as uint8 and become float
here, in the model's first layer (in its parameters' dtype: bfloat16 under FSDP mixed
precision): camera images scaled to [0, 1], grid codes (small integers: object, colour, state)
as they are.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.errors import ConfigError
from fleetrl.observations import image_layout, is_image, is_tokens, leaf_spaces

NATURE_MIN_SIDE = 36  # the Nature CNN's three convolutions need at least this many pixels a side
GRID_MIN_SIDE = 7  # and the grid CNN's


def pixel_scale(space: gym.spaces.Box) -> float:
    """What an image's uint8 values are multiplied by: 1/255 for camera images, 1 for grids."""
    _, height, width, _ = image_layout(space)
    return 1 / 255 if min(height, width) >= NATURE_MIN_SIDE else 1.0


def channels_first(images: torch.Tensor, channels_last: bool, scale: float) -> torch.Tensor:
    """uint8 (B, H, W, C) or (B, C, H, W) → float (B, C, H, W), scaled."""
    x = images.permute(0, 3, 1, 2) if channels_last else images
    return x.float().mul_(scale) if scale != 1.0 else x.float()


class ImageCNN(nn.Module):
    """A CNN over one image key; `kind` is 'nature_cnn' or 'grid_cnn' (module docstring)."""

    def __init__(self, space: gym.spaces.Box, kind: str):
        super().__init__()
        channels, height, width, self.channels_last = image_layout(space)
        self.scale = pixel_scale(space)
        if kind == "nature_cnn":
            self.layers = nn.Sequential(
                nn.Conv2d(channels, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
        else:
            self.layers = nn.Sequential(
                nn.Conv2d(channels, 16, 2),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 2),
                nn.ReLU(),
                nn.Conv2d(32, 64, 2),
                nn.ReLU(),
                nn.Flatten(),
            )
        with torch.no_grad():
            flat = self.layers(torch.zeros(1, channels, height, width)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, 512), nn.ReLU()) if kind == "nature_cnn" else nn.Identity()
        self.out_features = 512 if kind == "nature_cnn" else flat

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = channels_first(images, self.channels_last, self.scale)
        return self.head(self.layers(pixels.to(self.layers[0].weight.dtype)))  # bfloat16 under FSDP mixed precision


class TextEncoder(nn.Module):
    """Token ids (B, L), 0-padded → (B, hidden): a GRU's state after each text's last token."""

    def __init__(self, vocabulary_size: int, embed_dim: int, hidden: int = 128):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary_size, embed_dim, padding_idx=0)
        self.gru = nn.GRU(embed_dim, hidden, batch_first=True)
        self.out_features = hidden

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(self.embedding(tokens.long()))  # (B, L, hidden)
        last = (tokens != 0).sum(1).clamp_(min=1) - 1  # an empty text reads its first step
        return states[torch.arange(len(tokens), device=tokens.device), last]


class Flatten(nn.Module):
    """A key as one float vector; an image's uint8 values scaled as a CNN would (`pixel_scale`)."""

    def __init__(self, space: gym.spaces.Box, scale: float = 1.0):
        super().__init__()
        self.out_features = int(np.prod(space.shape))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1).float()
        return x.mul_(self.scale) if self.scale != 1.0 else x


def image_encoder_kind(space: gym.spaces.Box, choice: str) -> str:
    """`model.image_encoder` resolved for `space` ('auto' by its size), checked to fit."""
    _, height, width, _ = image_layout(space)
    side = min(height, width)
    if choice == "auto":
        return "nature_cnn" if side >= NATURE_MIN_SIDE else "grid_cnn" if side >= GRID_MIN_SIDE else "flatten"
    least = {"nature_cnn": NATURE_MIN_SIDE, "grid_cnn": GRID_MIN_SIDE}.get(choice, 1)
    if side < least:
        fitting = [name for name, needs in (("grid_cnn", GRID_MIN_SIDE), ("flatten", 1)) if side >= needs]
        raise ConfigError(
            "model.image_encoder",
            choice,
            f"one of 'auto', {', '.join(repr(name) for name in fitting)} (the {choice} needs {least}×{least} pixels or more)",
            f"the observation's images are {height}×{width} (shape {space.shape})",
        )
    return choice


def leaf_encoder(space: gym.Space, image_encoder: str, embed_dim: int) -> nn.Module:
    if is_image(space):
        kind = image_encoder_kind(space, image_encoder)
        return Flatten(space, pixel_scale(space)) if kind == "flatten" else ImageCNN(space, kind)
    if is_tokens(space):
        return TextEncoder(int(space.high.max()) + 1, embed_dim)
    return Flatten(space)


class ObservationEncoder(nn.Module):
    """An image or a Dict observation → (B, out_features): each key's encoder, concatenated."""

    def __init__(self, space: gym.Space, image_encoder: str = "auto", embed_dim: int = 64):
        super().__init__()
        leaves = leaf_spaces(space)
        self.keyed = isinstance(leaves, dict)
        leaves = leaves if self.keyed else {"obs": leaves}
        self.encoders = nn.ModuleDict(
            {key: leaf_encoder(leaf, image_encoder, embed_dim) for key, leaf in sorted(leaves.items())}
        )
        self.out_features = sum(encoder.out_features for encoder in self.encoders.values())

    def forward(self, obs) -> torch.Tensor:
        if not self.keyed:
            obs = {"obs": obs}
        return torch.cat([encoder(obs[key]) for key, encoder in self.encoders.items()], dim=-1)

"""Observations as arrays: one array, or a dict of arrays by key (a `Dict` observation space).

Between the env and the model an observation is a NumPy array or a torch tensor of shape
(*leading, *obs_shape) — or, for a `Dict` space, a dict of such arrays, one per key (`image`,
`mission`, ...). Env, rollout, trajectories and the actor move observations only through
`map_obs` and `obs_len`, so a `Box` and a `Dict` take the same path.

Each leaf keeps the dtype of its space (`storage_dtype`): floats become float32, and everything
else stays as it is — images stay uint8 from the simulator to the model's first layer (a float
copy of an image batch is 4× its memory), token ids stay int64. Only the model converts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

Observation = Any  # np.ndarray | torch.Tensor | dict[str, np.ndarray | torch.Tensor]


def map_obs(fn: Callable, obs, *others):
    """`fn` applied leaf by leaf: `fn(obs, *others)` for arrays, per key for dicts (`others`
    are observations of the same structure)."""
    if isinstance(obs, dict):
        return {key: fn(value, *(other[key] for other in others)) for key, value in obs.items()}
    return fn(obs, *others)


def obs_len(obs) -> int:
    """The length of the leading axis (the batch)."""
    if isinstance(obs, dict):
        return len(next(iter(obs.values())))
    return len(obs)


def leaf_spaces(space: gym.Space) -> dict[str, gym.spaces.Box] | gym.spaces.Box:
    """The `Box` leaves of an observation space, by key for a `Dict`."""
    if isinstance(space, gym.spaces.Dict):
        return dict(space.spaces)
    return space


def storage_dtype(space: gym.Space) -> np.dtype:
    """The dtype a leaf of `space` keeps from env to model: float32 for floats, its own otherwise."""
    dtype = np.dtype(space.dtype)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


def zeros(space: gym.Space, leading: tuple) -> Observation:
    """An all-zero observation with the leading axes `leading`, each leaf in its storage dtype."""
    return map_obs(lambda leaf: np.zeros((*leading, *leaf.shape), storage_dtype(leaf)), leaf_spaces(space))


def is_image(space: gym.Space) -> bool:
    """A uint8 Box of three axes: an image, HWC or CHW (see `image_layout`)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def image_layout(space: gym.spaces.Box) -> tuple[int, int, int, bool]:
    """(channels, height, width, channels_last) of an image space. Channels are the smaller end
    axis: (84, 84, 3) and (7, 7, 3) are HWC, (4, 84, 84) and (3, 7, 7) CHW; HWC on a tie."""
    first, second, last = space.shape
    if last <= first:
        return last, first, second, True
    return first, second, last, False


def is_tokens(space: gym.Space) -> bool:
    """A 1-D integer Box inside a Dict: token ids, 0 the padding (`envs.text`)."""
    return isinstance(space, gym.spaces.Box) and space.dtype.kind in "iu" and len(space.shape) == 1


def needs_encoder(space: gym.Space) -> bool:
    """Whether a model needs per-key encoders for `space` (a Dict or an image), rather than one
    flat float vector."""
    return isinstance(space, gym.spaces.Dict) or is_image(space)


def stack_obs(observations) -> Observation:
    """Single observations (arrays, or dicts of arrays) → one batch, per key for dicts."""
    observations = list(observations)
    if isinstance(observations[0], dict):
        return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}
    return np.stack(observations)

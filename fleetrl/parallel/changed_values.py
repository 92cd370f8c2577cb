"""`runner.weight_sync: changed` — only the values that changed where the rollout holds its copy.

With float32 Adam every trainable value moves every step, so "changed" is judged at the
rollout's precision (`rollout.dtype`): a bfloat16 rollout acts on bfloat16 roundings of its
weights, and only the values whose bfloat16 representation changed since the last sync need to
reach it — as RLinf's patch syncer sends them. The actor keeps, per trainable tensor (and
persistent buffer), what the rollout holds at that precision (`Changes.held`); a sync compares the
current values bit for bit with it (so a NaN or a -0.0 counts as what it is) and sends, per tensor:

- nothing, when no value changed;
- `sparse`: the changed positions as int32 gaps between them (delta-encoded: small numbers where
  changes cluster) and the new values at the rollout's precision — when that is smaller than
- `dense`: the whole tensor at the rollout's precision.

With `runner.weight_sync_compress` each array travels zlib-compressed (level 1). The rollout
writes the values into its own copy (`apply_changes`); in float32 that copy then differs from the
actor's only below bfloat16's resolution, so under autocast both act on the same bfloat16 values.

The first sync is the full weights, and every rollout's copy is then the actor's; the patches
after it are judged against what those weights were at the rollout's precision.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
from torch import nn

INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers of its width: equal exactly when the values are identical."""
    return tensor.view(INTS[tensor.element_size()]) if tensor.is_floating_point() else tensor


def pack(array: np.ndarray, compress: bool) -> tuple:
    """(dtype name, shape, bytes), the bytes zlib-compressed when asked."""
    raw = array.tobytes()
    return (str(array.dtype), array.shape, zlib.compress(raw, 1) if compress else raw, compress)


def unpack(packed: tuple) -> np.ndarray:
    dtype, shape, raw, compressed = packed
    return np.frombuffer(zlib.decompress(raw) if compressed else raw, dtype=dtype).reshape(shape)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """bfloat16 has no numpy dtype: its bits travel as int16."""
    return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array.copy())
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


class Changes:
    """The actor's side: what the rollout holds, and the patches that bring it up to date."""

    def __init__(self, precision: torch.dtype, compress: bool = False):
        self.precision, self.compress = precision, compress
        self.held: dict[str, torch.Tensor] = {}

    def at_precision(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.precision) if tensor.is_floating_point() else tensor

    def record(self, state: dict[str, torch.Tensor]) -> None:
        """The rollout was just sent these values in full."""
        self.held = {name: self.at_precision(tensor).clone() for name, tensor in state.items()}

    def patch(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """{name: ("dense", packed) | ("sparse", packed gaps, packed values)} for every tensor of
        `state` with a changed value; `held` is updated to what the rollout will hold."""
        patch = {}
        for name, tensor in state.items():
            now = self.at_precision(tensor).reshape(-1)
            held = self.held.get(name)
            if held is None or held.numel() != now.numel():
                self.held[name] = now.clone().reshape(tensor.shape)
                patch[name] = ("dense", pack(to_numpy(now), self.compress), str(now.dtype))
                continue
            flat = held.view(-1)
            changed = (bits(now) != bits(flat)).nonzero().squeeze(1)
            if not len(changed):
                continue
            values = now[changed]
            flat[changed] = values
            if len(changed) * (4 + now.element_size()) < now.numel() * now.element_size():
                gaps = torch.diff(changed, prepend=changed.new_zeros(1)).to(torch.int32)
                packed = (pack(gaps.numpy(), self.compress), pack(to_numpy(values), self.compress))
                patch[name] = ("sparse", *packed, str(now.dtype))
            else:
                patch[name] = ("dense", pack(to_numpy(now), self.compress), str(now.dtype))
        return patch


def apply_changes(module: nn.Module, patch: dict[str, Any]) -> None:
    """The rollout's side: write a `Changes.patch` into `module`'s own tensors; a name the module
    does not have is an error (a patch from another model must not pass silently)."""
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    unknown = [name for name in patch if name not in tensors]
    if unknown:
        raise KeyError(f"the patch names tensors this policy does not have: {unknown[:5]}")
    with torch.no_grad():
        for name, (kind, *arrays, dtype_name) in patch.items():
            dtype = getattr(torch, dtype_name.removeprefix("torch."))
            target = tensors[name].view(-1)
            if kind == "dense":
                target.copy_(from_numpy(unpack(arrays[0]), dtype).to(target.dtype))
            else:
                positions = torch.from_numpy(unpack(arrays[0]).astype(np.int64)).cumsum(0)
                target[positions] = from_numpy(unpack(arrays[1]), dtype).to(target.dtype)


def patch_bytes(patch: dict[str, Any]) -> int:
    """The bytes a patch's arrays carry (compressed where they were)."""
    return sum(len(packed[2]) for entry in patch.values() for packed in entry[1:-1])

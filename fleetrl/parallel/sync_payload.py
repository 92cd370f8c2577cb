"""A weight sync as one byte buffer and a small header: what the collective transport moves.

With `runner.weight_sync_transport: collective` the bytes of a sync are broadcast from actor rank 0
to the rollout workers over the weight-sync group (parallel/sync_group.py), and its header — per
tensor, where its arrays lie in the buffer — goes to them through Ray, as the argument of their
`receive_weights` call. The buffer is raw array bytes, never a pickle: a receiver cuts it where the
header says and reads each piece with numpy, so nothing that arrives over the group can run code.

Each sync kind keeps the form its Ray path has, so the rollout loads what it would have loaded:
  full       {name: tensor}                                   RolloutWorker.load_weights
  trainable  {name: tensor}                                   RolloutWorker.load_patch
  changed    {"full": {name: tensor}}, then {"patch": patch}  RolloutWorker.load_changed
A tensor travels whole at its dtype (bfloat16 as its int16 bits); a changed patch's entries travel
as `Changes.patch` packed them — the changed positions (int32 gaps) and values, or the whole
tensor, at the rollout's precision, zlib-compressed with `runner.weight_sync_compress`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fleetrl.parallel.changed_values import from_numpy, to_numpy, unpack

SYNC_KINDS = ("full", "trainable", "changed")  # runner.weight_sync
# One array of an entry: (numpy dtype, shape, offset in the buffer, bytes, zlib-compressed)
Placed = tuple[str, tuple, int, int, bool]


@dataclass(frozen=True)
class Header:
    """What a receiver needs to read a sync's buffer: its kind (`SYNC_KINDS`), for `changed` whether
    it holds the full weights or a patch (`wrap`), per tensor its layout ('tensor', or a patch's
    'dense' / 'sparse'), torch dtype and arrays, and the buffer's size."""

    kind: str
    wrap: str | None  # changed: "full" | "patch"; the other kinds: None
    entries: tuple[tuple[str, str, str, tuple[Placed, ...]], ...]
    size: int


def encode(kind: str, payload: dict) -> tuple[Header, np.ndarray]:
    """`payload` (what the actor's `policy_weights`, `trainable_weights` or `changed_weights` gave)
    as a header and one uint8 buffer."""
    if kind not in SYNC_KINDS:
        raise ValueError(f"sync kind {kind!r} is not one of {SYNC_KINDS}")
    wrap = None
    if kind == "changed":
        ((wrap, payload),) = payload.items()
    if wrap == "patch":
        items = payload  # {name: (layout, *packed arrays, torch dtype name)}
    else:
        items = {name: ("tensor", tensor_array(tensor), str(tensor.dtype)) for name, tensor in payload.items()}
    pieces, entries, offset = [], [], 0
    for name, (layout, *arrays, dtype) in items.items():
        placed = []
        for array in arrays:
            raw, numpy_dtype, shape, compressed = as_bytes(array)
            placed.append((numpy_dtype, shape, offset, len(raw), compressed))
            pieces.append((offset, raw))
            offset += len(raw)
        entries.append((name, layout, dtype, tuple(placed)))
    buffer = np.empty(offset, np.uint8)
    for start, raw in pieces:
        buffer[start : start + len(raw)] = raw
    return Header(kind, wrap, tuple(entries), offset), buffer


def tensor_array(tensor: torch.Tensor) -> np.ndarray:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"the collective weight sync carries tensors, not {type(tensor).__name__}")
    return to_numpy(tensor.detach().to("cpu").contiguous())


def as_bytes(array) -> tuple[np.ndarray, str, tuple, bool]:
    """(its bytes as a flat uint8 array, numpy dtype, shape, compressed) of a whole tensor's array
    or of an array `changed_values.pack` packed."""
    if isinstance(array, np.ndarray):
        return array.reshape(-1).view(np.uint8), str(array.dtype), tuple(array.shape), False
    numpy_dtype, shape, raw, compressed = array
    return np.frombuffer(raw, np.uint8), numpy_dtype, tuple(shape), compressed


def decode(header: Header, buffer: np.ndarray) -> dict:
    """The payload `encode` made `buffer` of: what the rollout's loader of `header.kind` takes."""
    if buffer.nbytes != header.size:
        raise ValueError(f"a weight sync of {buffer.nbytes} bytes, where its header says {header.size}")
    items = {}
    for name, layout, dtype, placed in header.entries:
        arrays = [(numpy_dtype, shape, buffer[at : at + length], z) for numpy_dtype, shape, at, length, z in placed]
        items[name] = (layout, *arrays, dtype)
    if header.wrap == "patch":
        return {"patch": items}
    tensors = {name: from_numpy(unpack(packed), torch_dtype(dtype)) for name, (_, packed, dtype) in items.items()}
    return {"full": tensors} if header.wrap == "full" else tensors


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype

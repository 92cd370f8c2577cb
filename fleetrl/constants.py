"""Python numbers in the training hot path as cached 0-dim float32 tensors.

`x * 0.5` with a Python number wraps the number in a float64 0-dim tensor and converts it to x's
dtype on every call: three extra operators (`to`, `empty_strided`, `copy_`), ~3x the cost of
multiplying a 256-float tensor on this CPU, and again in backward. A 0-dim float32 tensor is used
as it is — the same float32 value, so the same result bit for bit — and on any device (0-dim CPU
tensors act as scalars in CUDA operators too).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def constant(value: float) -> torch.Tensor:
    """`value` as a 0-dim float32 CPU tensor, made once per value."""
    return torch.tensor(value, dtype=torch.float32)

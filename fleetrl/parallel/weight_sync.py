"""What the actor sends the rollout workers: the full weights, or only what training changes.

`runner.weight_sync`:
  full       every parameter and buffer (`state.model_state`), each sync
  trainable  the first sync full, every later one a *patch*: the trainable parameters
             (`requires_grad`) and the persistent buffers. With LoRA or any frozen base the
             frozen tensors never change, so the rollout keeps its copy and receives only the
             adapters and heads — RLinf's "patch" syncer (benchmarks/costs/weight_sync.py: the bytes)
Where rollout and actor share a process (the inline backend, `cluster.fuse_collocated`), the
rollout acts with the actor's own module and nothing is sent at all (`Backend.shares_policy`).

Under FSDP gathering is collective: every actor rank calls `trainable_state` together; rank 0
gets the tensors, the others {} — and only the trainable parameters are all-gathered.
"""

from __future__ import annotations

import torch
from torch import nn


def trainable_state(module: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """CPU copies of `module`'s trainable parameters and persistent buffers (FSDP: rank 0 only)."""
    import torch.distributed as dist

    patch = {}
    for name, parameter in module.named_parameters():
        if parameter.requires_grad:
            full = parameter.full_tensor() if sharded and hasattr(parameter, "full_tensor") else parameter
            patch[name] = full.detach().to("cpu", copy=True)
    persistent = module.state_dict(keep_vars=True).keys()
    patch.update(
        {name: buffer.detach().to("cpu", copy=True) for name, buffer in module.named_buffers() if name in persistent}
    )
    if sharded and dist.is_initialized() and dist.get_rank() != 0:
        return {}
    return patch


def load_patch(module: nn.Module, patch: dict[str, torch.Tensor]) -> None:
    """Load a full state dict, or a patch of some of its tensors; a name the module does not
    have is an error (a patch from another model must not pass silently)."""
    result = module.load_state_dict(patch, strict=False)
    if result.unexpected_keys:
        raise KeyError(f"the weights name tensors this policy does not have: {result.unexpected_keys[:5]}")


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    """The tensor bytes a sync of `state` carries."""
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())

"""The collectives on the training path, each called by every rank in the same order.

With one rank (no process group) they do nothing, so the single-process path has no collective.
NCCL reduces CUDA tensors only: `comm_device()` says where small reduction tensors must live.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from fleetrl.probe import flight_recorder


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def comm_device() -> torch.device:
    """Where tensors handed to a collective must be: the current GPU with NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; returns the tensor. The result is bitwise the same on every
    rank (the reduced buffer is shared), so decisions taken from it agree everywhere."""
    if world_size() > 1:
        with flight_recorder.collective("all_reduce", tensor):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_module_(module: nn.Module, src: int = 0) -> None:
    """Overwrite every rank's parameters and buffers with rank `src`'s (plain tensors only)."""
    if world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            with flight_recorder.collective("broadcast", tensor.data):
                dist.broadcast(tensor.data, src)


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """An int64 hash of the exact bits of `tensor`: integer arithmetic, so the same bits give the
    same hash on any hardware and in any summation order, and any bit flip changes it (almost
    surely). Position-weighted, so permuted values differ too."""
    flat = tensor.detach().contiguous().flatten()
    int_type = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    bits = flat.view(int_type).long()
    weights = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device) * 2654435761 + 1
    return (bits * weights).sum()

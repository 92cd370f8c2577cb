"""Full CPU state dicts of the policy and its optimizer, whatever the strategy.

The format is always the single-process one — `policy.state_dict()` keys, and
`optimizer.state_dict()` with integer parameter ids — so a checkpoint written by 1 rank, by DDP
or by FSDP loads into any of them.

Under FSDP every tensor is sharded: *getting* a full state all-gathers the shards and *loading*
one scatters it, so **all ranks must call these functions together**; rank 0 receives the full
state and the other ranks an empty dict. Without FSDP they are local (no collective) and every
rank returns its own, identical, copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def map_tensors(value, function: Callable[[torch.Tensor], torch.Tensor]):
    """`value` with `function` applied to every tensor in its nested dicts/lists/tuples."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, function) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, function) for v in value)
    return value


def _copy(value):
    """A deep copy of the tensors in nested dicts/lists: a gathered "full" tensor can be the
    live shard itself (a mesh dimension of size 1 needs no gathering), which training would then
    change under the caller's feet."""
    return map_tensors(value, lambda tensor: tensor.detach().clone())


def to_cpu(value):
    """`value` with every tensor in its nested dicts/lists moved to the CPU (a copy if it was
    elsewhere, the same tensor if it was there)."""
    return map_tensors(value, lambda tensor: tensor.detach().cpu())


def model_state(module: nn.Module, sharded: bool) -> dict:
    """A detached CPU copy of the full parameters and buffers (FSDP: rank 0 only)."""
    if not sharded:
        return {name: value.detach().to("cpu", copy=True) for name, value in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return _copy(get_model_state_dict(module, options=_options(cpu_offload=True)))


def load_model_state(module: nn.Module, state: dict, sharded: bool) -> None:
    if not sharded:
        module.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, _copy(state), options=_options())  # it may keep or replace what it is given


def _parameter_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Fully qualified parameter names in the optimizer's id order (ids count through the
    param groups in order, as `optimizer.state_dict()` numbers them)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict:
    """The optimizer's full state in `optimizer.state_dict()` format (FSDP: rank 0 only)."""
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = _copy(get_optimizer_state_dict(module, optimizer, options=_options(cpu_offload=True)))
    if not full:
        return {}
    ids = {name: index for index, name in enumerate(_parameter_names(module, optimizer))}
    return {
        "state": {ids[name]: value for name, value in full["state"].items()},
        "param_groups": [
            {**group, "params": [ids[name] for name in group["params"]]} for group in full["param_groups"]
        ],
    }


def load_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict, sharded: bool) -> None:
    """Load a full optimizer state. Optimizers keep the tensors they are given (Adam's `step`
    then counts up in the caller's checkpoint; under FSDP the loader also puts its shards in the
    given dicts): they get a copy, so that `state` stays what was saved."""
    state = _copy(state)
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _parameter_names(module, optimizer)
    by_name = {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]} for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(module, optimizer, by_name, options=_options())
    for group, saved in zip(optimizer.param_groups, state["param_groups"]):
        # the loader turns tuples (Adam's betas) into lists; keep the saved types
        group.update({k: v for k, v in saved.items() if k != "params" and isinstance(v, tuple)})

"""Sharded checkpoints of a policy and its optimizer through torch.distributed.checkpoint (DCP).

`actor.checkpoint_format: sharded`: every actor rank writes only its own shards (FSDP) into one
folder — no rank gathers the whole model, which a multi-billion-parameter VLA would not fit —
and reading resharded them to whatever ranks load it: 2 ranks' checkpoint resumes in 1 rank or
in 4, 1 rank's in 2. The state is keyed by parameter names (`get_state_dict` /
`set_state_dict`, optimizer state included), so any layout (FSDP, DDP, one plain module) reads
any other's.

`save` and `load` are collective over the actor ranks' group when there is one: every rank calls
them together with the same folder (on a filesystem every rank sees). Without a process group
they run in this process alone. The folder's integrity (a sha256 per file) is the checkpoint
module's business (`fleetrl.checkpoint`).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


@contextlib.contextmanager
def alone():
    """DCP warns when it runs without a process group; in one process that is the intent."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Write this rank's shards of `module` (and `optimizer`) into `folder`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(module, [] if optimizer is None else optimizer)
    state = {"model": model} if optimizer is None else {"model": model, "optimizer": optim}
    with alone():
        dcp.save(state, checkpoint_id=str(folder))


def load(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Read `folder` into `module` (and `optimizer`), each rank the pieces its shards need."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optim = get_state_dict(module, [] if optimizer is None else optimizer)
    with alone():
        dcp.load({"model": model}, checkpoint_id=str(folder))  # every tensor of the model must be there
        if optimizer is not None:
            # A parameter that never had a gradient (a model's unused head) has no optimizer state
            # in the checkpoint, but get_state_dict initialises one for every parameter: those
            # keep their fresh state.
            partial = DefaultLoadPlanner(allow_partial_load=True)
            dcp.load({"optimizer": optim}, checkpoint_id=str(folder), planner=partial)
    set_state_dict(module, [] if optimizer is None else optimizer, model_state_dict=model, optim_state_dict=optim)


def load_model_weights(folder: Path, module: nn.Module) -> dict:
    """A plain (unsharded) `module`'s state_dict read from a sharded checkpoint, in this process
    alone: what `fleetrl eval` and an exporter need."""
    load(folder, module, None)
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def model_tensors(folder: Path, suffix: str) -> dict[str, torch.Tensor]:
    """The model tensors of a sharded checkpoint whose names end in `suffix`, read whole in this
    process alone without building the model (a LoRA checkpoint's base fingerprint, checked
    before any worker starts)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    stored = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    wanted = {
        name.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for name, meta in stored.items()
        if name.startswith("model.") and name.endswith(suffix) and hasattr(meta, "size")
    }
    if wanted:
        with alone():
            dcp.load({"model": wanted}, checkpoint_id=str(folder), planner=DefaultLoadPlanner(allow_partial_load=True))
    return wanted

"""The loss path: what an algorithm's loss calls, wrapped for data parallelism.

Only `Policy.forward(obs, actions)` — the loss path — goes through DDP or FSDP; rollout inference
(`Policy.act`) never does. `wrap_policy` returns a `LossPath`: the module to call for the loss,
plus how to turn gradient synchronisation off for accumulation micro-batches, how to
backpropagate (checked across ranks under DDP) and how to clip the global gradient norm.

- `ddp`: `DistributedDataParallel` around the Policy. Its constructor broadcasts rank 0's
  parameters; buffers are *not* re-broadcast every forward (`forward_sync_buffers=False`):
  non-parameter state is never a DDP-synchronised buffer.
- `fsdp`: FSDP2 (`fully_shard`), applied to each parameter-holding block of the network and then
  to the Policy, in place. Sharding strategies map onto FSDP2 as
    full_shard     1-D mesh, parameters resharded after forward (ZeRO-3)
    shard_grad_op  1-D mesh, parameters kept unsharded between forward and backward (ZeRO-2)
    no_shard       2-D mesh (W replicas × 1 shard): every rank a full replica, gradients all-reduced
    hybrid_shard   2-D mesh (W/S replicas × S shards): sharded within groups of S ranks (by default
                   the ranks of one node), replicated across them
  plus mixed precision (`param_dtype` for compute, `reduce_dtype` for gradient reduction; outputs
  are cast back to float32 so the loss is computed in full precision) and CPU offload.
- `local`: one rank, nothing wrapped, no collective.

Gradient checkpointing (any strategy) recomputes the network's activations during backward —
block by block where the network names its blocks (`wrap_units()`, the transformer's): the same
units FSDP shards, so a block is all-gathered, recomputed and differentiated in one go.

A Hugging Face model anywhere inside the network names its repeated blocks itself: its
`_no_split_modules` (class names: decoder layers, vision encoder layers, the projector). As
accelerate does, every module of those classes is a unit — the outermost ones where they nest —
for FSDP and for gradient checkpointing alike (one decoder layer recomputed at a time).
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from fleetrl.config.schema import ActorConfig
from fleetrl.errors import ConfigError
from fleetrl.parallel.grad_check import check_all_ranks_reach_every_parameter
from fleetrl.parallel.recorded import recorded_allreduce_hook

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LossPath:
    module: nn.Module  # call this for the loss: DDP(policy), the sharded policy, or the policy
    policy: nn.Module  # the Policy itself (sharded in place under FSDP)
    strategy: str  # local | ddp | fsdp
    no_sync: Callable[[], AbstractContextManager]  # gradient sync off inside (accumulation micro-batches)
    ignored: frozenset = frozenset()
    """Policy parameter names this path leaves out on purpose (a head only another phase trains)."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def sync(self, on: bool) -> AbstractContextManager:
        """Gradient synchronisation on (a minibatch's last piece) or off (the pieces before it,
        which only accumulate): DDP and FSDP then reduce once per optimizer step."""
        return contextlib.nullcontext() if on else self.no_sync()

    def backward(self, loss: torch.Tensor, syncs: bool, loss_name: str, grad_step: int) -> None:
        """`loss.backward()`. Under DDP, before the backward that synchronises, every rank checks
        that its loss reaches every parameter (`check_all_ranks_reach_every_parameter`, a
        collective): otherwise the ranks would reduce different gradients. `grad_step`: this
        optimizer step's number in the update, for the error."""
        if syncs and self.strategy == "ddp":
            check_all_ranks_reach_every_parameter(loss, self.policy, self.ignored, loss_name, grad_step)
        loss.backward()

    def clip_grad_norm_(self, max_norm: float, norms: tuple | None = None) -> torch.Tensor:
        """Clip to the global gradient norm (after reduction: the norm of the full gradient);
        `norms`: (the gradients, each one's norm stacked) where already computed (the non-finite
        checks' `UpdateChecks.gradients`), on one device."""
        params = self.parameters()
        if self.strategy != "fsdp":
            return clip_grad_norm_(params, max_norm, norms)
        from torch.distributed.tensor import DTensor

        # Sharded gradients: each rank's norm covers its shard; the DTensor norm is a pending
        # sum over ranks that full_tensor() completes (one all-reduce), same on every rank.
        grads = [p.grad for p in params if p.grad is not None]
        total = nn.utils.get_total_norm(grads, foreach=True)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
        return total


def local_loss_path(policy: nn.Module) -> LossPath:
    return LossPath(policy, policy, "local", contextlib.nullcontext)


def checkpoint_units(network: nn.Module) -> list[nn.Module]:
    """What gradient checkpointing recomputes, each on its own: the network's `wrap_units()` if
    it names them (a transformer's blocks: only each block's input is kept for backward, and one
    block's activations are recomputed at a time), a Hugging Face model's `_no_split_modules`,
    else the whole network (only its input kept)."""
    if hasattr(network, "wrap_units"):
        return declared_units(network)
    return no_split_units(network) or [network]


def no_split_units(network: nn.Module) -> list[nn.Module]:
    """The modules whose class a Hugging Face model inside `network` names in its
    `_no_split_modules` (gathered over every such model, as accelerate's auto wrap does), the
    outermost only where they nest; [] when there is none."""
    names: set[str] = set()
    for module in network.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    units: list[nn.Module] = []
    taken: list[str] = []
    for name, module in network.named_modules():
        if type(module).__name__ in names and not any(name.startswith(f"{outer}.") for outer in taken):
            units.append(module)
            taken.append(name)
    return units


def enable_gradient_checkpointing(network: nn.Module) -> None:
    """Recompute the activations of each of `network`'s `checkpoint_units` during backward
    instead of keeping them (non-reentrant checkpointing, which composes with DDP and FSDP2: a
    unit that is also an FSDP unit is recomputed after its backward all-gather). Only while
    gradients are on: inference is untouched."""
    from torch.utils.checkpoint import checkpoint

    for unit in checkpoint_units(network):
        original = unit.forward

        def forward(*args, _original=original, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)
            return _original(*args, **kwargs)

        unit.forward = forward


def wrap_policy(policy: nn.Module, config: ActorConfig, device: torch.device) -> LossPath:
    """The loss path for this rank. Call in every rank of the initialised process group, after
    the parameters have been made identical (`reduce.broadcast_module_`). Gradient
    checkpointing is not applied here: see `enable_gradient_checkpointing`."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local_loss_path(policy)
    if config.strategy == "ddp":
        wrapped = ddp(policy, device)
        return LossPath(wrapped, policy, "ddp", wrapped.no_sync)
    if config.strategy == "fsdp":
        shard_with_fsdp2(policy, config, device)
        return LossPath(policy, policy, "fsdp", lambda: fsdp_no_sync(policy))
    raise ConfigError("actor.strategy", config.strategy, "one of ['ddp', 'fsdp']")


def ddp(module: nn.Module, device: torch.device, **options) -> nn.Module:
    """`DistributedDataParallel(module)` as every fleetrl loss path is wrapped: on `device`'s GPU
    (if any), buffers never re-broadcast in forward (non-parameter state is never a
    DDP-synchronised buffer), gradient buckets entered into the flight recorder. `options` go to
    DDP (e.g. `find_unused_parameters`). Collective: every rank wraps the same module together."""
    from torch.nn.parallel import DistributedDataParallel

    wrapped = DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False, **options
    )
    wrapped.register_comm_hook(None, recorded_allreduce_hook)
    return wrapped


@contextlib.contextmanager
def fsdp_no_sync(module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def fsdp_units(policy: nn.Module) -> list[nn.Module]:
    """The blocks to shard separately (each all-gathered only while it runs): what the network
    names in `wrap_units()` if it defines it (a transformer's blocks), else each
    parameter-holding child of the network, Sequentials expanded into their elements — or for a
    network holding a Hugging Face model, its `_no_split_modules` (`no_split_units`). The Policy
    itself becomes the root unit (embeddings, heads, log std, whatever is left)."""
    network = getattr(policy, "network", policy)
    if hasattr(network, "wrap_units"):
        return declared_units(network)
    hugging_face = no_split_units(network)
    if hugging_face:
        return hugging_face
    units = []
    for child in network.children():
        units.extend(callable_units(child.children() if isinstance(child, nn.Sequential) else [child]))
    return units


def declared_units(network: nn.Module) -> list[nn.Module]:
    """The network's `wrap_units()`: a list of modules, a ModuleList or a ModuleDict."""
    declared = network.wrap_units()
    return callable_units([declared] if isinstance(declared, nn.Module) else declared)


def callable_units(modules) -> list[nn.Module]:
    """The parameter-holding modules among `modules` whose forward the network calls: a
    ModuleList or ModuleDict (a custom net's `self.blocks["encoder"]`) has no forward of its
    own, so hooks on it would never run (FSDP would never gather its parameters, checkpointing
    never recompute it): it is replaced by its elements, recursively. A ParameterList or
    ParameterDict is no unit either; its parameters stay with the root unit, which gathers
    them for the whole forward."""
    units = []
    for module in modules:
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            units.extend(callable_units(module.children()))
        elif not isinstance(module, (nn.ParameterList, nn.ParameterDict)) and any(True for _ in module.parameters()):
            units.append(module)
    return units


def node_key() -> str:
    """What tells nodes apart: fleetrl's node rank where the runtime set it, else the host name."""
    return os.environ.get("FLEETRL_NODE_RANK") or socket.gethostname()


def hybrid_shard_size(config: ActorConfig) -> int:
    """Ranks per shard group: `fsdp_hybrid_shard_size`, or the actor ranks of one node (which
    must be consecutive ranks, the same number on every node). A collective: all ranks call it."""
    world = dist.get_world_size()
    if config.fsdp_hybrid_shard_size is not None:
        size = config.fsdp_hybrid_shard_size
    else:
        keys: list = [None] * world
        dist.all_gather_object(keys, node_key())
        size = keys.count(keys[0])
        blocks = [keys[i : i + size] for i in range(0, world, size)]
        if (
            world % size
            or any(len(set(block)) != 1 for block in blocks)
            or len({block[0] for block in blocks}) != len(blocks)
        ):
            raise ConfigError(
                "actor.fsdp_hybrid_shard_size",
                None,
                "an explicit shard group size: the actor ranks are not spread as equal, "
                f"consecutive blocks per node (rank → node: {keys})",
            )
    if size < 1 or world % size:
        raise ConfigError("actor.fsdp_hybrid_shard_size", size, f"a divisor of the actor world size {world}")
    return size


def device_mesh(config: ActorConfig, device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    strategy = config.fsdp_sharding_strategy
    if strategy in ("full_shard", "shard_grad_op"):
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    shard = 1 if strategy == "no_shard" else hybrid_shard_size(config)
    return init_device_mesh(device.type, (world // shard, shard), mesh_dim_names=("replicate", "shard"))


def shard_with_fsdp2(policy: nn.Module, config: ActorConfig, device: torch.device) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    from fleetrl.parallel.recorded_fsdp import record_fsdp_collectives

    # Policy.forward returns views (value.squeeze, the Gaussian entropy's expand); FSDP2 warns on
    # every such output that an in-place op on it would skip its hook. The losses never
    # modify the outputs in place, so the warning says nothing here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

    param_dtype = DTYPES[config.fsdp_param_dtype] if config.fsdp_param_dtype else None
    reduce_dtype = DTYPES[config.fsdp_reduce_dtype] if config.fsdp_reduce_dtype else None
    full = torch.float32 if param_dtype else None
    # The Policy's outputs are float32 (the loss in full precision), and so are those of the
    # network's children it shards by default (each next one casts its input again). A network's
    # declared blocks (a transformer's, a Hugging Face model's layers) hand on in param_dtype: to
    # the next block, or to the root's own layers (final norm, heads), which compute in it too.
    network = getattr(policy, "network", policy)
    block_output = None if hasattr(network, "wrap_units") or no_split_units(network) else full
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if config.fsdp_cpu_offload else OffloadPolicy()
    options = {
        "mesh": device_mesh(config, device),
        "offload_policy": offload,
        "reshard_after_forward": config.fsdp_sharding_strategy != "shard_grad_op",
    }
    units = [(unit, block_output) for unit in fsdp_units(policy)] + [(policy, full)]
    for unit, output_dtype in units:
        mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, output_dtype=output_dtype)
        fully_shard(unit, mp_policy=mixed, **options)
        record_fsdp_collectives(unit)


# torch's underscored multi-tensor kernels, which `clip_grad_norm_` calls directly (torch's own
# clipping calls the same); a torch without them gets `torch.nn.utils.clip_grad_norm_` itself.
FOREACH_KERNELS = all(hasattr(torch, name) for name in ("_foreach_norm", "_foreach_mul_"))


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float, norms: tuple | None = None) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)` for parameters on one
    device: the same operations in the same order (so bitwise the same result) without its
    per-call Python (grouping by device and dtype, a `.to()` per norm, checks). Returns the norm.
    `norms`: (the gradients, `torch.stack(torch._foreach_norm(gradients))`) where computed already."""
    if not FOREACH_KERNELS:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if norms is None:
        grads = [p.grad for p in params if p.grad is not None]
        norms = grads, torch.stack(torch._foreach_norm(grads))
    grads, per_tensor = norms
    total = torch.linalg.vector_norm(per_tensor)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total

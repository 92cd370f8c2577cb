"""Every rank's loss reaches the same parameters — checked before DDP reduces a gradient.

DDP (without `find_unused_parameters`) reduces gradients in buckets as backward fills them; a
parameter one rank's loss never reaches (a head that rank stopped using, a branch taken on local
data) leaves that rank's buckets filling in another order and size than its peers'. Gloo then
aborts the process ("Received data size doesn't match expected size ... Is there a distributed
collective mismatch"), NCCL reduces garbage or waits forever. So before the backward that
synchronises, each rank walks its loss's autograd graph for the parameters it reaches (the
`AccumulateGrad` leaves: what backward will give a gradient) and the ranks compare in one small
all-gather: one byte per trainable parameter. If any rank misses any, every rank raises the same
`UnusedParameterError` — naming the ranks, the step and the parameters — before any of them
enters the mismatched reduction. Cost: the graph walk (~1 us a node) and the all-gather
(benchmarks/costs/update_step.py). Elsewhere (FSDP, or one rank accumulating micro-batches)
`check_every_parameter_has_a_gradient` looks once, after a backward, for a parameter left
without a gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from fleetrl.parallel import reduce
from fleetrl.parallel.param_check import tensors_with_ranks
from fleetrl.probe import flight_recorder


class UnusedParameterError(RuntimeError):
    """The loss left trainable parameters without a gradient on some actor rank(s)."""

    def __init__(self, missing: dict[str, list[int]], loss: str, step: str):
        self.missing = missing
        self.ranks = sorted({rank for ranks in missing.values() for rank in ranks})
        super().__init__(
            f"the {loss} loss of actor rank {', '.join(map(str, self.ranks))} left {len(missing)} trainable "
            f"parameter(s) without a gradient at {step}: {tensors_with_ranks(missing)}. Under DDP the ranks would reduce "
            "different gradients (Gloo aborts on the mismatch, NCCL hangs); every trainable parameter must "
            "take part in Policy.forward(obs, actions) on every rank at every step, or be frozen "
            "(requires_grad=False)"
        )


def reached_parameters(loss: torch.Tensor) -> set[int]:
    """ids of the leaf tensors `loss.backward()` will give a gradient to."""
    reached, seen = set(), set()
    pending = [loss.grad_fn] if loss.grad_fn is not None else []
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if variable is not None:
            reached.add(id(variable))
        pending.extend(next_node for next_node, _ in node.next_functions)
    return reached


def check_all_ranks_reach_every_parameter(
    loss: torch.Tensor, policy: nn.Module, ignored, loss_name: str, grad_step: int
) -> None:
    """A collective: every rank calls it before the same synchronising backward, its
    `grad_step`-th of the current update. Raises `UnusedParameterError` on every rank if any
    rank's `loss` misses a trainable parameter of `policy` (but those in `ignored`, left out on
    purpose)."""
    reached = reached_parameters(loss)
    named = [(name, p) for name, p in policy.named_parameters() if p.requires_grad and name not in ignored]
    local = torch.tensor([id(p) not in reached for _, p in named], dtype=torch.uint8, device=reduce.comm_device())
    if reduce.world_size() == 1:
        table = local[None].cpu()
    else:
        gathered = [torch.empty_like(local) for _ in range(reduce.world_size())]
        with flight_recorder.collective("all_gather (parameters reached by the loss)", local):
            dist.all_gather(gathered, local)
        table = torch.stack(gathered).cpu()  # (ranks, parameters)
    missing = {
        name: [rank for rank in range(table.shape[0]) if table[rank, index]]
        for index, (name, _) in enumerate(named)
        if table[:, index].any()
    }
    if missing:
        raise UnusedParameterError(missing, loss_name, step_text(grad_step))


def step_text(grad_step: int) -> str:
    """'gradient step 3 of actor.train call 20' (the call counted by this process's recorder)."""
    recorder = flight_recorder.current()
    current = recorder.current if recorder else None
    return (
        f"gradient step {grad_step} of {current.name} call {current.calls}" if current else f"gradient step {grad_step}"
    )


def check_every_parameter_has_a_gradient(policy: nn.Module, ignored=frozenset(), loss: str = "the") -> None:
    """A trainable parameter the loss never reached would leave DDP waiting for its gradient
    (or FSDP reducing garbage); name it instead. The graph is the same on every rank, so every
    rank raises together. `ignored`: names the loss path leaves out on purpose (a head only
    another phase trains)."""
    missing = [
        name for name, p in policy.named_parameters() if p.requires_grad and p.grad is None and name not in ignored
    ]
    if missing:
        raise RuntimeError(
            f"the {loss} loss produced no gradient for the trainable parameter(s) {missing}: "
            "every trainable parameter must take part in Policy.forward(obs, actions), "
            "or be frozen (requires_grad=False)"
        )

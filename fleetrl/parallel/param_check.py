"""Cross-rank consistency: do all actor ranks still hold the same parameters and buffers?

DDP keeps replicas equal only as long as every rank applies the same update; a missed reduction,
a rank-local random draw, an in-place write outside the loss path or a bit flip makes them drift
silently. `divergent_replicas` compares one 64-bit fingerprint per tensor (`reduce.fingerprint`:
integer arithmetic over the exact bits, so equal tensors give equal fingerprints on any
hardware) in one all-gather, and names each tensor that differs with the ranks that hold the
odd value out.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch import nn

from fleetrl.parallel import reduce
from fleetrl.probe import flight_recorder


def tensors_with_ranks(by_name: dict[str, list[int]], shown: int = 20) -> str:
    """`name (rank 1); other (ranks 0, 2)` for the first `shown` tensors, then how many more."""
    listed = "; ".join(
        f"{name} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        for name, ranks in list(by_name.items())[:shown]
    )
    return listed + (f" and {len(by_name) - shown} more" if len(by_name) > shown else "")


class ReplicaDivergenceError(RuntimeError):
    """Actor ranks hold different values for parameters or buffers that must be identical."""

    def __init__(self, differing: dict[str, list[int]], world_size: int):
        self.differing = differing
        super().__init__(
            f"the {world_size} actor ranks no longer hold identical weights: {len(differing)} tensor(s) "
            f"differ, named with the rank(s) holding the odd value (against the majority; with two ranks, "
            f"against rank 0) — {tensors_with_ranks(differing)}. A replica diverged (a rank skipped or repeated "
            "an update, drew rank-local random numbers, or wrote a parameter outside the loss path); the "
            "run stops here, and the checkpoints already written are kept"
        )


def named_tensors(modules: dict[str, nn.Module]) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of `modules`, named '<module key>.<name>'."""
    return [
        (f"{key}.{name}", tensor)
        for key, module in modules.items()
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]
    ]


def odd_ranks(column: list[int]) -> list[int]:
    """Ranks whose fingerprint is not the majority's (ties go to the value rank 0 holds)."""
    counts = Counter(column)
    top = max(counts.values())
    reference = next(value for value in column if counts[value] == top)  # lowest rank among the most common
    return [rank for rank, value in enumerate(column) if value != reference]


def divergent_replicas(modules: dict[str, nn.Module]) -> dict[str, list[int]]:
    """{tensor name: ranks holding an odd value} over every parameter and buffer of `modules`
    (empty when all ranks agree). A collective: every rank calls it with the same modules, and
    every rank gets the same answer. With one rank (no process group): {} without communicating."""
    if reduce.world_size() == 1:
        return {}
    named = named_tensors(modules)
    device = reduce.comm_device()
    local = (
        torch.stack([reduce.fingerprint(t.to(device)) for _, t in named])
        if named
        else torch.zeros(0, dtype=torch.int64, device=device)
    )
    gathered = [torch.empty_like(local) for _ in range(reduce.world_size())]
    with flight_recorder.collective("all_gather (parameter fingerprints)", local):
        dist.all_gather(gathered, local)
    table = torch.stack(gathered).cpu()  # (ranks, tensors)
    differs = (table != table[0]).any(dim=0).tolist()
    return {
        name: odd_ranks(table[:, index].tolist()) for index, ((name, _), bad) in enumerate(zip(named, differs)) if bad
    }

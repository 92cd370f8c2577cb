"""Rank-invariant minibatches: W ranks, each holding some env columns of the trajectory, train on
exactly the minibatches one process would draw from the whole trajectory.

The trajectory (T steps, N envs) is split by env columns: rank r holds envs
[r·N/W, (r+1)·N/W). A sample's *global index* is its position in the whole (T, N) batch
flattened step-major, g = t·N + n — the order one process sees. Each epoch every rank draws the
same permutation of the B = T·N global indices from an identically seeded generator (one process
draws the same one); minibatch k is perm[k·M:(k+1)·M]. Each rank trains on the members of
minibatch k it holds, in minibatch order. How many that is varies per rank and minibatch; the
loss is normalised by the global M, so the gradients summed over ranks are the single-process
gradient whatever the split.

Every rank computes every rank's member counts from the shared permutation, so all agree,
without communicating, on how many micro-batches each minibatch takes; a rank with fewer members
runs empty micro-batches so that it joins every gradient reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EnvShard:
    """Rank `rank` of `world_size` holds env columns [rank·N/W, (rank+1)·N/W) of `steps` × `total_envs`."""

    steps: int
    total_envs: int
    rank: int = 0
    world_size: int = 1

    @property
    def envs_per_rank(self) -> int:
        return self.total_envs // self.world_size

    @property
    def global_size(self) -> int:
        return self.steps * self.total_envs

    def locate(self, global_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(owning rank, index in the owner's step-major flattened shard) of global indices."""
        step, env = global_index // self.total_envs, global_index % self.total_envs
        owner = env // self.envs_per_rank
        return owner, step * self.envs_per_rank + (env - owner * self.envs_per_rank)


def plan_epoch(
    order: torch.Tensor | None, minibatch_size: int, shard: EnvShard, micro_batch_size: int | None
) -> list[list[torch.Tensor]]:
    """For each minibatch of the epoch, this rank's local sample indices split into micro-batches.

    `order` is the epoch's permutation of the global indices (None: the natural order). Every
    rank gets the same number of minibatches and, per minibatch, the same number of
    micro-batches — ceil(largest rank's member count / micro_batch_size), at least one — some of
    them possibly empty on some ranks.
    """
    size = shard.global_size
    order = torch.arange(size) if order is None else order
    owner, local = shard.locate(order)
    plan = []
    for start in range(0, size, minibatch_size):
        members = slice(start, start + minibatch_size)
        owners = owner[members]
        mine = local[members][owners == shard.rank]
        if micro_batch_size is None:
            plan.append([mine])
            continue
        most = int(torch.bincount(owners, minlength=shard.world_size).max())
        count = max(1, -(-most // micro_batch_size))
        plan.append([mine[i * micro_batch_size : (i + 1) * micro_batch_size] for i in range(count)])
    return plan


@dataclass
class Minibatches:
    """One update phase's minibatches on this rank: every epoch, the global permutation drawn
    from `generator` (identically seeded, so the same on every rank; none when one minibatch
    holds everything) planned by `plan_epoch`."""

    shard: EnvShard
    size: int  # samples per minibatch, over all ranks
    micro_batch_size: int | None
    generator: torch.Generator

    @property
    def whole(self) -> bool:
        """Every minibatch lies on this rank, in one piece: one rank, no accumulation."""
        return self.shard.world_size == 1 and self.micro_batch_size is None

    def epoch(self) -> list[list[torch.Tensor]]:
        total = self.shard.global_size
        order = torch.randperm(total, generator=self.generator) if total > self.size else None
        return plan_epoch(order, self.size, self.shard, self.micro_batch_size)

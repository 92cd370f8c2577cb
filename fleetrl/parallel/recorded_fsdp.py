"""FSDP2's all-gathers and reduce-scatters, recorded (parallel/recorded.py has the why and DDP's):
subclasses of FSDP2's default communications, which live in a private torch module that costs
~0.9 CPU-s to import — here, so that only an actor that shards pays it."""

from __future__ import annotations

from functools import partial

from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from fleetrl.parallel.recorded import recorded


class RecordedAllGather(DefaultAllGather):
    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        launch = partial(super().__call__, output_tensor, input_tensor, group, async_op)
        return recorded("all_gather (fsdp)", launch, input_tensor, group, async_op)


class RecordedReduceScatter(DefaultReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        launch = partial(super().__call__, output_tensor, input_tensor, group, op, async_op)
        return recorded("reduce_scatter (fsdp)", launch, input_tensor, group, async_op)


def record_fsdp_collectives(module) -> None:
    """Record the all-gathers and reduce-scatters of the FSDP2 module `module` (one that
    `fully_shard` returned)."""
    module.set_custom_all_gather(RecordedAllGather())
    module.set_custom_reduce_scatter(RecordedReduceScatter())

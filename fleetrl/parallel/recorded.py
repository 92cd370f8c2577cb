"""The loss path's own collectives — DDP's gradient buckets, FSDP2's all-gathers and
reduce-scatters — entered into the flight recorder when launched and completed when they finish.

Both libraries launch their collectives asynchronously (Gloo runs them on its threads, NCCL on a
stream) and wait later: the entry is made at launch and completed by the Work's Future, so a rank
blocked waiting for a peer shows the collective in flight. The hook points are the libraries'
own: DDP's comm hook, and FSDP2's `set_custom_all_gather` / `set_custom_reduce_scatter` with
subclasses of its default communications (which live in a private torch module; the setters are
public). Not recorded here: HSDP's replicate-dimension all-reduce, which FSDP2 calls directly
(torch's own flight recorder, probe/torch_trace.py, has it). Without a recorder installed (a
process fleetrl does not manage) each one is the library's default, unchanged. FSDP2's are in
recorded_fsdp.py: its module costs ~0.9 CPU-s to import, paid only by a run that shards.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from fleetrl.probe import flight_recorder
from fleetrl.probe.collectives import DEFAULT_GROUP


def recorded_allreduce_hook(state, bucket):  # no annotations: DDP compares them to the real types
    """DDP's default gradient all-reduce (`allreduce_hook`: divide by the world size, sum), recorded:
    a stalled bucket shows as 'all_reduce (ddp grad bucket i) #n' in flight rather than as a rank
    computing. Its one Python callback both completes the entry and unpacks the result, as the
    default hook's own callback does (a second callback per bucket cost ~20 µs more)."""
    recorder = flight_recorder.current()
    if recorder is None:
        return allreduce_hook(state, bucket)
    group = state if state is not None else dist.group.WORLD
    log, tensor = recorder.collectives, bucket.buffer()
    entry = log.enter(f"all_reduce (ddp grad bucket {bucket.index()})", [tensor])
    tensor.div_(group.size())

    def reduced(future):
        log.complete(entry)
        return future.value()[0]

    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(reduced)


def group_name(group: dist.ProcessGroup) -> str:
    """The recorder's name for `group`: 'actor' for the default group, else torch's name for it
    (the same on every rank: groups are created collectively, in the same order)."""
    return DEFAULT_GROUP if group is None or group == dist.group.WORLD else f"pg {group.group_name}"


def recorded(op: str, launch, input_tensor, group, async_op: bool):
    """Run `launch()` (a collective returning its Work, or None when synchronous) recorded."""
    recorder = flight_recorder.current()
    if recorder is None:
        return launch()
    log = recorder.collectives
    entry = log.enter(op, [input_tensor], group_name(group))
    work = launch()
    if async_op and work is not None:
        work.get_future().add_done_callback(lambda _: log.complete(entry))
    else:
        log.complete(entry)
    return work

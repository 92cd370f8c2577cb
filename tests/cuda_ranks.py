"""Support for tests/test_cuda.py: what one spawned NCCL rank runs (importable by the spawned
process, unlike a test module's locals)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from fleetrl.net import free_port
from fleetrl.parallel import process_group
from fleetrl.probe import torch_trace


def nccl_rank(rank: int, world: int, repeats: int) -> dict:
    """Join an NCCL group through the trainer's own join code, all-reduce `repeats` times, and
    read torch's flight recorder as the heartbeat does."""
    backend = process_group.init_process_group(rank, world, "127.0.0.1", free_port(), timeout_s=60, device="cuda:0")
    values = []
    for _ in range(repeats):
        tensor = torch.full((10_000,), float(rank + 1), device="cuda:0")
        dist.all_reduce(tensor)  # not reduce.all_reduce_sum: it issues nothing with one rank
        values.append(tensor[0].item())  # waits for the kernel
    torch.cuda.synchronize()
    entries = [torch_trace.as_entry(e) for e in torch_trace.dump(entries=True)["entries"]]
    # torch's counters learn of a completion when its watchdog retires the work (every ~100 ms);
    # the heartbeat reads them as they are, so wait for them as it would
    trace, deadline = torch_trace.TorchTrace(), time.monotonic() + 30
    summary = trace.summary()
    while summary["completed"] != summary["entered"] and time.monotonic() < deadline:
        time.sleep(0.1)
        summary = trace.summary()
    return {
        "backend": backend,
        "values": values,
        "summary": summary,
        "entries": [(entry["op"], entry["finished"] is not None) for entry in entries],
    }

"""Support for tests/test_cuda.py: what one spawned NCCL rank runs (importable by the spawned
process, unlike a test module's locals)."""

from __future__ import annotations

import torch

from fleetrl.parallel import process_group, reduce
from fleetrl.parallel.net import free_port
from fleetrl.watch import torch_trace


def nccl_rank(rank: int, world: int, repeats: int) -> dict:
    """Join an NCCL group through the trainer's own join code, all-reduce `repeats` times, and
    read torch's flight recorder as the heartbeat does."""
    backend = process_group.init_process_group(rank, world, "127.0.0.1", free_port(), timeout_s=60, device="cuda:0")
    values = []
    for _ in range(repeats):
        tensor = torch.full((10_000,), float(rank + 1), device="cuda:0")
        values.append(reduce.all_reduce_sum(tensor)[0].item())  # .item() waits for the kernel
    torch.cuda.synchronize()
    trace = torch_trace.TorchTrace()
    return {
        "backend": backend,
        "values": values,
        "summary": trace.summary(),
        "ops": [entry["op"] for entry in (torch_trace.as_entry(e) for e in torch_trace.dump(entries=True)["entries"])],
    }

"""This process's GPU, read once per heartbeat: a sign that a call is busy, and a column of `fleetrl top`.

A call that waits on its GPU (a synchronising copy, `torch.cuda.synchronize()` with blocking
sync) sits at one line using no CPU: blocked, by its stack and CPU alone. The GPU's utilisation
says whether kernels run meanwhile (watch/judging/judgement.py). One wait keeps a GPU busy for nothing: an
NCCL collective whose peer never comes spins in its kernel. So utilisation counts as a busy sign
only while the process has no collective in flight; a collective held up is the alignment's to
judge (watch/judging/alignment.py).

Read only in a process that has initialised CUDA (a worker that computes on a GPU): nothing is
read, and nothing is initialised, in one that has not — every process of a machine without a
GPU, and env workers on one with. The utilisation is NVML's (through `torch.cuda.utilization`,
which needs the optional `nvidia-ml-py`; without it only the memory is read): the share of the
driver's last sample period in which a kernel ran on the device, whichever process ran it.
"""

from __future__ import annotations

import sys

MIB = 2**20


def gpu_use() -> dict:
    """{"gpu_util_pct": utilisation of the GPU this process computes on, "gpu_memory_mib":
    memory torch holds on it}; {} where this process has not initialised CUDA, and without
    "gpu_util_pct" where NVML cannot be read."""
    torch = sys.modules.get("torch")  # never imported here: a process without torch uses no GPU through it
    if torch is None or not torch.cuda.is_initialized():
        return {}
    device = torch.cuda.current_device()
    use = {"gpu_memory_mib": torch.cuda.memory_reserved(device) / MIB}
    try:
        use["gpu_util_pct"] = float(torch.cuda.utilization(device))
    except Exception:  # no nvidia-ml-py, or no NVML in this container: the memory alone
        pass
    return use

"""The CPU a run itself keeps busy in its steady state: every process of its tree (the supervisor,
the controller, Ray's daemons and workers, an async vector env's subprocesses), sampled as its
iterations are logged — from the end of iteration `warmup` to the last one logged. Start-up (Ray,
imports, the first calls) is left out, which a whole-run figure cannot do; other processes on the
machine are not counted (`load.ForeignLoad` measures them)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

POLL_S = 0.1


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its living descendants."""
    import psutil  # here, not above: the kit is also imported in venvs without it

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


class SteadyCpu:
    """In a thread while the run of `pid` writes its run directory under `parent`: (wall, tree
    CPU) when iteration `warmup` is logged, and again at each later iteration. `cores()`: the
    cores busy on average between the two (None when fewer than two points were seen)."""

    def __init__(self, pid: int, parent: Path, warmup: int):
        self.pid, self.parent, self.warmup = pid, parent, warmup
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def __enter__(self) -> SteadyCpu:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    def logged(self) -> int:
        files = list(self.parent.glob("*/metrics.jsonl"))
        return len(files[0].read_text().splitlines()) if files else 0

    def sample(self) -> None:
        seen = 0
        while not self.stopped.wait(POLL_S):
            lines = self.logged()
            if lines == seen or lines < max(self.warmup, 1):
                continue
            seen = lines
            point = (time.monotonic(), tree_cpu_s(self.pid))
            if self.first is None:
                self.first = point
            else:
                self.last = point

    def cores(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

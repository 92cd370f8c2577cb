"""Leave nothing behind: kill whole process trees, children first, and reap them."""

from __future__ import annotations

import contextlib

import psutil


def kill_tree(pid: int, include_root: bool = True, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL `pid`'s descendants (and `pid` itself when include_root); returns the pids killed.
    A stopped process dies of SIGKILL too. Our own children are reaped, so no zombie stays."""
    try:
        root = psutil.Process(pid)
        victims = root.children(recursive=True) + ([root] if include_root else [])
    except psutil.NoSuchProcess:
        return []
    for process in victims:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(victims, timeout=timeout_s)
    return [p.pid for p in victims]


def kill_own_children() -> list[int]:
    """Everything this process started (Ray daemons and workers, env subprocesses)."""
    return kill_tree(psutil.Process().pid, include_root=False)

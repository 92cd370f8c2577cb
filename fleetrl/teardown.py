"""Leave nothing behind: kill whole process trees, children first, and reap them."""

from __future__ import annotations

import contextlib
import os
import time

import psutil

POLL_S = 0.05


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
    wait_ended(victims, timeout_s)
    return [p.pid for p in victims]


def wait_ended(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Until each of `processes` has ended (at most `timeout_s`); those still running. A zombie
    has ended: our own are reaped here, another's wait for their parent. (psutil.wait_procs
    waits on them until its timeout: a killed node's processes, whose parent — the namespace's
    init, a subreaper — reaps them later, cost an isolated simulation's teardown 10 s per node.)"""
    deadline = time.monotonic() + timeout_s
    running = list(processes)
    while running:
        running = [process for process in running if not ended(process)]
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return running


def ended(process: psutil.Process) -> bool:
    try:
        if process.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    try:
        reaped, _ = os.waitpid(process.pid, os.WNOHANG)
    except OSError:  # ChildProcessError: another's zombie, which its parent reaps
        return True
    # Ours once reaped: a process whose main thread has exited shows as a zombie while its other
    # threads still exit, and cannot be reaped yet (left to this machine's init if we exit then).
    return reaped == process.pid


def kill_own_children() -> list[int]:
    """Everything this process started (Ray daemons and workers, env subprocesses)."""
    return kill_tree(psutil.Process().pid, include_root=False)

"""Python stacks of worker processes, taken from outside.

Each worker registers `faulthandler` on SIGUSR1, writing all its threads' stacks to a file in the
run directory. faulthandler's handler runs without the GIL, so it answers even when the main
thread holds the GIL in a C loop. Where `py-spy` is installed it adds native frames. A stopped
(SIGSTOP) process can answer neither; the report says so.
"""

from __future__ import annotations

import faulthandler
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

STACK_SIGNAL = signal.SIGUSR1


def stack_file(stack_dir: Path, component: str, rank: int) -> Path:
    return Path(stack_dir) / f"{component}-{rank}.txt"


def register_stack_dump(path: Path) -> None:
    """In a worker: dump every thread's stack into `path` on SIGUSR1 (overwritten each time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    file = open(path, "w")  # kept open for the process lifetime: faulthandler writes to its fd
    faulthandler.register(STACK_SIGNAL, file=file, all_threads=True, chain=False)


def capture_stacks(workers: list[dict], stack_dir: Path, py_spy_timeout_s: float = 5.0) -> dict:
    """(component, rank) → stack text, for workers whose pid lives on this machine."""
    waiting = []
    stacks = {}
    for worker in workers:
        key = (worker["component"], worker["rank"])
        pid = worker.get("pid")
        if worker.get("host") not in (None, socket.gethostname()):  # its pid means another process here
            stacks[key] = f"(on {worker['host']}: not signalled from here, the pid is of that machine)"
            continue
        if not pid or not psutil.pid_exists(pid):
            stacks[key] = "(process is gone)"
            continue
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            stacks[key] = "(process is stopped — SIGSTOP or a debugger; it cannot report a stack)"
            continue
        path = stack_file(stack_dir, *key)
        path.write_text("") if path.exists() else None
        try:
            psutil.Process(pid).send_signal(STACK_SIGNAL)
            waiting.append((key, path, pid))
        except psutil.Error as error:
            stacks[key] = f"(could not signal pid {pid}: {error})"
    time.sleep(0.5 if waiting else 0)
    for key, path, pid in waiting:
        text = path.read_text() if path.exists() else ""
        native = py_spy_dump(pid, py_spy_timeout_s)
        stacks[key] = (text or "(no faulthandler output)") + (f"\n--- py-spy (native) ---\n{native}" if native else "")
    return stacks


def py_spy_dump(pid: int, timeout_s: float) -> str:
    executable = shutil.which("py-spy")
    if executable is None:
        return ""
    try:
        result = subprocess.run(
            [executable, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return "(py-spy timed out)"
    return result.stdout.strip() if result.returncode == 0 else ""

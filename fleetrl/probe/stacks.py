"""Python stacks of worker processes: asked of the worker, else taken from outside on its machine.

First every worker is asked through the heartbeat store and answers from its heartbeat thread,
wherever it runs (probe/stack_requests.py). One that does not answer — its main thread holds the
GIL, it is stopped, it is gone — is handled from here only when it lives on this machine and in
this PID namespace (`machine_identity`, not the hostname): each worker registers `faulthandler`
on SIGUSR1, writing all its threads' stacks to a file in the run directory (the handler runs
without the GIL), and py-spy adds native frames. A stopped (SIGSTOP) process can answer neither:
py-spy reads its Python stack from its memory (`--nonblocking`), and the report says it is
stopped. A pid on another machine is never signalled: it would be some other process there, and
SIGUSR1's default action kills it.
"""

from __future__ import annotations

import faulthandler
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fleetrl.probe.flight_recorder import machine_identity
from fleetrl.probe.stack_requests import StackAsker

STACK_SIGNAL = signal.SIGUSR1


def stack_file(stack_dir: Path, component: str, rank: int) -> Path:
    return Path(stack_dir) / f"{component}-{rank}.txt"


def register_stack_dump(path: Path) -> None:
    """In a worker: dump every thread's stack into `path` on SIGUSR1 (overwritten each time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    file = open(path, "w")  # kept open for the process lifetime: faulthandler writes to its fd
    faulthandler.register(STACK_SIGNAL, file=file, all_threads=True, chain=False)


def capture_stacks(
    workers: list[dict], stack_dir: Path, ask: StackAsker | None = None, py_spy_timeout_s: float = 5.0
) -> dict:
    """(component, rank) → stack text of each of `workers` (their latest heartbeat records, or
    {component, rank} where there is none)."""
    here = machine_identity()
    askable = [(w["component"], w["rank"]) for w in workers if ask and may_answer(w, here, ask.timeout_s)]
    stacks = ask(askable) if ask and askable else {}
    local = []
    for worker in workers:
        key = (worker["component"], worker["rank"])
        if key in stacks:
            continue
        if worker.get("machine", here) != here:
            stacks[key] = (
                f"(did not answer through the heartbeat store, and it runs on {worker.get('host', 'another machine')}"
                f", not on this machine: its pid cannot be signalled from here)"
            )
        else:
            local.append(worker)
    return {**stacks, **signal_local(local, stack_dir, py_spy_timeout_s)}


def may_answer(worker: dict, here: str, within_s: float) -> bool:
    """False for a worker on this machine whose process is gone or stopped, or whose heartbeat
    thread (the one that answers) has not run for longer than an answer may take (`within_s`: a
    main thread holding the GIL): waiting for its answer would only delay the others' and the
    dump from outside. A worker elsewhere can only be asked."""
    if worker.get("machine", here) != here:
        return True
    if worker.get("heartbeat_age_s", 0.0) > within_s:  # the watcher's measure (watch/judging/judgement.py)
        return False
    try:
        return bool(worker.get("pid")) and psutil.Process(worker["pid"]).status() not in STOPPED_OR_GONE
    except psutil.Error:
        return False


STOPPED_OR_GONE = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def signal_local(workers: list[dict], stack_dir: Path, py_spy_timeout_s: float) -> dict:
    """(component, rank) → stack text, for workers whose pid lives on this machine."""
    waiting = []
    stacks = {}
    for worker in workers:
        key = (worker["component"], worker["rank"])
        pid = worker.get("pid")
        if not pid:
            stacks[key] = "(no heartbeat from it yet: still starting, or it never reached the store)"
            continue
        if not psutil.pid_exists(pid):
            stacks[key] = "(process is gone)"
            continue
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            read = py_spy_dump(pid, py_spy_timeout_s, "--nonblocking")  # reads its memory; no native frames
            stacks[key] = "(process is stopped — SIGSTOP or a debugger; it cannot report a stack" + (
                f", read from outside by py-spy)\n{read}" if read else ")"
            )
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
        native = py_spy_dump(pid, py_spy_timeout_s, "--native")
        stacks[key] = (text or "(no faulthandler output)") + (f"\n--- py-spy (native) ---\n{native}" if native else "")
    return stacks


def py_spy_dump(pid: int, timeout_s: float, mode: str) -> str:
    """`py-spy dump MODE --pid PID` (--native: with C frames, pausing the process briefly;
    --nonblocking: Python frames only, and the only way to read a stopped process), or ''."""
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when its bin/ is not on PATH
    executable = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if executable is None:
        return ""
    try:
        result = subprocess.run(
            [executable, "dump", mode, "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return "(py-spy timed out)"
    return result.stdout.strip() if result.returncode == 0 else ""

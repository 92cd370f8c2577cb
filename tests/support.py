"""What tests share besides fixtures: how to run fleetrl as a user would, and how to find the
processes a test started. Test modules import from here, never from each other or conftest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
FLEETRL = [sys.executable, "-m", "fleetrl"]


def subprocess_env() -> dict:
    """Environment for `python -m fleetrl` subprocesses: plain, non-interactive, and able to
    import `tests.envs` entry points."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    return env


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} {process.name()!r} ({' '.join(process.cmdline())[:200]})"
    except psutil.Error:
        return f"pid {process.pid} (gone while describing)"


def is_interpreter_helper(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker / forkserver: one per interpreter, started the first
    time a spawn-context lock or shared array is made, and meant to live until the interpreter
    exits. Not something a test started or can end."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.resource_tracker" in command or "multiprocessing.forkserver" in command


def own_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if not is_interpreter_helper(p)]


def end_leftovers(children: list[psutil.Process], what: str) -> None:
    """Fail naming whichever of `children` is still alive after a short grace period (for
    processes already on their way out, e.g. vector-env workers after close()); kill those,
    so one leaky test does not fail the ones after it."""
    if not children:
        return
    _, alive = psutil.wait_procs(children, timeout=3)  # also reaps exited children (no zombies)
    leftovers = [p for p in alive if p.is_running()]
    if not leftovers:
        return
    names = [describe(p) for p in leftovers]
    for process in leftovers:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(leftovers, timeout=5)
    pytest.fail(f"{what} left {len(names)} child process(es) alive: " + "; ".join(names), pytrace=False)

"""Shared fixtures: every test must end every process it starts."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The tests' tensors are tiny; with torch's default of one thread per core, each op pays an
    OpenMP fork/join that costs milliseconds on a busy 2-core machine (100x the op itself).
    fleetrl's own processes set their thread count from runner.torch_threads."""
    import torch

    torch.set_num_threads(1)
    yield


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


@pytest.fixture(autouse=True, scope="session")
def no_leftover_processes_at_exit():
    """Catches what module- and session-scoped fixtures started and did not end."""
    yield
    end_leftovers(own_children(), "the test session")


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail any test that leaves a child process of the test process alive. Processes that were
    already running when the test started belong to wider-scoped fixtures (a module's shared
    cluster, say) and are checked when the session ends instead."""
    before = {p.pid for p in own_children()}
    yield
    end_leftovers([p for p in own_children() if p.pid not in before], "test")


@pytest.fixture
def quiet_fleetrl_logging():
    """`Trainer` attaches handlers to the 'fleetrl' loggers (stderr and the run's train.log);
    close them after an in-process training test so no file stays open into the next test."""
    yield
    for name in ("fleetrl", "fleetrl.iterations"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()


def subprocess_env() -> dict:
    """Environment for `python -m fleetrl` subprocesses: plain, non-interactive, and able to
    import `tests.envs` entry points."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    return env


FLEETRL = [sys.executable, "-m", "fleetrl"]

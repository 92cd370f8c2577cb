"""The one way tests run torch.distributed ranks: `spawn_ranks` starts W spawned processes, each
joins the Gloo group on 127.0.0.1 through the package's own `process_group.init_process_group`
(so the tests exercise the trainer's join code), runs a scenario function and hands its result
back; `each_scenario` is the scenario that runs several named ones in one group (spawning and
joining cost seconds, a scenario tens of milliseconds).

Invariants: the wait is bounded (a stall fails the test naming the ranks still running, it never
hangs it); a rank that raises fails the test with its traceback; every process is ended, on
success, on failure and on timeout. Scenario functions and their arguments must be importable
module-level names (spawned processes unpickle them), not a test module's locals.
"""

from __future__ import annotations

import gc
import multiprocessing
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

import torch

from fleetrl.net import free_port
from fleetrl.parallel import process_group

JOIN_TIMEOUT_S = 30


def spawn_ranks(
    scenario: Callable,
    *args,
    world: int = 2,
    timeout_s: float = 120,
    join: bool = True,
    group_timeout_s: float = JOIN_TIMEOUT_S,
) -> list:
    """Run `scenario(rank, world, *args)` in `world` spawned processes, each in the process
    group first unless `join` is False (a scenario that tests joining itself); returns each
    rank's result, in rank order. Fails the test, after killing every rank, when one raises or
    exits abnormally, or when any is still running after `timeout_s`. `group_timeout_s` bounds
    the join and every collective: a scenario that keeps one rank waiting in a collective on
    purpose passes one longer than that wait."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        port = free_port() if join else None
        processes = [
            context.Process(
                target=rank_main,
                args=(scenario, args, rank, world, port, group_timeout_s, out_dir),
                name=f"rank {rank}",
            )
            for rank in range(world)
        ]
        for process in processes:
            process.start()
        try:
            deadline = time.monotonic() + timeout_s
            running = list(processes)
            while running and not any(p.exitcode for p in processes) and time.monotonic() < deadline:
                # a failed rank ends the wait: the others would wait for it until the Gloo timeout
                wait([p.sentinel for p in running], timeout=max(0.0, deadline - time.monotonic()))
                running = [p for p in running if p.exitcode is None]
        finally:
            stalled = [rank for rank, p in enumerate(processes) if p.exitcode is None]
            failed = {rank: p.exitcode for rank, p in enumerate(processes) if p.exitcode}
            for process in processes:
                if process.is_alive():
                    process.kill()
                process.join(5)
        if failed:
            errors = [Path(out_dir) / f"rank{rank}.error" for rank in failed]
            raise AssertionError(
                f"rank(s) exited with codes {failed} (ranks {stalled} killed then):\n"
                + "\n".join(path.read_text() for path in errors if path.is_file())
            )
        if stalled:
            raise AssertionError(f"rank(s) {stalled} still running after {timeout_s:g} s: a stall")
        return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


def rank_main(
    scenario: Callable, args: tuple, rank: int, world: int, port: int | None, group_timeout_s: float, out_dir: str
) -> None:
    """What each spawned rank runs: join, the scenario, its result saved, the group left. An
    exception is saved (the parent shows it) and re-raised (a non-zero exit code)."""
    torch.set_num_threads(1)  # tiny tensors: torch's one thread per core only adds contention
    try:
        if port is not None:
            process_group.init_process_group(rank, world, "127.0.0.1", port, timeout_s=group_timeout_s)
        torch.save(scenario(rank, world, *args), Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"rank{rank}.error").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        raise
    finally:
        # Free every DDP wrapper before leaving the group: a wrapper still alive when the group
        # is destroyed is freed at interpreter exit, and Gloo then aborts the process now and
        # then ("terminate called without an active exception": 1-2 exits in 10-15 here).
        gc.collect()
        process_group.destroy_process_group()


def each_scenario(rank: int, world: int, train_one: Callable[[str, int, int], dict], names: list[str]) -> dict:
    """A scenario that runs `train_one(name, rank, world)` for every name in one process group;
    returns {name: result}."""
    return {name: train_one(name, rank, world) for name in names}

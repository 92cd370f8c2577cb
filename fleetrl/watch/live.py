"""A running job, found from outside it: what `fleetrl top` and `fleetrl stack` connect to.

While a run is watched, `<run>/watch.json` says where its heartbeat store listens (host, port)
and which process hosts it (pid, machine); the store holds the run's worker list and watchdog
settings (`RUN_KEY`) beside every worker's heartbeat. `attach(run)` turns a run directory (or,
by default, the newest one under `runs/`) into a `LiveRun`, or a user error saying why not.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.errors import UserError
from fleetrl.probe.flight_recorder import heartbeat_key, machine_identity

WATCH_FILE = "watch.json"
RUN_KEY = "fleetrl/run"
ATTACH_TIMEOUT = timedelta(seconds=3)


def advertise(run_dir: Path, host: str, port: int) -> Path:
    """Write `<run>/watch.json`: where this process's heartbeat store can be reached."""
    path = Path(run_dir) / WATCH_FILE
    record = {"host": host, "port": port, "pid": os.getpid(), "machine": machine_identity()}
    path.write_text(json.dumps(record))
    return path


def publish_run(store, workers: list[dict], config: WatchdogConfig) -> None:
    """Put the watched workers and the watchdog's settings into the store, for `LiveRun`."""
    store.set(RUN_KEY, json.dumps({"workers": workers, "watchdog": asdict(config)}))


@dataclass
class LiveRun:
    run_dir: Path
    store: object  # a TCPStore client of the run's heartbeat store
    workers: list[dict]
    watchdog: WatchdogConfig

    def keys(self) -> list[tuple[str, int]]:
        return [(w["component"], w["rank"]) for w in self.workers]

    def records(self) -> dict[tuple[str, int], dict]:
        """The latest heartbeat of each worker that has published one."""
        found = {}
        for key in self.keys():
            if self.store.check([heartbeat_key(*key)]):
                found[key] = json.loads(self.store.get(heartbeat_key(*key)))
        return found


def newest_run(runs: Path = Path("runs")) -> Path:
    candidates = [path for path in runs.glob("*/") if path.is_dir()] if runs.is_dir() else []
    if not candidates:
        raise UserError(f"no run directory under {runs.resolve()}: name one (fleetrl top RUN_DIR)")
    return max(candidates, key=lambda path: path.stat().st_mtime)


def attach(run: str | None) -> LiveRun:
    """Connect to the heartbeat store of the run in directory `run` (default: the newest run
    under ./runs); a user error naming the run when it is not running."""
    run_dir = Path(run) if run else newest_run()
    if not run_dir.is_dir():
        raise UserError(f"no such run directory: {run_dir}")
    watch_file = run_dir / WATCH_FILE
    if not watch_file.is_file():
        raise UserError(f"{run_dir} is not running (it has no {WATCH_FILE}: finished, stopped, or never started)")
    where = json.loads(watch_file.read_text())
    if where.get("machine") == machine_identity() and not psutil.pid_exists(where["pid"]):
        raise UserError(f"{run_dir} is not running: its process (pid {where['pid']}) is gone")
    from torch.distributed import TCPStore

    try:
        store = TCPStore(where["host"], where["port"], is_master=False, timeout=ATTACH_TIMEOUT)
        listed = store.check([RUN_KEY])
    except (RuntimeError, ValueError) as error:  # torch's store errors are RuntimeErrors
        raise UserError(
            f"{run_dir} is not running, or not reachable from here: its heartbeat store at "
            f"{where['host']}:{where['port']} did not answer ({str(error).splitlines()[0]})"
        ) from None
    if not listed:
        raise UserError(f"{run_dir} is still starting: its workers are not listed yet (try again in a moment)")
    run = json.loads(store.get(RUN_KEY))
    return LiveRun(run_dir, store, run["workers"], WatchdogConfig(**run["watchdog"]))

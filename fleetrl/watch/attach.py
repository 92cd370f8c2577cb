"""A running job, found from outside it: what `fleetrl top` and `fleetrl stack` connect to.

While a run is watched, `<run>/watch.json` says where its heartbeat store listens (host, port),
which process hosts it (pid, machine) and the run's secret (hex), which opens the store's sealed
values (probe/seal.py) — so the file is its owner's alone (0600, in a 0700 run directory). A
secret in the environment (FLEETRL_RUN_SECRET, e.g. on another machine) is used where the file
has none. The store holds the run's worker list and watchdog
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
from fleetrl.probe.seal import SECRET_VARIABLE, Seal, SealedStore

WATCH_FILE = "watch.json"
RUN_KEY = "fleetrl/run"
ATTACH_TIMEOUT = timedelta(seconds=3)


def advertise(run_dir: Path, host: str, port: int, secret: bytes) -> Path:
    """Write `<run>/watch.json`, readable by its owner only: where this process's heartbeat
    store can be reached, and the secret its values are sealed with."""
    path = Path(run_dir) / WATCH_FILE
    record = {"host": host, "port": port, "pid": os.getpid(), "machine": machine_identity(), "secret": secret.hex()}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an older file of another mode is rewritten, not kept
    with os.fdopen(descriptor, "w") as file:
        file.write(json.dumps(record))
    return path


def publish_run(store, workers: list[dict], config: WatchdogConfig) -> None:
    """Put the watched workers and the watchdog's settings into `store` (a `SealedStore`), for
    `LiveRun`."""
    store.set(RUN_KEY, json.dumps({"workers": workers, "watchdog": asdict(config)}))


@dataclass
class LiveRun:
    run_dir: Path
    store: SealedStore  # a client of the run's heartbeat store
    workers: list[dict]
    watchdog: WatchdogConfig

    def keys(self) -> list[tuple[str, int]]:
        return [(w["component"], w["rank"]) for w in self.workers]

    def records(self) -> dict[tuple[str, int], dict]:
        """The latest heartbeat of each worker that has published one."""
        found = {}
        for key in self.keys():
            value = self.store.peek(heartbeat_key(*key))
            if value is not None:
                found[key] = json.loads(value)
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

    secret = where.get("secret") or os.environ.get(SECRET_VARIABLE)
    if not secret:
        raise UserError(
            f"{watch_file} holds no secret, and {SECRET_VARIABLE} is not set: the run's store cannot be read"
        )
    try:
        client = TCPStore(where["host"], where["port"], is_master=False, timeout=ATTACH_TIMEOUT)
        store = SealedStore(client, Seal(bytes.fromhex(secret)))
        run = store.peek(RUN_KEY)
    except (RuntimeError, ValueError) as error:  # torch's store errors are RuntimeErrors
        raise UserError(
            f"{run_dir} is not running, or not reachable from here: its heartbeat store at "
            f"{where['host']}:{where['port']} did not answer ({str(error).splitlines()[0]})"
        ) from None
    if run is None:
        raise UserError(f"{run_dir} is still starting: its workers are not listed yet (try again in a moment)")
    listed = json.loads(run)
    return LiveRun(run_dir, store, listed["workers"], WatchdogConfig(**listed["watchdog"]))

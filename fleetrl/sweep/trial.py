"""One trial, inside a Tune worker: a real `fleetrl train` as a child process, watched to its end.

The child is the same command a user would type (own run directory, watchdog, hang report), in
a session of its own (a terminal's Ctrl-C reaches the sweep, which stops the trials itself), and
tied to this worker's life (lifetime.py). While it runs, its newest metrics record is reported to
Tune (the sweep's status line); when it ends, the facts the sweep needs: exit code, run
directory, console log, wall seconds. Reading what they mean is the driver's (outcome.py).

This module is what every Tune worker imports: it stays light (no torch, no config loader).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fleetrl.tracking.jsonl import METRICS_FILE

POLL_S = 1.0
SEED_KEY = "runner.seed"
PROGRESS_KEYS = ("global_step", "episode_return_last100")


@dataclass(frozen=True)
class TrialSpec:
    index: int
    name: str  # its run directory is <sweep dir>/<name>-<time>
    swept: dict[str, str]  # the swept keys and this trial's values, as typed
    arguments: tuple[str, ...]  # the `key=value` overrides of its `fleetrl train`, fixed ones first
    cpus: int
    gpus: int

    @property
    def setting(self) -> str:
        """The combination without the seed: what the table compares across seeds."""
        return " ".join(f"{key}={value}" for key, value in self.swept.items() if key != SEED_KEY) or "(one setting)"

    def train_arguments(self, sweep_dir: Path) -> list[str]:
        """Its overrides, plus where its run directory goes; every trial starts a new run."""
        return [*self.arguments, f"runner.run_dir={sweep_dir}", f"runner.name={self.name}", "runner.resume=null"]


@dataclass(frozen=True)
class Launch:
    """What every trial's command needs from the sweep process."""

    config_path: Path
    sweep_dir: Path
    cwd: str  # the sweep's working directory: entry points resolve from there, as for `fleetrl train`
    environment: dict  # the sweep's environment, not the Tune worker's
    train_flags: tuple[str, ...]  # e.g. --skip-doctor
    trials: tuple[TrialSpec, ...]


def run_trial(tune_config: dict, launch: Launch) -> None:
    from ray import tune

    spec = launch.trials[tune_config["trial"]]
    log_path = launch.sweep_dir / f"{spec.name}.log"
    command = [
        sys.executable,
        "-m",
        "fleetrl.sweep.lifetime",
        str(os.getpid()),
        "-m",
        "fleetrl",
        "train",
        str(launch.config_path),
        *spec.train_arguments(launch.sweep_dir),
        *launch.train_flags,
    ]
    environment = dict(launch.environment)
    if spec.gpus:  # the GPUs Ray gave this trial
        environment["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    started = time.time()
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            command,
            cwd=launch.cwd,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tail = MetricsTail()
        while True:
            try:
                child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                record = tail.newest(find_run_dir(launch.sweep_dir, spec.name))
                if record is not None:
                    tune.report({key: record.get(key) for key in PROGRESS_KEYS})
    run_dir = find_run_dir(launch.sweep_dir, spec.name)
    tune.report(
        {
            "exit_code": child.returncode,
            "run_dir": str(run_dir) if run_dir else None,
            "log": str(log_path),
            "seconds": time.time() - started,
        }
    )


def find_run_dir(sweep_dir: Path, name: str) -> Path | None:
    """The trial's run directory, once its `fleetrl train` has made it."""
    found = sorted(path for path in Path(sweep_dir).glob(f"{name}-*") if path.is_dir())
    return found[-1] if found else None


class MetricsTail:
    """The newest record of a growing metrics.jsonl, reading only what was appended."""

    def __init__(self):
        self.offset = 0
        self.pending = b""

    def newest(self, run_dir: Path | None) -> dict | None:
        path = run_dir / METRICS_FILE if run_dir else None
        if path is None or not path.is_file():
            return None
        with open(path, "rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        complete = [line for line in lines if line.strip()]
        return json.loads(complete[-1]) if complete else None

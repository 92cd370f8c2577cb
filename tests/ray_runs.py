"""`fleetrl train` with 2 DDP actor ranks on the Ray backend, run to its end and checked for Ray
processes of the run left behind; `train_on_ray` also checks for a clean finish."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psutil

from fleetrl.metrics_log import read_metrics
from tests.support import FLEETRL, REPO, subprocess_env

TWO_ACTOR_RANKS = [
    "runner.tensorboard=false",
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, rollout: 0, env: 0}",
]


def ray_processes_of(driver_pid: int) -> list[psutil.Process]:
    """Ray daemons and workers of the session a driver started (its session directory and its
    actors' names end in the driver's pid); other sessions on this machine are not ours."""
    mark = re.compile(rf"(session_[0-9_-]+_{driver_pid}\b|fleetrl-\w+-\d+-{driver_pid}\b)")
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if mark.search(" ".join(process.info["cmdline"] or [])):
            found.append(process)
    return found


def run_on_ray(tmp_path: Path, config: str, *overrides: str) -> tuple[int, str]:
    """Run `fleetrl train` to its end; returns its exit code and stderr."""
    driver = subprocess.Popen(
        [*FLEETRL, "train", config, f"runner.run_dir={tmp_path}", *TWO_ACTOR_RANKS, *overrides],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = driver.communicate(timeout=300)
    finally:
        driver.kill()
        _, alive = psutil.wait_procs(ray_processes_of(driver.pid), timeout=10)
    assert not alive, f"Ray processes of the run left behind: {[p.pid for p in alive]}"
    return driver.returncode, stderr


def train_on_ray(tmp_path: Path, config: str, *overrides: str) -> tuple[Path, list[dict]]:
    """Run `fleetrl train` to a clean finish; returns the run directory and its metrics records."""
    code, stderr = run_on_ray(tmp_path, config, *overrides)
    assert code == 0, stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "hang_report.txt").exists()
    return run_dir, read_metrics(run_dir)

"""`fleetrl train` with 2 DDP actor ranks on the Ray backend, run to the end, checked for a clean
finish (exit 0, no incident report) and for Ray processes of the run left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil

from fleetrl.metrics_log import read_metrics
from tests.conftest import FLEETRL, REPO, subprocess_env
from tests.test_param_check import ray_processes_of

TWO_ACTOR_RANKS = ["runner.tensorboard=false", "cluster.backend=ray", "cluster.devices_per_node=2",
                   "cluster.component_placement={actor: 0-1, rollout: 0, env: 0}"]


def train_on_ray(tmp_path: Path, config: str, *overrides: str) -> tuple[Path, list[dict]]:
    """Run `fleetrl train` to the end; returns the run directory and its metrics records."""
    driver = subprocess.Popen([*FLEETRL, "train", config, f"runner.run_dir={tmp_path}", *TWO_ACTOR_RANKS,
                               *overrides],
                              cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        _, stderr = driver.communicate(timeout=300)
    finally:
        driver.kill()
        _, alive = psutil.wait_procs(ray_processes_of(driver.pid), timeout=10)
    assert not alive, f"Ray processes of the run left behind: {[p.pid for p in alive]}"
    assert driver.returncode == 0, stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "hang_report.txt").exists()
    return run_dir, read_metrics(run_dir)

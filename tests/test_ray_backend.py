"""The Ray backend for real: a local Ray cluster, simulated nodes, pinned workers, a DDP actor."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest

from tests.support import FLEETRL, REPO, subprocess_env

RAY_PROCESS_MARKERS = ("raylet", "gcs_server", "ray::", "default_worker.py", "dashboard")


def ray_processes() -> set[int]:
    found = set()
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if any(marker in command for marker in RAY_PROCESS_MARKERS):
            found.add(process.info["pid"])
    return found


@pytest.fixture(autouse=True)
def no_ray_left_behind():
    """Ray daemons outlive a killed driver as orphans, which the per-test child check cannot see:
    compare the machine's Ray processes before and after."""
    before = ray_processes()
    yield
    _, alive = psutil.wait_procs(
        [psutil.Process(p) for p in ray_processes() - before if psutil.pid_exists(p)], timeout=10
    )
    assert not alive, f"Ray processes left behind: {[p.pid for p in alive]}"


def train(tmp_path, config: str, *overrides: str, timeout: int = 600) -> dict:
    result = subprocess.run(
        [*FLEETRL, "train", config, f"runner.run_dir={tmp_path}", "runner.tensorboard=false", *overrides],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    return json.loads((run_dir / "summary.json").read_text())


def test_seed_placement_trains_cartpole_on_two_simulated_nodes(tmp_path):
    """The seed report's disaggregated layout, scaled to CPU slots, end to end: 2 raylets, env
    ranks on node 1, a 2-rank DDP actor and the rollout worker on node 0, pipelined in 2 stages."""
    summary = train(tmp_path, "configs/ppo_cartpole_2nodes.yaml")
    assert summary["target_reached"], summary
    assert summary["episode_return_last100"] >= 475


def test_every_worker_sees_where_it_runs(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    train(
        runs,
        "configs/ppo_cartpole.yaml",
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0, env: 0-1}",
        "env.num_envs=4",
        "env.id=tests.ray_envs:WhereAmI",
        f"env.kwargs={{folder: {probe}}}",
        "cluster.env_vars={FLEETRL_TEST_MARK: hello}",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=32",
        "runner.total_env_steps=64",
    )
    seen = [json.loads(path.read_text()) for path in probe.glob("*.json")]
    # The preflight doctor builds one simulator in a probe process of the driver's (with
    # cluster.env_vars applied, but outside placement).
    preflight = [s for s in seen if s["FLEETRL_COMPONENT"] is None]
    assert len(preflight) == 1, seen
    by_rank = {s["FLEETRL_RANK"]: s for s in seen if s["FLEETRL_COMPONENT"] is not None}
    assert set(by_rank) == {"0", "1"}, seen
    for rank, variables in by_rank.items():
        assert variables == {
            "FLEETRL_COMPONENT": "env",
            "FLEETRL_RANK": rank,
            "FLEETRL_WORLD_SIZE": "2",
            "FLEETRL_NODE_RANK": "0",
            "CUDA_VISIBLE_DEVICES": rank,
            "FLEETRL_TEST_MARK": "hello",
        }

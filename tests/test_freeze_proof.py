"""The fault catalogue: each failure injected for real (Ray workers, Gloo, real signals), and the
report must name the cause and the culprit within the bound, keep a loadable checkpoint and leave
no process behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from fleetrl.checkpoint import load_latest
from tests.support import FLEETRL, REPO, subprocess_env
from tests.test_ray_backend import no_ray_left_behind  # noqa: F401  (autouse fixture)

SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.checkpoint_interval=1",
    "runner.tensorboard=false",
    "runner.total_env_steps=1000000",
    "watchdog.heartbeat_timeout_s=3",
    "--skip-doctor",
]
RAY_TWO_ACTORS = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0}",
]


def run_fault(tmp_path, *overrides: str, timeout: int = 180, checkpointed: bool = True) -> tuple[int, dict, str]:
    """Train until the injected fault; `checkpointed`: it strikes after the first checkpoint."""
    result = subprocess.run(
        [*FLEETRL, "train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}", *SMALL, *overrides],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (run_dir,) = tmp_path.iterdir()
    report_file = run_dir / "hang_report.json"
    assert report_file.is_file(), result.stderr[-3000:]
    report = json.loads(report_file.read_text())
    assert (run_dir / "hang_report.txt").read_text().splitlines()[1] == report["summary"]
    if checkpointed:
        load_latest(run_dir)  # the last complete checkpoint is intact
    return result.returncode, report, result.stderr


def fault(kind: str, component: str, rank: int, call: int) -> str:
    return f"debug.fault={{kind: {kind}, component: {component}, rank: {rank}, call: {call}}}"


def assert_incident(code: int, report: dict, cause: str, culprit: list, within_s: float) -> None:
    assert code == 4, report
    assert report["cause"] == cause, report["summary"]
    assert report["culprit"] == culprit, report["summary"]
    assert report["detected_after_s"] <= within_s, report["detected_after_s"]
    worker = next(w for w in report["workers"] if [w["component"], w["rank"]] == culprit)
    assert worker["culprit"] and worker["pid"]


# (fault kind, component, rank, call) → (cause, bound in s, words the summary must hold)
CATALOGUE = {
    "rank killed mid all-reduce": (("kill", "actor", 1, 3), ("worker_died", 3, "died")),
    "rank frozen with SIGSTOP": (("stop", "actor", 1, 3), ("process_frozen", 10, "stopped (SIGSTOP")),
    "env.step never returns on one env worker": (("hang", "env", 1, 40), ("phase_timeout", 10, "env.step")),
    "rank-dependent extra collective": (("extra_collective", "actor", 1, 2), ("collective_mismatch", 10, "#")),
    "one rank does more optimisation steps": (
        ("extra_step", "actor", 1, 2),
        ("collective_mismatch", 10, "more collectives"),
    ),
}


@pytest.mark.parametrize("case", CATALOGUE)
def test_fault_on_ray_is_named(tmp_path, case):
    (kind, component, rank, call), (cause, bound, words) = CATALOGUE[case]
    code, report, _ = run_fault(tmp_path, *RAY_TWO_ACTORS, fault(kind, component, rank, call))
    assert_incident(code, report, cause, [component, rank], bound)
    assert words in report["summary"]


def test_cpu_op_holding_the_gil_in_one_rank(tmp_path):
    code, report, _ = run_fault(tmp_path, *RAY_TWO_ACTORS, fault("gil_hang", "actor", 1, 2))
    assert_incident(code, report, "process_frozen", ["actor", 1], 10)
    assert "GIL" in report["summary"]
    culprit = next(w for w in report["workers"] if w["culprit"])
    assert "inject_before" in culprit["stack"]  # faulthandler answered despite the held GIL


def test_env_step_that_never_returns_inline(tmp_path):
    code, report, _ = run_fault(tmp_path, fault("hang", "env", 0, 40))
    assert_incident(code, report, "phase_timeout", ["inline", 0], 10)
    assert "env.step" in report["summary"] and "faults.py" in report["summary"]
    (run_dir,) = tmp_path.iterdir()
    diagnosis = subprocess.run(
        [*FLEETRL, "diagnose", str(run_dir)], capture_output=True, text=True, env=subprocess_env(), timeout=60
    )
    assert diagnosis.returncode == 0 and report["summary"] in diagnosis.stdout
    drawn = subprocess.run(
        [*FLEETRL, "report", str(run_dir)], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert drawn.returncode == 0 and (run_dir / "incident_timeline.png").stat().st_size > 0


def test_env_step_that_never_returns_on_a_disaggregated_env_node(tmp_path):
    code, report, _ = run_fault(
        tmp_path,
        "cluster.backend=ray",
        "cluster.simulate_nodes=2",
        "cluster.num_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, env: 1}",
        fault("hang", "env", 0, 40),
    )
    assert_incident(code, report, "phase_timeout", ["env", 0], 10)
    assert next(w for w in report["workers"] if w["culprit"])["node"] == 1


def test_exception_in_one_worker_shows_its_traceback(tmp_path):
    code, report, _ = run_fault(tmp_path, *RAY_TWO_ACTORS, fault("exception", "env", 1, 40))
    assert code == 4 and report["cause"] == "worker_exception"
    assert "InjectedFault" in report["summary"] and "env.step" in report["summary"]
    assert "Traceback" in report["detail"] and "faults.py" in report["detail"]
    assert report["culprit"] == ["env", 1]
    assert report["detected_after_s"] <= 3


def test_head_without_gradient_is_named_not_a_hang(tmp_path):
    code, report, _ = run_fault(
        tmp_path, *RAY_TWO_ACTORS, "model.id=tests.fault_models:UnusedHeadNet", checkpointed=False
    )
    assert code == 4 and report["cause"] == "worker_exception", report["summary"]
    assert "forgotten_head" in report["summary"] + report["detail"]


def test_wrong_interface_is_peer_unreachable_in_seconds(tmp_path):
    started = time.monotonic()
    code, report, _ = run_fault(
        tmp_path,
        *RAY_TWO_ACTORS,
        "actor.dist_timeout_s=5",
        "cluster.env_vars={GLOO_SOCKET_IFNAME: nosuchif0}",
        checkpointed=False,
    )
    assert code == 4 and report["cause"] == "peer_unreachable", report["summary"]
    assert "nosuchif0" in report["summary"] + report["detail"]
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("when", "signum", "exit_code"),
    [("rollout", signal.SIGINT, 130), ("update", signal.SIGINT, 130), ("update", signal.SIGTERM, 143)],
)
def test_ctrl_c_on_ray_saves_and_stops_cleanly(tmp_path, when, signum, exit_code):
    """SIGINT (Ctrl-C) or SIGTERM while collecting or while the actor trains: a checkpoint of the
    reached iteration, exit 130 / 143, every Ray process gone (checked by the autouse fixture)."""
    slow = "env.id=fleetrl.envs.slow:SlowCartPole" if when == "rollout" else "algorithm.update_epochs=200"
    process = subprocess.Popen(
        [*FLEETRL, "train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}", *SMALL, *RAY_TWO_ACTORS, slow],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("*/checkpoints/ckpt_*.pt")):
            time.sleep(0.5)
        time.sleep(1.0)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == exit_code, stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    state = load_latest(run_dir)
    assert state["iteration"] >= 1 and isinstance(state["actor"]["policy"], dict)
    assert all(isinstance(v, torch.Tensor) for v in state["actor"]["policy"].values())


def test_a_start_up_step_that_hangs_is_reported_as_startup_timeout(tmp_path):
    """A start-up step under a deadline (connecting to Ray) that never finishes ends the run like
    every other incident: exit 4 and a report naming what hung."""
    script = (
        "import sys, time\n"
        "from fleetrl.config.loader import load_config\n"
        "from fleetrl.watch.session import WatchSession\n"
        "session = WatchSession(load_config('configs/ppo_cartpole.yaml'), sys.argv[1])\n"
        "with session.deadline(1, 'connecting to Ray (10.0.0.1:6379)'):\n"
        "    time.sleep(60)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4, result.stderr[-3000:]
    report = json.loads((tmp_path / "hang_report.json").read_text())
    assert report["cause"] == "startup_timeout"
    assert report["summary"] == "connecting to Ray (10.0.0.1:6379) did not finish within 1 s"
    assert "fleetrl doctor" in report["detail"]
    assert "fleetrl stopped: startup_timeout" in result.stderr

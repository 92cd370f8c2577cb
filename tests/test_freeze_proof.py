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
from tests.incidents import FROZEN_S, NOTICE_S, SMALL, STALL_S, assert_incident, fault, run_fault
from tests.support import LOADED_HOST_MARGIN_S, REPO, Fleetrl, fleetrl, subprocess_env

RAY_TWO_ACTORS = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0}",
]


# (fault kind, component, rank, call) → (cause, promised detection s, words the summary must hold)
CATALOGUE = {
    "rank killed mid all-reduce": (("kill", "actor", 1, 3), ("worker_died", NOTICE_S, "died")),
    "rank frozen with SIGSTOP": (("stop", "actor", 1, 3), ("process_frozen", FROZEN_S, "stopped (SIGSTOP")),
    "env.step never returns on one env worker": (("hang", "env", 1, 40), ("phase_timeout", STALL_S, "env.step")),
    "rank-dependent extra collective": (
        ("extra_collective", "actor", 1, 2),
        (
            "collective_mismatch",
            STALL_S,
            # 12 a call: 8, and the unused-parameter check's all-gather before each of SMALL's 4
            # gradient steps (parallel/grad_check.py)
            "actor rank 1 made more collectives (or optimisation steps) than the others "
            "(13 collectives in call 2 of actor.train, 12 in the call before)",
        ),
    ),
    "one rank does more optimisation steps": (
        ("extra_step", "actor", 1, 2),
        ("collective_mismatch", STALL_S, "more collectives"),
    ),
}


@pytest.mark.parametrize("case", CATALOGUE)
def test_fault_on_ray_is_named(tmp_path, case):
    (kind, component, rank, call), (cause, bound, words) = CATALOGUE[case]
    result = run_fault(tmp_path, *RAY_TWO_ACTORS, fault(kind, component, rank, call))
    assert_incident(result, cause, [component, rank], bound)
    assert words in result.hang_report["summary"]


def test_cpu_op_holding_the_gil_in_one_rank(tmp_path):
    result = run_fault(tmp_path, *RAY_TWO_ACTORS, fault("gil_hang", "actor", 1, 2))
    assert_incident(result, "process_frozen", ["actor", 1], FROZEN_S)
    report = result.hang_report
    assert "GIL" in report["summary"]
    culprit = next(w for w in report["workers"] if w["culprit"])
    assert "inject_before" in culprit["stack"]  # faulthandler answered despite the held GIL


def test_env_step_that_never_returns_inline(tmp_path):
    result = run_fault(tmp_path, fault("hang", "env", 0, 40))
    assert_incident(result, "phase_timeout", ["inline", 0], STALL_S)
    report, run_dir = result.hang_report, result.run_dir
    assert "env.step" in report["summary"] and "faults.py" in report["summary"]
    diagnosis = fleetrl("diagnose", str(run_dir), timeout=60)
    assert diagnosis.code == 0 and report["summary"] in diagnosis.stdout
    drawn = fleetrl("report", str(run_dir), timeout=120)
    assert drawn.code == 0 and (run_dir / "incident_timeline.png").stat().st_size > 0


def test_env_step_that_never_returns_on_a_disaggregated_env_node(tmp_path):
    result = run_fault(
        tmp_path,
        "cluster.backend=ray",
        "cluster.simulate_nodes=2",
        "cluster.num_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, env: 1}",
        fault("hang", "env", 0, 40),
    )
    assert_incident(result, "phase_timeout", ["env", 0], STALL_S)
    assert next(w for w in result.hang_report["workers"] if w["culprit"])["node"] == 1


def test_exception_in_one_worker_shows_its_traceback(tmp_path):
    result = run_fault(tmp_path, *RAY_TWO_ACTORS, fault("exception", "env", 1, 40))
    report = result.hang_report
    assert result.code == 4 and report["cause"] == "worker_exception"
    assert "InjectedFault" in report["summary"] and "env.step" in report["summary"]
    assert "Traceback" in report["detail"] and "faults.py" in report["detail"]
    assert report["culprit"] == ["env", 1]
    assert report["detected_after_s"] <= NOTICE_S + LOADED_HOST_MARGIN_S


def test_head_without_gradient_is_named_not_a_hang(tmp_path):
    result = run_fault(tmp_path, *RAY_TWO_ACTORS, "model.id=tests.fault_models:UnusedHeadNet", checkpointed=False)
    report = result.hang_report
    assert result.code == 4 and report["cause"] == "worker_exception", report["summary"]
    assert "forgotten_head" in report["summary"] + report["detail"]


def test_wrong_interface_is_peer_unreachable_in_seconds(tmp_path):
    """The process-group join fails after actor.dist_timeout_s (5 s), not Gloo's 30 minutes, and the
    failure is reported at once; the run's own start-up time is the machine's, not bounded here."""
    result = run_fault(
        tmp_path,
        *RAY_TWO_ACTORS,
        "actor.dist_timeout_s=5",
        "cluster.env_vars={GLOO_SOCKET_IFNAME: nosuchif0}",
        checkpointed=False,
    )
    report = result.hang_report
    assert result.code == 4 and report["cause"] == "peer_unreachable", report["summary"]
    assert "nosuchif0" in report["summary"] + report["detail"]
    assert report["detected_after_s"] <= NOTICE_S + LOADED_HOST_MARGIN_S, report["detected_after_s"]


def test_ctrl_c_on_ray_while_collecting_saves_and_stops_cleanly(tmp_path):
    """SIGINT (Ctrl-C) while collecting, 2 actor ranks on Ray: a checkpoint of the reached
    iteration, exit 130, every Ray process of the run gone (`Fleetrl.finish` checks). A stop in the
    middle of an update, and the resume's exactness: tests/test_stops_save.py."""
    signum, exit_code = signal.SIGINT, 130
    slow = "env.id=fleetrl.envs.slow:SlowCartPole"
    command = ["train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}", *SMALL, *RAY_TWO_ACTORS, slow]
    with Fleetrl(*command, runs=tmp_path) as running:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("*/checkpoints/ckpt_*.pt")):
            time.sleep(0.5)
        time.sleep(1.0)
        running.process.send_signal(signum)
        result = running.finish(timeout=60)
    assert result.code == exit_code, result.stderr[-3000:]
    state = load_latest(result.run_dir)
    assert state["iteration"] >= 1 and isinstance(state["actor"]["policy"], dict)
    assert all(isinstance(v, torch.Tensor) for v in state["actor"]["policy"].values())


def test_a_start_up_step_that_hangs_is_reported_as_startup_timeout(tmp_path):
    """A start-up step under a deadline (connecting to Ray) that never finishes ends the run like
    every other incident: exit 4 and a report naming what hung."""
    script = (
        "import sys, time\n"
        "from fleetrl.plan.load import load_config\n"
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

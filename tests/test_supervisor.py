"""`fleetrl train` as a supervisor (issue 10): the controller is its watched child, so a
controller frozen by a simulator holding the GIL, blocked in a checkpoint write or killed is
reported by a process it cannot freeze; stop signals are bounded by watchdog.stop_grace_s; an
incident restarts the controller from the newest intact checkpoint with runner.max_restarts."""

from __future__ import annotations

import inspect
import os
import signal
import time
from pathlib import Path

import pytest

from fleetrl.checkpoint import list_checkpoints
from fleetrl.cli import main
from tests.incidents import FROZEN_S, NOTICE_S, SMALL, assert_incident, fault, promised_detection_s
from tests.supervisor_envs import native_call_that_never_returns
from tests.support import LOADED_HOST_MARGIN_S, Fleetrl, controller_of, detection_s, train, wait_for

CONFIG = "configs/ppo_cartpole.yaml"


def start(tmp_path: Path, *overrides: str) -> Fleetrl:
    return Fleetrl("train", CONFIG, f"runner.run_dir={tmp_path}", *SMALL, *overrides, runs=tmp_path)


@pytest.mark.parametrize("freeze_in", ["init", "step"])
def test_simulator_holding_the_gil_on_the_default_backend_is_process_frozen(tmp_path, freeze_in):
    """A simulator whose native call never returns, with the GIL held, in its constructor (a
    start-up step) or at its first step: the controller stops beating and the supervisor names it
    and the simulator's file, exit 4, nothing left (`Fleetrl.finish` checks)."""
    result = train(
        CONFIG,
        *SMALL,
        "env.id=tests.supervisor_envs:NativeFreeze",
        f"env.kwargs={{freeze_in: {freeze_in}}}",
        runs=tmp_path,
        timeout=120,
    )
    assert_incident(result, "process_frozen", ["inline", 0], FROZEN_S)
    report = result.hang_report
    line = inspect.getsourcelines(native_call_that_never_returns)[1] + 1  # the ctypes call in its body
    assert f"supervisor_envs.py:{line} (native_call_that_never_returns)" in report["summary"], report["summary"]
    stack = next(w for w in report["workers"] if w["culprit"])["stack"]
    assert "env_worker.py" in stack and f"in {'__init__' if freeze_in == 'init' else 'step'}" in stack, stack


def test_blocked_checkpoint_write_in_the_controller_is_named(tmp_path):
    """The second checkpoint's file is a FIFO nobody reads (a hung network file system): its open
    blocks the controller in `checkpoint.save`, past the phase's learned deadline."""
    with start(tmp_path, "watchdog.min_deadline_s=4") as running:
        controller = wait_for(running, "the controller process", lambda: controller_of(running))
        run_dir = wait_for(running, "the run directory", lambda: next(tmp_path.iterdir(), None))
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        os.mkfifo(run_dir / "checkpoints" / f".ckpt_00000002.pt.tmp-{controller.pid}")
        result = running.finish(timeout=120)
    assert_incident(result, "phase_timeout", ["inline", 0], promised_detection_s("stall", min_deadline_s=4))
    assert "in checkpoint.save" in result.hang_report["summary"], result.hang_report["summary"]
    assert [path.name for path in list_checkpoints(result.run_dir)] == ["ckpt_00000001.pt"]


@pytest.mark.parametrize(
    ("backend", "controller_key"),
    [("inline", ["inline", 0]), ("ray", ["controller", 0])],
    ids=["inline", "ray"],
)
def test_kill_9_of_the_controller_is_worker_died_and_nothing_is_left(tmp_path, backend, controller_key):
    """SIGKILL of the controller alone. On Ray, the daemons it started are orphaned; the
    supervisor (their subreaper) ends them all too (`Fleetrl.finish` checks for any left)."""
    with start(tmp_path, f"cluster.backend={backend}") as running:
        wait_for(running, "a first checkpoint", lambda: list(tmp_path.glob("*/checkpoints/ckpt_*.pt")))
        controller = controller_of(running)
        controller.kill()
        result = running.finish(timeout=120)
    assert_incident(result, "worker_died", controller_key, NOTICE_S)
    summary = result.hang_report["summary"]
    assert f"(the controller, pid {controller.pid}) died: killed by SIGKILL" in summary
    # killed while training: its last beat is from training (beat at once when training begins),
    # not from start-up, which it had left up to a heartbeat interval before
    assert "; it was " in summary and "startup" not in summary, summary


def test_a_controller_stopped_before_its_first_heartbeat_is_process_frozen_not_a_300_s_wait(tmp_path):
    """SIGSTOP of the controller the moment it exists, while it still imports (before any
    heartbeat, when the watchdog would wait startup_allowance_s for one): the supervisor, its
    parent, sees it stopped and reports it after heartbeat_timeout_s."""
    with start(tmp_path) as running:
        controller = None
        deadline = time.monotonic() + 60
        while controller is None and time.monotonic() < deadline and running.process.poll() is None:
            controller = controller_of(running)
            time.sleep(0.01)
        assert controller is not None, running.stderr_so_far()[-3000:]
        controller.send_signal(signal.SIGSTOP)
        result = running.finish(timeout=120)
    report = result.hang_report  # (no pid in its worker entry: it never published one)
    assert result.code == 4 and (report["cause"], report["culprit"]) == ("process_frozen", ["inline", 0]), report
    assert detection_s(report) <= FROZEN_S + LOADED_HOST_MARGIN_S, report["detected_after_s"]
    assert (
        f"(the controller, pid {controller.pid}) is stopped (SIGSTOP or a debugger) before its first heartbeat"
        in (report["summary"])
    )


def test_sigint_while_the_controller_is_stuck_ends_within_the_grace_with_a_report(tmp_path):
    """Ctrl-C while the env holds the GIL at its first step (the watchdog's own bound set far
    away): the controller cannot honour it, so after watchdog.stop_grace_s the supervisor
    reports `interrupted` naming it, kills everything and exits 130."""
    overrides = ["watchdog.heartbeat_timeout_s=120", "watchdog.stop_grace_s=3", fault("gil_hang", "env", 0, 1)]
    with start(tmp_path, *overrides) as running:
        controller = wait_for(running, "the controller process", lambda: controller_of(running))
        wait_for(running, "training to start", lambda: "inline backend" in running.stderr_so_far())
        spun_from = controller.cpu_times().user
        wait_for(running, "the controller spinning in gil_hang", lambda: controller.cpu_times().user - spun_from > 1.0)
        signalled = time.monotonic()
        running.process.send_signal(signal.SIGINT)
        result = running.finish(timeout=60)
    assert result.code == 130, result.stderr[-3000:]
    assert time.monotonic() - signalled <= 3 + 10
    report = result.hang_report
    assert report["cause"] == "interrupted" and report["culprit"] == ["inline", 0], report["summary"]
    assert "did not stop within watchdog.stop_grace_s=3 s" in report["summary"]
    assert "faults.py" in next(w for w in report["workers"] if w["culprit"])["stack"]
    assert "stopped by SIGINT; there is no checkpoint (none was saved)" in result.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [("[interrupted]", "'interrupted' never restarts"), ("[worker_dyed]", "did you mean 'worker_died'?")],
)
def test_restart_on_names_the_causes_that_can_restart(capsys, value, words):
    assert main(["train", CONFIG, f"runner.restart_on={value}", "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "config error at 'runner.restart_on'" in error and words in error, error
    assert "worker_died" in error and "disk_full" not in error.split("expected", 1)[1].split(".", 1)[0]

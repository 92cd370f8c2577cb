"""Fault-injection runs shared by tests/test_freeze_proof.py and tests/test_fused_ranks.py: a
small CartPole run with `debug.fault` set, and the checks every incident must pass (exit 4, the
cause and the culprit named within the bound, the report's text and JSON agreeing, the last
checkpoint intact)."""

from __future__ import annotations

from fleetrl.checkpoint import load_latest
from fleetrl.watch.reporting.hang_report import REPORT_TEXT
from tests.support import LOADED_HOST_MARGIN_S, Finished, train

# SMALL's: a worker that stops beating is frozen or gone after this long. 4, not 3: with two test
# workers on 2 cores (pytest-xdist) an idle Ray worker's beats were seen 3 s apart, a false
# verdict; and under the collective timeout (5 s), so that a stopped rank is named frozen before
# its peer's wait for it counts as a collective miss.
HEARTBEAT_TIMEOUT_S = 4


def detection_bound(threshold_s: float = HEARTBEAT_TIMEOUT_S) -> float:
    """How late an incident may be detected: its configured threshold (by default the heartbeat
    timeout, which bounds the notice of a death or an exception) plus the loaded host's margin."""
    return threshold_s + LOADED_HOST_MARGIN_S


SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.checkpoint_interval=1",
    "runner.tensorboard=false",
    "runner.total_env_steps=1000000",
    f"watchdog.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
    "--skip-doctor",
]


def run_fault(tmp_path, *overrides: str, timeout: int = 180, checkpointed: bool = True) -> Finished:
    """Train until the injected fault; `checkpointed`: it strikes after the first checkpoint."""
    result = train("configs/ppo_cartpole.yaml", *SMALL, *overrides, runs=tmp_path, timeout=timeout)
    report = result.hang_report
    assert report is not None, result.stderr[-3000:]
    assert (result.run_dir / REPORT_TEXT).read_text().splitlines()[1] == report["summary"]
    if checkpointed:
        load_latest(result.run_dir)  # the last complete checkpoint is intact
    return result


def fault(kind: str, component: str, rank: int, call: int) -> str:
    return f"debug.fault={{kind: {kind}, component: {component}, rank: {rank}, call: {call}}}"


def assert_incident(result: Finished, cause: str, culprit: list, within_s: float) -> None:
    report = result.hang_report
    assert result.code == 4, report
    assert report["cause"] == cause, report["summary"]
    assert report["culprit"] == culprit, report["summary"]
    assert report["detected_after_s"] <= within_s, report["detected_after_s"]
    worker = next(w for w in report["workers"] if [w["component"], w["rank"]] == culprit)
    assert worker["culprit"] and worker["pid"]

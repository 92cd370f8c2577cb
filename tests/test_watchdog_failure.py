"""The watchdog cannot die quietly, and an incident's start is the fault's, not the watchdog's.

A worker publishing a heartbeat the store accepts but the watchdog's judgement cannot use (through
the real store) makes the watchdog's poll raise: that is a `watchdog_error` incident — report, teardown, exit 4 — never a
run going on unwatched. A worker's exception is timed from the moment it was raised."""

from __future__ import annotations

from tests.incidents import NOTICE_S, SMALL, assert_ended_in_time
from tests.support import LOADED_HOST_MARGIN_S, train


def test_a_failing_watchdog_is_an_incident_and_ends_the_run(tmp_path):
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        "env.id=tests.watchdog_envs:CorruptingHeartbeat",
        "env.kwargs={after_steps: 30}",
        runs=tmp_path / "runs",
        timeout=180,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert report["cause"] == "watchdog_error", report["summary"]
    assert report["summary"].startswith(
        "the watchdog (thread fleetrl-watchdog of the controller) raised AttributeError: 'list' object has no attribute 'get'"
    )
    assert "check_deadlines" in report["detail"]  # its traceback
    readable = {(w["component"], w["rank"]) for w in report["workers"] if w["pid"] is not None}
    assert readable == {("inline", 0)}  # the record the judgement could not use is still in the report
    # from the poll that raised to the report: noticed at once, as a worker's exception is
    assert report["detected_after_s"] <= NOTICE_S + LOADED_HOST_MARGIN_S, report["detected_after_s"]
    assert_ended_in_time(result)


def test_a_worker_exception_is_timed_from_its_raise(tmp_path):
    raised_at_file = tmp_path / "raised_at"
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        "env.id=tests.watchdog_envs:RaisingLate",
        f"env.kwargs={{raised_at_file: {raised_at_file}, after_steps: 30, sleep_s: 1.0}}",
        runs=tmp_path / "runs",
        timeout=120,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert report["cause"] == "worker_exception", report["summary"]
    raised_at = float(raised_at_file.read_text())
    # the incident starts at the raise (stamped by the worker), not when the controller classified
    # it; the margins are for a loaded CI host
    assert raised_at <= report["incident_started"] < raised_at + LOADED_HOST_MARGIN_S
    assert report["detected_after_s"] <= NOTICE_S + LOADED_HOST_MARGIN_S, report["detected_after_s"]
    assert_ended_in_time(result)

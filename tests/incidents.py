"""Fault-injection runs and the checks every incident must pass: exit 4, the cause and the culprit
named, detected within the documented figure, every process of the run gone within the teardown
promise, the report's text and JSON agreeing, the last checkpoint intact.

The bounds are the promises of docs/concepts/incidents.md ("How fast"), each plus the loaded host's
one margin (tests/support.py `LOADED_HOST_MARGIN_S`), never a figure measured on a quiet host:

- detection (`detected_after_s`, from the fault's first sign to the report's `reported_at`):
  `promised_detection_s` — a death or an exception within `NOTICE_S`; a frozen process within the
  heartbeat timeout and `NOTICE_S`; a stall within its deadline (a start-up step's allowance, the
  first-call bound, or a learned deadline: `min_deadline_s`, the collective timeout) and the
  window of beats it is judged from;
- the end: every process of the run gone within `TEARDOWN_PROMISE_S` of the detection, as the test
  saw its processes end (`Finished.gone_at`), and as the report records it (`ended_at`).
"""

from __future__ import annotations

from fleetrl.checkpoint import load_latest
from fleetrl.config.schema import WatchdogConfig
from fleetrl.watch.reporting.hang_report import REPORT_TEXT
from tests.support import LOADED_HOST_MARGIN_S, TEARDOWN_BOUND_S, Finished, detection_s, train

# SMALL's: a worker that stops beating is frozen or gone after this long. 4, not 3: with two test
# workers on 2 cores (pytest-xdist) an idle Ray worker's beats were seen 3 s apart, a false
# verdict; and under the collective timeout (5 s), so that a stopped rank is named frozen before
# its peer's wait for it counts as a collective miss.
HEARTBEAT_TIMEOUT_S = 4
# A death or an exception is noticed at the watchdog's next poll (0.25 s), or when Ray tells the
# controller that an actor died; the docs promise 0.5-1 s.
NOTICE_S = 1.0
DETECTIONS = ("death", "exception", "frozen", "startup_step", "first_call", "stall", "busy")


def judging_window_s(config: WatchdogConfig) -> float:
    """The last beats a call past its deadline is judged from (blocked, spinning or busy)."""
    return max(2.0, 4 * config.heartbeat_interval_s)


def promised_detection_s(detection: str, **watchdog: float) -> float:
    """The documented detection figure for an incident of kind `detection` (DETECTIONS), with the
    watchdog's defaults changed by `watchdog` (`heartbeat_timeout_s=4`, ...):

    - death, exception: noticed within `NOTICE_S`;
    - frozen (stopped, the GIL held, a lost node): the heartbeat timeout and `NOTICE_S`;
    - startup_step (a declared start-up step: construction, spaces, first reset, the join),
      first_call (a call never seen finishing), stall (a call past its learned deadline, or ranks
      waiting in a collective another rank never entered): that deadline — the start-up step
      allowance, the first-call bound, `min_deadline_s` or the collective timeout — and the window
      of beats a blocked call is judged from;
    - busy (a call that computes past its deadline): the busy allowance and that window (on a
      detection less the time its thread waited for a CPU: tests/support.py `detection_s`)."""
    config = WatchdogConfig(**watchdog)
    deadline = {
        "death": None,
        "exception": None,
        "frozen": None,
        "startup_step": config.startup_step_allowance_s,
        "first_call": config.first_call_bound_s,
        "stall": max(config.min_deadline_s, config.collective_timeout_s),
        "busy": config.busy_allowance_s,
    }
    assert detection in deadline, f"{detection!r}: not one of {DETECTIONS}"
    if detection in ("death", "exception"):
        return NOTICE_S
    if detection == "frozen":
        return config.heartbeat_timeout_s + NOTICE_S
    return deadline[detection] + judging_window_s(config)


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
# The figures for runs with SMALL's watchdog
FROZEN_S = promised_detection_s("frozen", heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
STALL_S = promised_detection_s("stall")


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


def assert_incident(result: Finished, cause: str, culprit: list, promised_s: float, code: int = 4) -> None:
    """`result` is an incident of `cause` naming `culprit`, detected within `promised_s` (the
    documented figure: `promised_detection_s`) and the loaded host's margin, its processes all
    gone within the teardown promise; exit `code`."""
    report = result.hang_report
    assert result.code == code, (result.code, report, result.stderr[-3000:])
    assert report["cause"] == cause, report["summary"]
    assert report["culprit"] == culprit, report["summary"]
    assert 0 <= detection_s(report) <= promised_s + LOADED_HOST_MARGIN_S, (
        report["detected_after_s"],
        report["watcher_absent_s"],
        promised_s,
        report["summary"],
    )
    worker = next(w for w in report["workers"] if [w["component"], w["rank"]] == culprit)
    assert worker["culprit"] and worker["pid"], worker
    assert_ended_in_time(result)


def assert_ended_in_time(result: Finished) -> None:
    """Every process of the incident's run ended within the teardown promise of its detection: as
    the test saw them end (`gone_at`, its own account of the processes), and as the report says
    (`ended_at`, once the teardown was over)."""
    report = result.hang_report
    assert result.gone_at is not None, "the run's processes were not seen to end"
    assert result.gone_at - report["reported_at"] <= TEARDOWN_BOUND_S, (
        f"the last process of the run ended {result.gone_at - report['reported_at']:.1f} s after the detection",
        report["summary"],
    )
    assert report["reported_at"] <= report["ended_at"] <= result.ended_at, report

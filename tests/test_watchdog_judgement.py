"""The watchdog's judgement: a call that is blocked is an incident in seconds, even the first one;
a call that is busy is a "slow" warning, not an incident; a hang in a worker's start-up is a
`startup_timeout` naming the step; a worker whose clock is off by ±30 s is neither frozen by
mistake nor missed when it really freezes, and a controller and workers whose clocks are 30 s off
give no false stall and a true detection time; a call that waits by polling (CPU moving, its stack
not) is *spinning*, a stall. Faults are real (a sleeping call, a spinning one, a
hanging constructor inside a Ray worker, SIGSTOP), through the real heartbeat store."""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from functools import partial

import psutil
import pytest

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import HeartbeatStore
from fleetrl.supervise.attempt import RUN_MARK
from fleetrl.watch.judging.judgement import Seen
from fleetrl.watch.watchdog import Watchdog
from tests.incidents import NOTICE_S, SMALL, assert_incident, fault, promised_detection_s, run_fault
from tests.support import LOADED_HOST_MARGIN_S, REPO, TWO_ACTOR_RANKS_ON_RAY, subprocess_env, train

RAY_TWO_ENV_RANKS = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, env: 0-1, rollout: 0}",
]


def test_a_first_call_that_blocks_inline_is_reported_blocked_within_30_s_by_default(tmp_path):
    result = run_fault(tmp_path, fault("hang", "env", 0, 1), checkpointed=False)
    assert_incident(result, "phase_timeout", ["inline", 0], promised_detection_s("first_call"))
    report = result.hang_report
    assert report["state"] == "blocked", report["summary"]
    assert "env.step" in report["summary"] and "never finished before" in report["summary"]
    assert "is blocked: its stack did not move" in report["summary"]


def test_a_first_call_that_blocks_on_ray_names_the_env_rank(tmp_path):
    result = run_fault(
        tmp_path, *RAY_TWO_ENV_RANKS, "watchdog.first_call_bound_s=5", fault("hang", "env", 1, 1), checkpointed=False
    )
    assert_incident(result, "phase_timeout", ["env", 1], promised_detection_s("first_call", first_call_bound_s=5))
    assert result.hang_report["state"] == "blocked", result.hang_report["summary"]
    culprit = next(w for w in result.hang_report["workers"] if w["culprit"])
    assert "inject_before" in culprit["stack"]


def test_an_env_constructor_that_hangs_in_a_ray_worker_is_a_startup_timeout(tmp_path):
    result = run_fault(
        tmp_path,
        "cluster.backend=ray",
        "env.id=tests.watchdog_envs:HangingConstructor",
        # the controller's own start-up steps (starting Ray, ~5 s here) get this allowance too:
        # room for them on a loaded host, so the hanging constructor is the only step past it
        "watchdog.startup_step_allowance_s=15",
        checkpointed=False,
    )
    assert_incident(
        result, "startup_timeout", ["env", 0], promised_detection_s("startup_step", startup_step_allowance_s=15)
    )
    report = result.hang_report
    assert report["state"] == "blocked" and "env.construct" in report["summary"], report["summary"]
    assert "its main thread is at watchdog_envs.py" in report["summary"]  # the constructor that sleeps
    culprit = next(w for w in report["workers"] if w["culprit"])
    assert "watchdog_envs.py" in culprit["stack"] and "__init__" in culprit["stack"]


def computing_run(tmp_path, busy_s: float, *overrides: str, where: str = "at_step: 1", timeout: float = 120):
    """A short run whose env computes for `busy_s` CPU seconds, reading the process CPU clock as
    it goes, once per process `where` (watchdog_envs.Computing's kwargs)."""
    return train(
        "configs/ppo_cartpole.yaml",
        *[o for o in SMALL if not o.startswith("runner.total_env_steps")],  # a run that finishes
        "runner.total_env_steps=128",
        "env.id=tests.watchdog_envs:Computing",
        f"env.kwargs={{busy_s: {busy_s}, {where}}}",
        *overrides,
        runs=tmp_path,
        timeout=3 * busy_s + timeout,
    )


def assert_slow_not_stalled(result, who: str = "inline rank 0", phase: str = "env.step") -> None:
    result.succeeded()
    slow = [line for line in result.stderr.splitlines() if f"slow: {who} has been in {phase}" in line]
    assert len(slow) == 1, result.stderr[-3000:]  # one warning for the call, not one per poll
    assert "but is busy" in slow[0] and "CPU in its thread" in slow[0]


def test_a_busy_first_call_is_a_slow_warning_and_an_incident_only_past_the_busy_allowance(tmp_path):
    """The mechanism with short bounds: 8 s of computing in the first env step, a 2 s first-call
    bound. With the busy allowance above 8 s the run finishes, warned once; below, it is a
    `phase_timeout` in state busy."""
    assert_slow_not_stalled(computing_run(tmp_path / "allowed", 8, "watchdog.first_call_bound_s=2"))
    result = computing_run(tmp_path / "overrun", 30, "watchdog.first_call_bound_s=2", "watchdog.busy_allowance_s=5")
    assert_incident(result, "phase_timeout", ["inline", 0], promised_detection_s("busy", busy_allowance_s=5))
    assert result.hang_report["state"] == "busy", result.hang_report["summary"]
    assert "watchdog.busy_allowance_s" in result.hang_report["summary"]


def test_a_step_that_computes_past_its_learned_deadline_finishes(tmp_path):
    """The 60 s simulator step, shortened: the 20th step computes for 6 s against a deadline
    learned from 19 quick ones (clamped to watchdog.min_deadline_s, 2 s): busy, so a warning."""
    result = computing_run(tmp_path, 6, "watchdog.min_deadline_s=2", where="at_step: 20").succeeded()
    # the computing call warned (as busy); on a loaded host an ordinary step may pass 2 s too
    slow = [line for line in result.stderr.splitlines() if "slow: inline rank 0 has been in env.step" in line]
    assert slow and all("but is busy" in line for line in slow), result.stderr[-3000:]


@pytest.mark.parametrize(
    ("placement", "who", "allowance_s", "busy_s"),
    [
        ((), "inline rank 0", 4, 10),
        # the controller's own start-up steps (starting Ray: ~5 s here, 15 s loaded) get the allowance too
        pytest.param(("cluster.backend=ray",), "env rank 0", 30, 40, marks=pytest.mark.slow),
    ],
    ids=["inline", "ray"],
)
def test_a_constructor_that_computes_past_the_startup_step_allowance_finishes(
    tmp_path, placement, who, allowance_s, busy_s
):
    """The 90 s scene load, shortened: the env's constructor computes past
    watchdog.startup_step_allowance_s; a start-up step is judged by the same rule as any call."""
    result = computing_run(
        tmp_path,
        busy_s,
        *placement,
        f"watchdog.startup_step_allowance_s={allowance_s}",
        where="in_constructor: true",
    )
    assert_slow_not_stalled(result, who, "env.construct")


def test_a_first_reset_that_computes_past_the_first_call_bound_finishes(tmp_path):
    """The scene loaded on the first reset rather than in the constructor, shortened: 8 s of
    computing in the env's first reset (inline: the `env.reset` start-up step, whose bound is the
    start-up step allowance) against a 2 s bound."""
    bounds = ("watchdog.first_call_bound_s=2", "watchdog.startup_step_allowance_s=2")
    result = computing_run(tmp_path, 8, *bounds, where="in_reset: true")
    assert_slow_not_stalled(result, phase="env.reset")


@pytest.mark.slow
def test_a_first_call_that_computes_for_60_s_is_no_incident_with_default_settings(tmp_path):
    assert_slow_not_stalled(computing_run(tmp_path, 60))


SKEWED_WORKER = """
import sys, time
skew = float(sys.argv[2])
real_time = time.time
time.time = lambda: real_time() + skew  # this process's clock is off by `skew` seconds
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import connect_publisher
recorder = Recorder("env", 0, 1)
recorder.start_publishing(connect_publisher("127.0.0.1", int(sys.argv[1]), "env", 0, run_secret()), 0.2)
while True:
    with recorder.in_phase("env.step"):
        time.sleep(0.02)
"""


@pytest.mark.parametrize("skew_s", [30.0, -30.0])
def test_a_worker_with_a_skewed_clock_is_not_frozen_by_mistake_and_its_freeze_is_seen(skew_s):
    """The worker's heartbeats carry its own clock, 30 s ahead or behind; ages measured by
    subtracting clocks would call it frozen at once (behind) or never (ahead)."""
    config = WatchdogConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0, min_deadline_s=2.0)
    store = HeartbeatStore("127.0.0.1", run_secret())
    incidents: queue.Queue = queue.Queue()
    worker = subprocess.Popen(
        [sys.executable, "-c", SKEWED_WORKER, str(store.port), str(skew_s)], cwd=REPO, env=subprocess_env()
    )
    watchdog = Watchdog(config, store.read, [("env", 0)], incidents.put)
    try:
        deadline = time.monotonic() + 60
        while not store.read([("env", 0)]) and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.1)
        assert store.read([("env", 0)]), "the worker never published"
        watchdog.start()
        with pytest.raises(queue.Empty):  # a live worker: no incident over 3 heartbeat timeouts
            incidents.get(timeout=3 * config.heartbeat_timeout_s)
        worker.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        incident = incidents.get(timeout=30)
        assert time.time() - stopped_at < config.heartbeat_timeout_s + 8  # the bound, with a loaded host's margin
        assert incident.cause == "process_frozen", incident.summary
        assert incident.culprit == ("env", 0) and "stopped (SIGSTOP" in incident.summary
        # started at the last beat seen, on the watcher's clock, not 30 s off
        assert stopped_at - 2 < incident.started <= stopped_at + 1
    finally:
        watchdog.stop()
        worker.kill()
        worker.wait(timeout=30)


@pytest.mark.parametrize(
    ("poll", "wait"),
    [
        ("select", ("select.select",)),
        pytest.param("yield", ("os.sched_yield",), marks=pytest.mark.slow),  # the same rule again
        pytest.param(
            "sleep", ("clock_nanosleep", "time.sleep"), marks=pytest.mark.slow
        ),  # the kernel's or Python's view
        pytest.param("socket", ("socket.recv",), marks=pytest.mark.slow),
    ],
)
def test_a_first_call_that_spins_waiting_is_reported_spinning_not_busy(tmp_path, poll, wait):
    """The first env step waits forever by polling (a zero-timeout `select`, `sched_yield` or
    `time.sleep(0)` in a loop, or a non-blocking socket read): CPU moves, the stack does not.
    Busy would wait for busy_allowance_s (600 s); spinning is a stall, reported once the
    first-call bound has passed, naming the wait."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        "env.id=tests.watchdog_envs:SpinningFirstStep",
        f"env.kwargs={{poll: {poll}}}",
        "watchdog.first_call_bound_s=2",
        runs=tmp_path,
        timeout=120,
    )
    assert_incident(result, "phase_timeout", ["inline", 0], promised_detection_s("first_call", first_call_bound_s=2))
    report = result.hang_report
    assert report["state"] == "spinning", report["summary"]
    assert "is spinning: its stack did not move" in report["summary"] and "watchdog_envs.py" in report["summary"]
    assert any(f"was found waiting in {name} in " in report["summary"] for name in wait), report["summary"]


def clock_off_under_the_supervisor(folder, skew_s: float) -> dict:
    """An environment whose Python processes under the supervisor — the controller and every
    worker, which carry its mark — read a wall clock `skew_s` off; the supervisor (the watcher)
    reads the true one. Only time.time and time.time_ns move, as on a machine whose clock is off."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import os, time\n"
        f"if '{RUN_MARK}' in os.environ:\n"
        f"    _skew_s, _time, _time_ns = {float(skew_s)!r}, time.time, time.time_ns\n"
        "    time.time = lambda: _time() + _skew_s\n"
        "    time.time_ns = lambda: _time_ns() + int(_skew_s * 1e9)\n"
    )
    return {"PYTHONPATH": f"{folder}:{subprocess_env()['PYTHONPATH']}"}


@pytest.mark.parametrize(
    ("skew_s", "placement"),
    [
        (30.0, ()),
        pytest.param(-30.0, TWO_ACTOR_RANKS_ON_RAY, marks=pytest.mark.slow),  # ~45 s: a Ray cluster's start-up
    ],
    ids=["inline-ahead", "ray-behind"],
)
def test_workers_with_a_skewed_clock_give_no_false_stall_and_a_true_detection_time(tmp_path, skew_s, placement):
    """The controller and its workers 30 s off the supervisor's clock, training until env rank 0
    raises on its 40th step. Inline, 30 s ahead: the exception's time, on the raiser's clock, would
    put the fault in the future. On Ray, 30 s behind with 2 DDP ranks: every collective a rank is
    in would look 30 s old (a stall whenever its peer is a moment behind), and the exception 30 s
    old when reported."""
    env = clock_off_under_the_supervisor(tmp_path / "clock", skew_s)
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *placement,
        fault("exception", "env", 0, 40),
        runs=tmp_path / "runs",
        timeout=240,
        env=env,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("worker_exception", ["env", 0]), report["summary"]
    assert "InjectedFault in env.step" in report["summary"]
    # not 30 s off
    assert 0 <= report["detected_after_s"] <= NOTICE_S + LOADED_HOST_MARGIN_S, report["detected_after_s"]


def judged(recorder: Recorder, work, stop, reads: tuple[dict, ...] = ({},), beats: int = 8) -> list:
    """`work()` as a call in a thread of this process until `stop()`; its recorder's beats, 0.4 s
    apart, judged as the watchdog judges them: once per entry of `reads`, added to every beat (a
    GPU's reads, as a worker computing on one publishes them). The window holds every beat, however
    long they took: a loop that holds the GIL (allocating 100 MB at a time) slows this thread's
    beats on a loaded host, and a window of 0.5 s per beat then held fewer than the judgement's
    MIN_SAMPLES (it judged nothing, a CI failure)."""
    seen = [Seen() for _ in reads]
    started = time.monotonic()

    def call() -> None:
        with recorder.in_phase(f"{recorder.identity['component']}.call"):
            work()

    thread = threading.Thread(target=call, name="judged-call")
    thread.start()
    try:
        for _ in range(beats):
            time.sleep(0.35)
            recorder.sample_waits(0.0)  # as the heartbeat thread does before each beat (~0.05 s)
            record, now = recorder.record(), time.monotonic()
            for judge, read in zip(seen, reads):
                judge.update({**record, **read}, now)
        now = time.monotonic()
        return [judge.judge(now, window_s=now - started + 1.0) for judge in seen]
    finally:
        stop()
        thread.join(30)


def spin_sleeping(flag: list) -> None:
    while not flag[0]: time.sleep(0)  # noqa: E701 (one line: the stack stays there)  # fmt: skip


def allocating(flag: list) -> None:
    while not flag[0]: bytearray(10**8)  # noqa: E701 (one line: the stack stays there)  # fmt: skip


def computing(flag: list) -> None:
    while not flag[0]: sum(range(10_000))  # noqa: E701 (one line: the stack stays there)  # fmt: skip


def selecting(flag: list) -> None:
    while not flag[0]: select.select([], [], [], 0)  # noqa: E701 (one line: the stack stays there)  # fmt: skip


def yielding(flag: list) -> None:
    while not flag[0]: os.sched_yield()  # noqa: E701 (one line: the stack stays there)  # fmt: skip


def reading_the_cpu_clock(flag: list) -> None:
    while not flag[0]: time.process_time()  # noqa: E701 (one line: the stack stays there)  # fmt: skip


@pytest.mark.parametrize(
    ("loop", "state", "wait"),
    [
        (spin_sleeping, "spinning", ("clock_nanosleep", "time.sleep")),
        (selecting, "spinning", ("select.select",)),
        (yielding, "spinning", ("os.sched_yield",)),
        (allocating, "busy", None),
        (computing, "busy", None),
        (reading_the_cpu_clock, "busy", None),
    ],
    ids=["sleep(0)", "select-0", "sched_yield", "allocating", "computing", "process_time"],
)
def test_a_loop_at_one_line_is_spinning_only_when_it_waits(loop, state, wait):
    """Real loops in a thread of this process, its recorder's beats judged as the watchdog judges
    them: all use CPU at one line, most of them mostly in the kernel. time.sleep(0), a zero-timeout
    select and sched_yield are waits (spinning, the wait named); allocating 100 MB at a time,
    sum, and reading the process CPU clock in a loop (clock_gettime, a real system call) compute
    (busy)."""
    flag = [False]
    (judgement,) = judged(Recorder("env", 0, 0), partial(loop, flag), partial(flag.__setitem__, 0, True))
    assert judgement is not None and not judgement.stack_moved, judgement
    assert judgement.state == state, judgement.text()
    assert wait is None or judgement.waits[2] in wait, judgement.text()


GPU_READ = {"gpu_util_pct": 90.0, "gpu_memory_mib": 512.0}  # what a worker computing on a GPU publishes


def test_a_call_waiting_on_a_busy_gpu_is_busy_but_not_in_a_collective():
    """Without a GPU (this machine) a worker's beats read none, and a call waiting on an event is
    blocked. The same call with its GPU 90 % utilised is busy: it waits on its kernels. In a
    collective, that utilisation is an NCCL kernel spinning for a peer that never comes: blocked."""
    import torch

    recorder = Recorder("actor", 0, 0)
    assert torch.cuda.is_available() or not {"gpu_util_pct", "gpu_memory_mib"} & set(recorder.record())
    release = threading.Event()
    plain, on_gpu = judged(recorder, release.wait, release.set, ({}, GPU_READ), beats=5)
    assert (plain.state, plain.gpu_util_pct) == ("blocked", None) and "GPU" not in plain.text(), plain
    assert (on_gpu.state, on_gpu.stack_moved, on_gpu.thread_cpu < 0.05) == ("busy", False, True), on_gpu
    assert "its GPU 90 % utilised" in on_gpu.text()

    def in_collective() -> None:
        with recorder.in_collective("all_reduce", (torch.zeros(2),)):
            release.wait()

    release = threading.Event()
    (waiting,) = judged(recorder, in_collective, release.set, (GPU_READ,), beats=5)
    assert (waiting.state, waiting.gpu_util_pct) == ("blocked", None), waiting


def test_a_stopped_worker_is_named_though_another_went_silent_a_moment_before_it():
    """Fault matrix cell sigstop/rollout/startup/nodes: the rollout was stopped, and every other
    worker's beats stopped with it (Ray's global garbage collection on a loaded host), env rank 0's
    half a second earlier — the first silent worker is not the one to name, the stopped one is.
    Two real processes: one only silent (alive, running), one stopped by SIGSTOP."""
    config = WatchdogConfig()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    silent, stopped = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    try:
        stopped.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while psutil.Process(stopped.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        watchdog = Watchdog(config, None, [], None)
        beat = {"host": watchdog.hostname, "phase": None}
        records = {
            ("env", 0): {**beat, "pid": silent.pid, "heartbeat_age_s": config.heartbeat_timeout_s + 0.2},
            ("rollout", 0): {**beat, "pid": stopped.pid, "heartbeat_age_s": config.heartbeat_timeout_s - 0.3},
        }
        now = time.time()
        incident = watchdog.check_beating(records, now)
        assert (incident.cause, incident.culprit) == ("process_frozen", ("rollout", 0)), incident.summary
        assert "stopped (SIGSTOP" in incident.summary
        assert incident.started == now - records[("rollout", 0)]["heartbeat_age_s"]  # its own last beat
        # with no stopped process among the silent, the first silent worker is named, as before
        del records[("rollout", 0)]
        assert watchdog.check_beating(records, now).culprit == ("env", 0)
    finally:
        for process in (silent, stopped):
            process.kill()
            process.wait(timeout=30)

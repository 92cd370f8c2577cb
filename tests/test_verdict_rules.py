"""The watchdog's checks over one poll's records (watch/judging/verdict.py), rule by rule and at each
rule's threshold: the start-up allowance, a silent worker (stopped, gone, elsewhere, starved,
rejected records), a dead one's last words, the join's patience, the learned deadlines and what a call past its
deadline is (blocked: an incident, a start-up step's `startup_timeout`; busy: one warning, an incident past the busy
allowance), the checks' precedence, and the watcher's own absence.

The records are real flight-recorder records with the fields the checks read set to chosen values
(ages as the watcher measures them, `phase_max_s`), and the processes they name are real: this
test process (alive, running), a child stopped with SIGSTOP, one that has exited; the watcher's
samples of a silent process's threads are chosen states as /proc gives them. Exact on any
host, and fast: the mutation run's tests for the checks (benchmarks/diagnosis/mutation.sh)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import cache

import psutil
import pytest

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import Recorder, machine_identity
from fleetrl.watch.judging.judgement import Seen
from fleetrl.watch.judging.starved_process import Silence
from fleetrl.watch.judging.verdict import STARTUP_STEPS, Checks, startup_step

CONFIG = WatchdogConfig()  # heartbeat 5 s, deadlines x10 in [5, 1800] s, first call 15 s, start-up step 60 s
ENV, ACTOR = ("env", 0), ("actor", 1)


@cache
def published() -> dict:
    recorder = Recorder("env", 0, 0)
    recorder.enter_phase("env.step")
    return recorder.record()


def record(pid: int | None = None, heartbeat_age_s=0.2, phase="env.step", phase_age_s=0.1, **fields) -> dict:
    """A record of a worker on this machine (this process, unless `pid`), as `observe` leaves it."""
    values = {"pid": pid or os.getpid(), "host": socket.gethostname(), "node": 0, "phase": phase}
    values |= {"heartbeat_age_s": heartbeat_age_s, "phase_age_s": phase_age_s, "phase_started": 50.0}
    return {**published(), **values, **fields}


def checks(workers=(ENV, ACTOR), **config) -> Checks:
    return Checks(WatchdogConfig(**config), list(workers))


def beats(checks: Checks, key, thread_s: list[float], stack: int = 7, first: dict | None = None, **fields) -> None:
    """The watcher has seen `key` beat every half second until now (inside the 2 s it judges a
    call from), its call's thread having used `thread_s` CPU seconds at each (the same stack
    throughout, no data moved), with `fields` in every beat; `first`: the fields of the call's
    first beat, seen minutes before these."""
    seen, now = Seen(), time.monotonic()
    if first is not None:
        seen.update({**published(), "time": 0.0, "beat": 0, "phase_started": 50.0, **first}, now=now - 600)
    for number, cpu in enumerate(thread_s, 1):
        at = now - 0.5 * (len(thread_s) - number)
        beat = {**published(), "time": 100.0 + 0.5 * number, "beat": number, "phase_started": 50.0}
        beat |= {"thread_cpu_s": cpu, "cpu_s": cpu, "stack_signature": stack, "thread_io_bytes": 4096}
        beat |= {"thread_samples": 0, "thread_waits": 0, "thread_wait": None, **fields}
        seen.update(beat, now=at)
    checks.seen[key] = seen


BLOCKED = [0.0, 0.0, 0.0, 0.0]  # no CPU over the judged window
BUSY = [0.0, 0.25, 0.5, 0.75]  # half a core


@pytest.fixture
def stopped_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    child.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield child.pid
    child.kill()
    child.wait()


@pytest.fixture
def gone_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ------------------------------------------------------------------------------ start-up


def test_a_worker_without_a_heartbeat_is_a_startup_timeout_only_past_the_allowance():
    watching = checks()
    records = {ENV: record()}
    assert watching.check_started(records, watching.started + CONFIG.startup_allowance_s - 1) is None
    assert watching.check_started({ENV: record(), ACTOR: record()}, watching.started + 1e6) is None
    watching.started = 1000.0  # exactly at the allowance: late
    assert watching.check_started(records, 1000.0 + CONFIG.startup_allowance_s).culprit == ACTOR
    late = watching.started + CONFIG.startup_allowance_s + 1
    incident = watching.check_started(records, late)
    assert (incident.cause, incident.culprit, incident.started) == ("startup_timeout", ACTOR, watching.started)
    assert (
        incident.summary == "actor rank 1 never started: no heartbeat 301 s after launch (watchdog.startup_allowance_s)"
    )


# ------------------------------------------------------------------------------ silence


def test_a_worker_silent_for_the_heartbeat_timeout_is_frozen_not_a_moment_before():
    watching = checks()
    assert watching.check_beating({ENV: record(heartbeat_age_s=CONFIG.heartbeat_timeout_s)}, 1000.0) is None
    incident = watching.check_beating({ENV: record(heartbeat_age_s=6.5)}, 1000.0)
    assert (incident.cause, incident.culprit, incident.started) == ("process_frozen", ENV, 993.5)
    assert incident.summary.startswith(f"env rank 0 (pid {os.getpid()}) stopped publishing heartbeats 6.5 s ago: ")
    assert "the process is alive but its Python threads do not run (the GIL is held by a C call)" in incident.summary
    assert incident.summary.endswith("; last seen in env.step for 0.1 s")


def test_the_stopped_process_among_the_silent_is_named_whichever_fell_silent_first(stopped_child):
    watching = checks()
    records = {ENV: record(heartbeat_age_s=7.0), ACTOR: record(stopped_child, heartbeat_age_s=5.5)}
    incident = watching.check_beating(records, 1000.0)
    assert incident.culprit == ACTOR and incident.started == 994.5, incident.summary
    assert "stopped publishing heartbeats 5.5 s ago: the process is stopped (SIGSTOP or a debugger)" in incident.summary
    # one that only missed two beats is not silent: the first silent one is named
    records[ACTOR]["heartbeat_age_s"] = 2 * CONFIG.heartbeat_interval_s
    assert watching.check_beating(records, 1000.0).culprit == ENV
    records[ACTOR]["heartbeat_age_s"] = 2.5 * CONFIG.heartbeat_interval_s  # past two beats: silent
    assert watching.check_beating(records, 1000.0).culprit == ACTOR
    # silent only for as long as the watcher was there to see it: 0.5 s, the rest it was away
    records[ACTOR] |= {"heartbeat_age_s": 5.5, "silence_s": 0.5}
    assert watching.check_beating(records, 1000.0).culprit == ENV


def test_silent_workers_on_a_node_whose_ray_no_longer_answers_are_that_node_s_loss():
    """Node 1's raylet refuses connections (a socket bound, not listening: as a dead node's
    does): its silent workers are one `node_lost`, named by its first worker, begun at the silent
    one's last beat; node 0's answers (listening)."""
    with socket.socket() as alive, socket.socket() as gone:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        gone.bind(("127.0.0.1", 0))
        answers, refuses = (f"127.0.0.1:{s.getsockname()[1]}" for s in (alive, gone))
        on_node_1 = {"host": "sim-host-1", "node": 1, "raylet": refuses}
        records = {
            ACTOR: record(raylet=answers),
            ("env", 1): record(heartbeat_age_s=0.5, **on_node_1),
            ENV: record(heartbeat_age_s=12.0, time=988.0, **on_node_1),  # its last beat, on its clock
        }
        incident = checks(workers=(ENV, ("env", 1), ACTOR)).check_beating(records, 1000.0)
    assert (incident.cause, incident.culprit, incident.started) == ("node_lost", ENV, 988.0)
    assert incident.summary == (
        f"node 1 (sim-host-1) is lost: its Ray node manager at {refuses} does not answer, and its workers "
        "(env rank 0, env rank 1) stopped 12.0 s ago"
    )


def test_how_a_silent_process_is_described(stopped_child, gone_pid):
    watching = checks()
    assert watching.process_state(record(gone_pid), stopped=False) == "the process is gone"
    assert (
        watching.process_state(record(stopped_child), stopped=True) == "the process is stopped (SIGSTOP or a debugger)"
    )
    elsewhere = record(host="another-machine")
    assert watching.process_state(elsewhere, stopped=False) == "it is on another machine (no local process check)"
    starved = watching.process_state(record(), stopped=False, starved=(0.97, 4.0))
    assert starved == (
        "the process is alive but starved of CPU: a thread of it waited for a CPU 97% of the last 4.0 s "
        "(the host's other load)"
    )
    assert not watching.stopped(elsewhere) and not watching.stopped(record(gone_pid))
    assert watching.starved(elsewhere) is None and watching.starved(record()) is None


def test_a_worker_whose_records_are_rejected_but_arrive_is_not_frozen_until_the_busy_allowance():
    watching = checks()
    rejected = {"records": 3, "reason": "phase is not a string", "for_s": 30.0, "last_s": 1.0}
    records = {ENV: record(heartbeat_age_s=20.0, rejected=rejected)}
    assert watching.check_beating(records, 1000.0) is None
    # passed over, not the end of the check: a silent worker after it is judged
    frozen = watching.check_beating({**records, ACTOR: record(heartbeat_age_s=6.5)}, 1000.0)
    assert (frozen.cause, frozen.culprit) == ("process_frozen", ACTOR)
    records[ENV]["rejected"] = {**rejected, "for_s": CONFIG.busy_allowance_s + 1}
    incident = watching.check_beating(records, 1000.0)
    assert (incident.cause, incident.culprit, incident.started) == ("watchdog_error", ENV, 1000.0 - 601.0)
    records[ENV]["rejected"] = {**rejected, "last_s": CONFIG.heartbeat_timeout_s + 1}  # they stopped arriving too
    incident = watching.check_beating(records, 1000.0)
    assert incident.cause == "process_frozen" and "before it went silent, its heartbeat records are rejected" in (
        incident.summary
    )


def test_a_dead_worker_on_this_machine_is_worker_died_timed_from_its_last_beat(gone_pid):
    watching = checks()
    assert watching.check_alive({ENV: record(), ACTOR: record(host="another-machine", pid=gone_pid)}, 1000.0) is None
    incident = watching.check_alive({ENV: record(), ACTOR: record(gone_pid, heartbeat_age_s=1.5)}, 1000.0)
    assert (incident.cause, incident.culprit, incident.started) == ("worker_died", ACTOR, 998.5)


def test_a_dead_worker_s_last_words_are_read_from_its_ray_log_on_this_machine(tmp_path, gone_pid):
    """Its heartbeat names its Ray worker log (watch/judging/last_words.py from_record): how it ended is read there."""
    log = tmp_path / f"worker-{'ab' * 14}-{'01' * 4}-{gone_pid}.err"
    log.write_text("step 40\n*** SIGSEGV received at time=1765000000 on cpu 1 ***\n")
    dead = record(gone_pid, heartbeat_age_s=1.5, stderr=str(log), machine=machine_identity())
    incident = checks().check_alive({ACTOR: dead}, 1000.0)
    assert (incident.cause, incident.culprit, incident.started) == ("worker_died", ACTOR, 998.5)
    assert incident.last_words["ended"] == "killed by SIGSEGV" and incident.last_words["stderr_path"] == str(log)
    node = f"node 0 ({socket.gethostname()})"
    assert (
        incident.summary
        == f"actor rank 1 (pid {gone_pid}, {node}) died: killed by SIGSEGV; it was in env.step for 0.1 s"
    )


def test_a_dead_worker_was_in_the_call_the_controller_waits_on_unless_its_own_later_beat_shows_a_phase(gone_pid):
    """The controller's record names the calls it waits on, sent 2.0 s before its beat, seen 0.5 s
    ago: 2.5 s. A dead worker's last beat older than that call (or as old) is overruled by it, as is a later
    one that shows it idle; a later one in a phase says more; a worker nothing waits on is its heartbeat."""
    waiting = [{"component": "actor", "phase": "actor.train", "ranks": [0, 1], "elapsed_s": 2.0}]
    controller = record(heartbeat_age_s=0.5, phase="collect_and_train", waiting_on=waiting)

    def doing(dead: dict, waits=controller) -> str:
        incident = checks().check_alive({ACTOR: dead, ("controller", 0): waits}, 1000.0)
        return incident.summary.split("; it was ")[1]

    for age in (9.0, 2.5):
        assert doing(record(gone_pid, heartbeat_age_s=age, phase="actor.construct", phase_age_s=age)) == (
            "in actor.train for 2.5 s"
        )
    assert doing(record(gone_pid, heartbeat_age_s=1.0, phase=None, phase_age_s=None)) == "in actor.train for 2.5 s"
    assert doing(record(gone_pid, heartbeat_age_s=1.0, phase="actor.train", phase_age_s=1.9)) == (
        "in actor.train for 1.9 s"
    )
    elsewhere = record(heartbeat_age_s=0.5, waiting_on=[{**waiting[0], "component": "env"}])
    for waits in (record(heartbeat_age_s=0.5), record(heartbeat_age_s=0.5, waiting_on=[]), elsewhere):
        assert doing(record(gone_pid, heartbeat_age_s=9.0, phase="actor.construct", phase_age_s=9.0), waits) == (
            "in actor.construct for 9.0 s"
        )
    other_rank = record(heartbeat_age_s=0.5, waiting_on=[{**waiting[0], "ranks": [0]}])
    assert doing(record(gone_pid, heartbeat_age_s=9.0, phase=None), other_rank) == "idle between calls"


def silence(tid: int, ready: list[bool]) -> Silence:
    """The watcher's samples of a silent process's thread `tid` over 2 s, evenly spaced: found
    ready to run (waiting for a CPU) or not at each, having used no CPU."""
    sampled = Silence(0.0, {tid: (True, 7.0)})
    for n, is_ready in enumerate(ready, 1):
        sampled.add(2.0 * n / len(ready), {tid: (is_ready, 7.0)})
    return sampled


def test_a_silent_worker_starved_of_cpu_is_warned_once_and_frozen_only_past_the_busy_allowance(caplog):
    """The watcher's samples of its threads (watch/judging/starved_process.py, here with chosen
    states, as /proc gives them): one thread found ready to run in 4 of 5 samples over 2 s while
    using no CPU waited for a CPU 80 % of the time — starved, exactly at the share; 3 of 4 is not."""
    tid = threading.get_native_id()
    watching = checks()
    watching.silent.silences[os.getpid()] = silence(tid, [True, True, False, True, True])
    silent = {ENV: record(heartbeat_age_s=CONFIG.heartbeat_timeout_s + 1)}
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert watching.check_beating(silent, 1000.0) is None
        assert watching.check_beating(silent, 1000.0) is None
    starved = "a thread of it waited for a CPU 80% of the last 2.0 s (the host's other load)"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            f"env rank 0 (pid {os.getpid()}) has published no heartbeat for 6.0 s: {starved}; not judged frozen "
            "until it has been silent for watchdog.busy_allowance_s (600 s)",
        )
    ]
    elsewhere_too = {**silent, ACTOR: record(heartbeat_age_s=6.0, host="another-machine")}
    assert watching.check_beating(elsewhere_too, 1000.0).culprit == ACTOR  # the next silent one is judged
    # the allowance is of the silence the watcher saw: its last beat is older, the watcher was away meanwhile
    away = {ENV: record(heartbeat_age_s=CONFIG.busy_allowance_s + 60, silence_s=CONFIG.busy_allowance_s)}
    assert watching.check_beating(away, 1000.0) is None  # silent for the allowance exactly: not yet frozen
    past = {ENV: record(heartbeat_age_s=CONFIG.busy_allowance_s + 1)}
    said = f"env rank 0 (pid {os.getpid()}) stopped publishing heartbeats %s s ago: %s; last seen in env.step for 0.1 s"
    incident = watching.check_beating(past, 1000.0)
    assert (incident.cause, incident.started) == ("process_frozen", 1000.0 - CONFIG.busy_allowance_s - 1)
    assert incident.summary == said % ("601.0", f"the process is alive but starved of CPU: {starved}")
    watching.silent.silences[os.getpid()] = silence(tid, [True, False, True, True])  # 75 %
    gil = "the process is alive but its Python threads do not run (the GIL is held by a C call)"
    assert watching.check_beating(silent, 1000.0).summary == said % ("6.0", gil)
    elsewhere = {ENV: record(heartbeat_age_s=CONFIG.heartbeat_timeout_s + 1, host="another-machine")}
    assert watching.check_beating(elsewhere, 1000.0).summary == said % (
        "6.0",
        "it is on another machine (no local process check)",
    )


def test_a_stopped_worker_is_named_stopped_though_its_thread_waited_for_a_cpu_before_it_stopped(stopped_child):
    """A worker starved of CPU on a loaded host, then stopped (SIGSTOP, a debugger): its samples
    since it fell silent found its thread ready to run 4 times in 5, but a stopped process is the
    fault: frozen at once, not warned about as starved."""
    watching = checks()
    watching.silent.silences[stopped_child] = silence(stopped_child, [True, True, False, True, True])
    incident = watching.check_beating({ENV: record(stopped_child, heartbeat_age_s=6.0)}, 1000.0)
    assert (incident.cause, incident.culprit) == ("process_frozen", ENV)
    assert "6.0 s ago: the process is stopped (SIGSTOP or a debugger)" in incident.summary, incident.summary


# ------------------------------------------------------------------------------ collectives


def test_a_rank_waiting_in_the_join_is_held_up_only_past_the_start_up_step_allowance():
    """Actor rank 1 waits in the process-group join, which actor rank 0 (in its start-up step)
    has not entered: not the collective timeout's (5 s) but the start-up step allowance's (60 s)
    to wait, then rank 0 is named."""
    watching = checks(workers=(("actor", 0), ACTOR))

    def joining(waited_s: float) -> dict:
        entry = {"group": "join", "seq": 1, "started": 100.0 + 0.2 - waited_s, "op": "join (gloo rendezvous)"}
        entry |= {"call_site": "distributed.py:40", "shapes": []}
        log = {"in_flight": [entry], "entered": {"join": 1}, "recent": []}
        behind = {"in_flight": [], "entered": {}, "recent": []}
        return {
            ("actor", 0): record(phase="actor.init_distributed", phase_age_s=70.0, collectives=behind),
            ACTOR: record(phase="actor.init_distributed", phase_age_s=70.0, time=100.0, collectives=log),
        }

    assert watching.check_collectives(joining(CONFIG.startup_step_allowance_s), 1000.0) is None
    incident = watching.check_collectives(joining(CONFIG.startup_step_allowance_s + 0.5), 1000.0)
    assert (incident.cause, incident.culprit) == ("rank_missing_from_collective", ("actor", 0)), incident.summary


# ------------------------------------------------------------------------------ deadlines


def test_a_learned_deadline_is_the_factor_times_the_longest_call_clamped():
    watching = checks()
    assert watching.deadline(record(phase_max_s={"env.step": 0.2}), "env.step") == CONFIG.min_deadline_s
    assert watching.deadline(record(phase_max_s={"env.step": 1.5}), "env.step") == 15.0
    assert watching.deadline(record(phase_max_s={"env.step": 500.0}), "env.step") == CONFIG.max_deadline_s
    assert watching.deadline(record(phase_max_s={"env.reset": 9.0}), "env.step") == CONFIG.first_call_bound_s
    for step in STARTUP_STEPS:
        assert watching.deadline(record(), f"env.{step}") == CONFIG.startup_step_allowance_s
    assert watching.deadline(record(), "startup.backend") == CONFIG.startup_step_allowance_s
    assert startup_step("startup.resume") and startup_step("actor.init_distributed") and not startup_step("env.step")
    assert not startup_step("env.reset_all") and not startup_step("evaluation")  # a phase of one word


def test_a_blocked_call_past_its_deadline_is_an_incident_naming_the_deadline_and_the_call():
    watching = checks()
    beats(watching, ENV, BLOCKED)
    within = {ENV: record(phase_age_s=15.0, phase_max_s={"env.step": 1.5})}
    assert watching.check_deadlines(within, 1000.0) is None
    past = {ENV: record(phase_age_s=15.5, phase_max_s={"env.step": 1.5})}
    incident = watching.check_deadlines(past, 1000.0)
    assert (incident.cause, incident.culprit, incident.started, incident.state) == (
        "phase_timeout",
        ENV,
        984.5,
        "blocked",
    )
    assert incident.summary == (
        "env rank 0 has been in env.step for 15.5 s (deadline 15.0 s; longest before 1.500 s) and is blocked: its "
        "stack did not move and it used 0% CPU in its thread, 0% in its process over the last 1.5 s"
    )


def test_a_blocked_call_s_incident_names_the_subprocess_it_waits_on():
    """A simulator's server, asleep: in the report's `waits_on` (pid, command, state, share of a
    core over the window) and in the judgement's words."""
    watching = checks()
    server = {"subprocesses": 1, "subprocesses_cpu_s": 3.0, "subprocess_list": [[4242, "python server.py", "S", 3.0]]}
    beats(watching, ENV, BLOCKED, **server)
    incident = watching.check_deadlines({ENV: record(phase_age_s=15.5, phase_max_s={"env.step": 1.5})}, 1000.0)
    assert incident.waits_on == [{"pid": 4242, "command": "python server.py", "state": "S", "cpu": 0.0}]
    assert incident.summary.endswith(
        "; its subprocess is not computing either (0% CPU): pid 4242 (`python server.py`, sleeping, 0% CPU) "
        "over the last 1.5 s"
    ), incident.summary


def test_a_start_up_step_never_seen_finishing_is_a_startup_timeout_and_a_first_call_a_phase_timeout():
    watching = checks()
    beats(watching, ENV, BLOCKED)
    incident = watching.check_deadlines({ENV: record(phase="env.reset", phase_age_s=60.5)}, 1000.0)
    assert incident.cause == "startup_timeout" and "(deadline 60.0 s; never finished before)" in incident.summary
    incident = watching.check_deadlines({ENV: record(phase="env.step", phase_age_s=15.5)}, 1000.0)
    assert incident.cause == "phase_timeout" and "(deadline 15.0 s; never finished before)" in incident.summary
    # seen finishing once, a start-up step that overruns its learned deadline is a phase_timeout
    incident = watching.check_deadlines(
        {ENV: record(phase="env.reset", phase_age_s=30.5, phase_max_s={"env.reset": 3.0})}, 1.0
    )
    assert incident.cause == "phase_timeout"


def test_a_busy_call_past_its_deadline_is_warned_once_and_an_incident_past_the_busy_allowance(caplog):
    watching = checks()
    beats(watching, ENV, BUSY)
    slow = {ENV: record(phase_age_s=16.0)}
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert watching.check_deadlines(slow, 1000.0) is None
        assert watching.check_deadlines(slow, 1001.0) is None
        assert watching.check_deadlines({ENV: record(phase_age_s=16.0, phase_started=60.0)}, 1002.0) is None
    first, next_call = [r.getMessage() for r in caplog.records]  # once per call, and once for the next call
    assert first.startswith("slow: env rank 0 has been in env.step for 16 s, past its deadline of 15 s, but is busy")
    assert first.endswith(
        "an incident only past watchdog.busy_allowance_s (600 s), not counting its thread's waits for a CPU"
    )
    assert next_call == first
    assert watching.check_deadlines({ENV: record(phase_age_s=CONFIG.busy_allowance_s)}, 1000.0) is None
    incident = watching.check_deadlines({ENV: record(phase_age_s=CONFIG.busy_allowance_s + 1)}, 1000.0)
    assert (incident.cause, incident.state) == ("phase_timeout", "busy")
    assert incident.summary.endswith("; past watchdog.busy_allowance_s (600 s)"), incident.summary


def test_a_busy_call_s_waits_for_a_cpu_are_not_counted_against_the_busy_allowance():
    """Its thread waited 300 s, runnable, for a CPU since the call's first beat (its run delay:
    a host loaded past its cores): the call is an incident only once its age less those 300 s is
    past busy_allowance_s, and the incident says so and carries them (the report's
    `cpu_wait_s`). A deadline under 10 s is written to the tenth (it read '0 s')."""
    watching = checks()
    beats(watching, ENV, BUSY, first={"thread_run_delay_s": 10.0}, thread_run_delay_s=310.0)
    assert watching.check_deadlines({ENV: record(phase_age_s=CONFIG.busy_allowance_s + 300)}, 1000.0) is None
    incident = watching.check_deadlines({ENV: record(phase_age_s=CONFIG.busy_allowance_s + 301)}, 1000.0)
    assert (incident.cause, incident.state, incident.cpu_wait_s) == ("phase_timeout", "busy", 300.0)
    assert incident.started == 1000.0 - CONFIG.busy_allowance_s - 301
    assert incident.summary.endswith(
        "; past watchdog.busy_allowance_s (600 s) besides 300.0 s its thread waited for a CPU"
    ), incident.summary
    # without the field (an older worker) every second counts, and none is said to be waited
    older = checks()
    beats(older, ENV, BUSY)
    incident = older.check_deadlines({ENV: record(phase_age_s=CONFIG.busy_allowance_s + 1)}, 1000.0)
    assert incident.cpu_wait_s == 0.0 and incident.summary.endswith("(600 s)"), incident.summary
    # a blocked call is an incident at its deadline, its waits for a CPU notwithstanding
    blocked = checks()
    beats(blocked, ENV, BLOCKED, first={"thread_run_delay_s": 10.0}, thread_run_delay_s=310.0)
    incident = blocked.check_deadlines({ENV: record(phase_age_s=16.0)}, 1000.0)
    assert (incident.state, incident.cpu_wait_s) == ("blocked", 0.0)


def test_a_sub_10_s_deadline_is_written_to_the_tenth_in_the_slow_warning(caplog):
    watching = checks(first_call_bound_s=0.4)
    beats(watching, ENV, BUSY)
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert watching.check_deadlines({ENV: record(phase_age_s=2.5)}, 1000.0) is None
    (slow,) = [r.getMessage() for r in caplog.records]
    assert slow.startswith("slow: env rank 0 has been in env.step for 2.5 s, past its deadline of 0.4 s, but"), slow


@pytest.mark.parametrize(
    ("group", "patience_s"), [("train", CONFIG.collective_timeout_s), ("join", CONFIG.startup_step_allowance_s)]
)
def test_a_rank_waiting_in_a_collective_is_left_to_the_collective_checks_for_its_patience(group, patience_s):
    """Past its call's deadline, a rank whose oldest collective in flight has waited no longer than
    the collective timeout (the process-group join: the start-up step allowance) is not judged by
    its deadline: check_collectives names the rank it waits for. Past that, the deadline holds."""
    watching = checks(workers=(ACTOR,))
    beats(watching, ACTOR, BLOCKED)

    def waiting(waited_s: float) -> dict:
        entry = {"group": group, "seq": 3, "started": 100.0 + 0.2 - waited_s}
        log = {"in_flight": [entry], "entered": {group: 3}, "recent": []}
        return {ACTOR: record(phase="actor.update", phase_age_s=100.0, time=100.0, collectives=log)}

    assert watching.check_deadlines(waiting(patience_s), 1000.0) is None
    incident = watching.check_deadlines(waiting(patience_s + 0.5), 1000.0)
    assert (incident.cause, incident.culprit, incident.state) == ("phase_timeout", ACTOR, "blocked")


def test_a_call_is_not_judged_without_fresh_beats_nor_without_a_phase():
    watching = checks()
    watching.seen[ENV] = Seen()  # no beats seen: nothing to judge it by
    assert watching.check_deadlines({ENV: record(phase_age_s=100.0)}, 1000.0) is None
    beats(watching, ENV, BLOCKED)
    assert watching.check_deadlines({ENV: record(phase=None, phase_age_s=100.0)}, 1000.0) is None


def test_a_record_without_its_phase_s_elapsed_time_gives_the_phase_no_age_and_no_deadline():
    """A record with only the fields the store requires (probe/store.py FIELDS) and a phase, or a
    whole one but for the phase's elapsed time (an older or another writer's record): no deadline
    can be judged without it, so none is, after beats that judge the call blocked — not a
    TypeError, which the watchdog would report as a watchdog_error, stopping a healthy run. The
    same record with its elapsed time is judged."""

    def judged(record: dict) -> tuple:
        watching = checks(workers=(ENV,))
        beats(watching, ENV, BLOCKED)
        records = watching.observe({ENV: {**record, "beat": 5, "time": 102.5}})
        return records[ENV]["phase_age_s"], watching.inspect(records, time.time())

    required = {"component": "env", "rank": 0, "pid": os.getpid(), "phase": "env.step", "phase_started": None}
    whole = record(stack_signature=7, thread_io_bytes=4096, thread_cpu_s=0.0, cpu_s=0.0, thread_samples=0)
    whole |= {"thread_waits": 0, "thread_wait": None}
    del whole["phase_elapsed_s"], whole["heartbeat_age_s"], whole["phase_age_s"]
    assert judged(required) == (None, None)
    assert judged(whole) == (None, None)
    age, incident = judged({**whole, "phase_elapsed_s": 100.0})
    assert age >= 100.0 and (incident.cause, incident.state) == ("phase_timeout", "blocked")


def test_each_call_is_checked_past_those_left_to_others_and_a_held_up_rank_is_its_collective_s_miss():
    """Workers before the overdue one in the records are each passed over for their own reason (no
    phase, within the deadline, no fresh beats, busy within the busy allowance (warned), waiting in
    a collective within its patience): the
    check goes on to the next, not stops. A rank past its deadline that a peer waits for in a
    collective it has not entered is that collective's miss, begun when its call began."""
    watching = checks(workers=(ENV, ("rollout", 0), ("eval", 0), ("rollout", 1), ACTOR, ("actor", 0)))
    for key in (ENV, ("rollout", 0), ACTOR, ("actor", 0)):
        beats(watching, key, BLOCKED)
    beats(watching, ("rollout", 1), BUSY)
    watching.seen[("eval", 0)] = Seen()
    entry = {"group": "train", "seq": 3, "started": 99.9, "op": "all_reduce", "call_site": "update.py:40"}
    in_flight = {"in_flight": [{**entry, "shapes": [[64]]}], "entered": {"train": 3}, "recent": []}
    records = {
        ENV: record(phase=None, phase_age_s=None),
        ("rollout", 0): record(phase_age_s=1.0),
        ("eval", 0): record(phase_age_s=100.0),
        ("rollout", 1): record(phase_age_s=100.0),
        ("actor", 0): record(phase="actor.update", phase_age_s=100.0, time=100.0, collectives=in_flight),
        ACTOR: record(
            phase="actor.update", phase_age_s=100.0, collectives={**in_flight, "in_flight": [], "entered": {"train": 2}}
        ),
    }
    incident = watching.check_deadlines(records, 1000.0)
    assert (incident.cause, incident.culprit, incident.started, incident.state) == (
        "rank_missing_from_collective",
        ACTOR,
        900.0,
        "blocked",
    )
    assert incident.summary == (
        "actor rank 1 is behind: its last collective is #2, and it is in actor.update for 100.0 s; actor rank 0 "
        "waits in all_reduce #3 of group train (update.py:40, shapes [[64]])"
    )


def test_a_call_is_judged_from_the_beats_of_the_last_four_heartbeat_intervals_at_least_two_seconds():
    """Heartbeats every 0.5 s: a call's judgement reads its beats of the last 2 s. One 2.25 s old,
    before which its thread had used no CPU, is not among them: the call is blocked, not busy."""
    watching = checks(heartbeat_interval_s=0.5)
    seen, now = Seen(), time.monotonic()
    for number, (ago, cpu) in enumerate([(2.25, 0.0), (1.5, 1.0), (1.0, 1.0), (0.5, 1.0), (0.0, 1.0)], 1):
        beat = {**published(), "time": 100.0 - ago, "beat": number, "phase_started": 50.0, "stack_signature": 7}
        beat |= {"thread_cpu_s": cpu, "cpu_s": cpu, "thread_io_bytes": 4096, "thread_samples": 0, "thread_waits": 0}
        seen.update(beat, now=now - ago)
    watching.seen[ENV] = seen
    incident = watching.check_deadlines({ENV: record(phase_age_s=100.0)}, 1000.0)
    assert (incident.cause, incident.state) == ("phase_timeout", "blocked"), incident.summary


# ------------------------------------------------------------------------------ precedence


def test_the_checks_come_in_order_death_before_silence_before_a_deadline(gone_pid):
    watching = checks()
    beats(watching, ACTOR, BLOCKED)
    dead = record(gone_pid, heartbeat_age_s=7.0)
    overdue = record(phase_age_s=100.0)
    assert watching.inspect({ENV: dead, ACTOR: overdue}, 1000.0).cause == "worker_died"
    silent = record(heartbeat_age_s=7.0)
    assert watching.inspect({ENV: silent, ACTOR: overdue}, 1000.0).cause == "process_frozen"
    assert watching.inspect({ENV: record(), ACTOR: overdue}, 1000.0).cause == "phase_timeout"
    assert watching.inspect({ENV: record(), ACTOR: record()}, 1000.0) is None


# ------------------------------------------------------------------------------ the watcher's own absence


def test_the_watcher_s_own_absence_is_a_gap_over_half_the_heartbeat_timeout_and_its_absences_add_up():
    """Observations at chosen instants of the watcher's clock (gaps only a stopped or starved
    watcher leaves): a gap of half the heartbeat timeout (2.5 s), or of 2 s, is the watcher there;
    a gap of 10 s is its absence less the poll interval it would have waited anyway, and two such
    gaps before the worker's next beat add up."""
    watching = checks()  # heartbeat timeout 5 s, a poll every 0.25 s
    seen = watching.seen[ENV] = Seen()
    for now in (100.0, 102.5, 104.5):  # the first observation, then gaps of 2.5 s and 2 s
        watching.discount_own_absence(now)
    assert seen.watcher_absent_s == 0.0
    watching.discount_own_absence(114.5)
    assert seen.watcher_absent_s == 10.0 - CONFIG.poll_interval_s
    watching.discount_own_absence(124.5)
    assert seen.watcher_absent_s == 2 * (10.0 - CONFIG.poll_interval_s)


def test_the_watcher_s_own_absence_is_no_evidence_of_a_worker_s_silence():
    """Between two observations more than half the heartbeat timeout apart the watcher did not run
    (its process stopped, and the store it hosts with it): that time is not counted as the worker's
    silence, while its heartbeat's age stays true. A watcher that was there sees the silence."""
    beat = record(beat=1, time=time.time())
    absent, present = checks(heartbeat_timeout_s=1.0), checks(heartbeat_timeout_s=1.0)
    absent.observe({ENV: dict(beat)})
    present.observe({ENV: dict(beat)})
    started = time.monotonic()
    while time.monotonic() - started < 1.5:
        present.observe({ENV: dict(beat)})  # every 0.1 s: no new beat for 1.5 s
        time.sleep(0.1)
    seen_there = present.observe({ENV: dict(beat)})
    assert seen_there[ENV]["silence_s"] == seen_there[ENV]["heartbeat_age_s"] >= 1.5
    assert seen_there[ENV]["clock_offset_s"] == present.seen[ENV].clock_offset is not None
    assert list(present.silent.silences) == [os.getpid()]  # silent here: its threads are sampled
    assert present.check_beating(seen_there, time.time()).cause == "process_frozen"
    away = absent.observe({ENV: dict(beat)})
    assert away[ENV]["heartbeat_age_s"] >= 1.5  # true
    assert CONFIG.poll_interval_s <= away[ENV]["silence_s"] < CONFIG.poll_interval_s + 0.2  # 1.5 s away, less a poll
    assert absent.check_beating(away, time.time()) is None
    assert absent.silent.silences == {}
    absent.observe({ENV: {**beat, "beat": 2}})  # a new beat: nothing of the absence is carried over
    assert absent.seen[ENV].watcher_absent_s == 0.0

"""The watchdog's judgement of a call from its beats, rule by rule and at each rule's threshold:
blocked, busy or spinning (watch/judging/judgement.py), and what the watcher keeps of a worker's beats.

The beats are heartbeat records as a real flight recorder publishes them, with the fields the
judgement reads set to chosen values (CPU seconds, stack signatures, bytes moved, wait samples),
judged by the real `Seen`. tests/test_watchdog_judgement.py judges real loops' beats, whose CPU
shares depend on the host's load; these are exact on any host (and fast enough for the mutation
run, benchmarks/diagnosis/mutation.sh)."""

from __future__ import annotations

import time
from functools import cache

import pytest

from fleetrl.probe.flight_recorder import Recorder
from fleetrl.watch.judging.judgement import BLOCKED, BUSY, SPINNING, Judgement, Sample, Seen, on_watcher_clock

CALL = 50.0  # the judged call's start on the worker's clock (`phase_started`: one call of the phase)
IN_A_COLLECTIVE = {"entered": {"actor": 1}, "in_flight": [{"group": "actor", "seq": 1}], "recent": []}


@cache
def published() -> dict:
    """A real record of a worker in a call: the fields a beat carries besides the ones set here —
    without its subprocesses' (this test process's own children, if it has some: the tests that
    judge subprocesses set them)."""
    recorder = Recorder("env", 0, 0)
    recorder.enter_phase("env.step")
    return {key: value for key, value in recorder.record().items() if not key.startswith("subprocess")}


def beat(at: float, thread_s=0.0, cpu_s=0.0, stack=7, io=4096, samples=0, waits=0, **fields) -> dict:
    """A beat published at `at` on the worker's clock: the phase's thread has used `thread_s` CPU
    seconds, the process `cpu_s`; its stack's signature; the bytes its thread moved; the samples
    of what it sits in and how many found it in a wait."""
    values = {"time": at, "phase_started": CALL, "thread_cpu_s": thread_s, "cpu_s": cpu_s, "stack_signature": stack}
    values |= {"thread_io_bytes": io, "thread_samples": samples, "thread_waits": waits, "thread_wait": None}
    return {**published(), **values, **fields}


def seen_beats(*beats: dict) -> Seen:
    """The watcher's view of `beats`, each seen at the moment it was published (the skew between
    the clocks is another test's: ages never mix them)."""
    seen = Seen()
    for number, record in enumerate(beats, 1):
        seen.update({**record, "beat": number}, now=record["time"])
    return seen


def judged(*beats: dict, window_s: float = 5.0) -> Judgement | None:
    return seen_beats(*beats).judge(now=beats[-1]["time"], window_s=window_s)


def test_the_fields_set_here_are_the_ones_a_recorder_publishes():
    """The beats below are real records with values set; a field renamed in the recorder must not
    leave these tests judging fields it no longer publishes (gpu_util_pct: only on a GPU)."""
    assert set(beat(0.0)) == set(published())
    assert {"phase_elapsed_s", "collectives", "beat"} <= set(published())


# (thread CPU s, process CPU s, stack signature, thread bytes moved, wait samples, waits) at worker
# times 100, 101, 102: 2 s of the call judged
THREE = (100.0, 101.0, 102.0)


def three(*values: tuple, **fields) -> list[dict]:
    return [beat(at, *value, **fields) for at, value in zip(THREE, values)]


STILL = (0.0, 0.0, 7, 4096, 0, 0)  # no CPU, the same line, no data moved, not sampled
CASES = {
    "blocked": ([STILL] * 3, Judgement(BLOCKED, 2.0, 0.0, 0.0, False)),
    "thread at 5 % of a core: busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.05, 0.05, 7, 4096, 0, 0), (0.1, 0.1, 7, 4096, 0, 0)],
        Judgement(BUSY, 2.0, 0.05, 0.05, False),
    ),
    "thread under 5 %: blocked": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.0, 0.0, 7, 4096, 0, 0), (0.09, 0.09, 7, 4096, 0, 0)],
        Judgement(BLOCKED, 2.0, 0.045, 0.045, False),
    ),
    "process at half a core (a simulator's threads): busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.0, 0.5, 7, 4096, 0, 0), (0.0, 1.0, 7, 4096, 0, 0)],
        Judgement(BUSY, 2.0, 0.0, 0.5, False),
    ),
    "stack at two places: busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.0, 0.0, 8, 4096, 0, 0), (0.0, 0.0, 7, 4096, 0, 0)],
        Judgement(BUSY, 2.0, 0.0, 0.0, True),
    ),
    "spinning: half of 6 samples in a wait": (
        [(0.0, 0.0, 7, 4096, 4, 1), (0.9, 0.95, 7, 4096, 7, 3), (1.8, 1.9, 7, 4096, 10, 4)],
        Judgement(SPINNING, 2.0, 0.9, 0.95, False, (3, 6, "select.select")),
    ),
    "spinning at 5 % of a core": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.05, 0.05, 7, 4096, 5, 5), (0.1, 0.1, 7, 4096, 10, 10)],
        Judgement(SPINNING, 2.0, 0.05, 0.05, False, (10, 10, "select.select")),
    ),
    "5 samples, all waits: too few to tell, busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.9, 0.9, 7, 4096, 2, 2), (1.8, 1.8, 7, 4096, 5, 5)],
        Judgement(BUSY, 2.0, 0.9, 0.9, False),
    ),
    "2 of 6 samples in a wait: busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.9, 0.9, 7, 4096, 3, 1), (1.8, 1.8, 7, 4096, 6, 2)],
        Judgement(BUSY, 2.0, 0.9, 0.9, False),
    ),
    "found waiting but moving data: busy": (
        [(0.0, 0.0, 7, 0, 0, 0), (0.9, 0.9, 7, 100, 3, 3), (1.8, 1.8, 7, 200, 6, 6)],
        Judgement(BUSY, 2.0, 0.9, 0.9, False),
    ),
    "found waiting, bytes moved unreadable: busy": (
        [(0.0, 0.0, 7, None, 0, 0), (0.9, 0.9, 7, None, 3, 3), (1.8, 1.8, 7, None, 6, 6)],
        Judgement(BUSY, 2.0, 0.9, 0.9, False),
    ),
    "found waiting while the rest of the process computes half a core: busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.25, 0.75, 7, 4096, 3, 3), (0.5, 1.5, 7, 4096, 6, 6)],
        Judgement(BUSY, 2.0, 0.25, 0.75, False),
    ),
    "found waiting at lines that move: busy": (
        [(0.0, 0.0, 7, 4096, 0, 0), (0.9, 0.9, 8, 4096, 3, 3), (1.8, 1.8, 9, 4096, 6, 6)],
        Judgement(BUSY, 2.0, 0.9, 0.9, True),
    ),
    "thread's clock unreadable at the first beat: no thread CPU": (
        [(None, 0.0, 7, 4096, 0, 0), (1.0, 0.0, 7, 4096, 0, 0), (1.8, 0.0, 7, 4096, 0, 0)],
        Judgement(BLOCKED, 2.0, 0.0, 0.0, False),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_at_its_threshold(name):
    values, expected = CASES[name]
    assert judged(*three(*values, thread_wait="select.select")) == expected


def test_a_thread_that_waited_for_a_cpu_half_the_window_is_busy_starved_not_blocked():
    """The run delay (seconds the thread waited, runnable, for a CPU) grew by 1.0 s of 2 s: it
    wanted a CPU all along, and the host's load kept it at 2 % of a core — busy (starved), though
    the blocked rule alone says blocked. 0.98 s of 2 s is under the share: the other rules judge.
    A thread asleep on a lock accrues no run delay: blocked. A starved thread found in a wait at
    5 % of a core is spinning (the waits are the evidence); under 5 % the spin rule does not
    apply, and starved it is busy."""
    starved_still = [
        beat(at, thread_s=0.02 * (at - 100), thread_run_delay_s=delay) for at, delay in zip(THREE, (3.0, 3.5, 4.0))
    ]
    assert judged(*starved_still) == Judgement(BUSY, 2.0, 0.02, 0.0, False, starved=0.5)
    under = [
        beat(at, thread_s=0.02 * (at - 100), thread_run_delay_s=delay) for at, delay in zip(THREE, (3.0, 3.5, 3.98))
    ]
    assert judged(*under) == Judgement(BLOCKED, 2.0, 0.02, 0.0, False)
    asleep = [beat(at, thread_run_delay_s=3.0) for at in THREE]
    assert judged(*asleep) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)
    waits = [(0.0, 0.0, 7, 4096, 0, 0), (0.05, 0.05, 7, 4096, 5, 5), (0.1, 0.1, 7, 4096, 10, 10)]
    polling = [
        beat(at, *value, thread_wait="os.sched_yield", thread_run_delay_s=delay)
        for at, value, delay in zip(THREE, waits, (0.0, 0.9, 1.8))
    ]
    assert judged(*polling) == Judgement(SPINNING, 2.0, 0.05, 0.05, False, (10, 10, "os.sched_yield"))
    slower = [{**record, "thread_cpu_s": thread_s} for record, thread_s in zip(polling, (0.0, 0.04, 0.08))]
    assert judged(*slower) == Judgement(BUSY, 2.0, 0.04, 0.05, False, starved=0.9)


def test_a_thread_found_ready_to_run_but_barely_running_is_starved_though_its_run_delay_lags():
    """The kernel brings a thread's run delay up to date only when the thread next runs: read by
    the heartbeat thread, a thread starved since its last turn shows none. The samples of what it
    sits in found it ready to run in 11 of 12 and it ran 2 % of a core: it waited 90 % of the
    time — busy (starved). Found asleep in those samples (none ready), the same CPU is blocked;
    too few samples (under SPIN_MIN_SAMPLES) are no evidence."""
    ready = [
        beat(at, thread_s=0.02 * (at - 100), samples=n, thread_ready=r, thread_run_delay_s=3.0)
        for at, n, r in zip(THREE, (0, 6, 12), (0, 6, 11))
    ]
    judgement = judged(*ready)
    assert (judgement.state, judgement.starved) == (BUSY, pytest.approx(11 / 12 - 0.02)), judgement.text()
    asleep = [beat(at, thread_s=0.02 * (at - 100), samples=n, thread_ready=0) for at, n in zip(THREE, (0, 6, 12))]
    assert judged(*asleep).state == BLOCKED
    few = [beat(at, thread_s=0.02 * (at - 100), samples=n, thread_ready=n) for at, n in zip(THREE, (0, 2, 5))]
    assert judged(*few).state == BLOCKED
    # counters begun before the window: only its own 6 samples count (exactly SPIN_MIN_SAMPLES), all ready
    later = [beat(at, thread_s=0.02 * (at - 100), samples=n, thread_ready=n) for at, n in zip(THREE, (20, 23, 26))]
    judgement = judged(*later)
    assert (judgement.state, judgement.starved) == (BUSY, pytest.approx(1.0 - 0.02)), judgement.text()


def test_a_beat_without_a_run_delay_is_no_evidence_of_starvation():
    """An older worker publishes no run delay (nor one where it cannot be read): today's rules."""
    one_missing = [beat(at, thread_run_delay_s=delay) for at, delay in zip(THREE, (None, 1.0, 2.0))]
    assert judged(*one_missing) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)
    older = [{key: value for key, value in beat(at).items() if key != "thread_run_delay_s"} for at in THREE]
    assert judged(*older) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)


def test_a_call_s_wait_for_a_cpu_is_its_thread_s_run_delay_since_the_call_s_first_beat():
    """What the busy allowance does not count (watch/judging/verdict.py): the run delay from the
    first beat of the current call to its last, over all of the call's beats (not the judging
    window; not the 64 kept); a new call counts from its own first beat; a beat without the
    field (an older worker) counts none; a counter that went back (a new thread) counts none.
    Or, where larger, the share of samples that found it ready to run, times the seconds, less
    the CPU seconds it used (the run delay lags a thread starved since its last turn)."""
    call = [beat(float(at), thread_run_delay_s=10.0 + 0.5 * at) for at in range(100)]
    assert seen_beats(*call).cpu_wait_s() == pytest.approx(49.5)  # 10.0 -> 59.5, the first beat no longer kept
    nxt = [
        beat(at, phase_started=CALL + 200, thread_run_delay_s=delay) for at, delay in ((300.0, 70.0), (301.0, 70.25))
    ]
    assert seen_beats(*call, *nxt).cpu_wait_s() == pytest.approx(0.25)
    assert Seen().cpu_wait_s() == 0.0
    assert seen_beats(beat(1.0, thread_run_delay_s=None), beat(2.0, thread_run_delay_s=3.0)).cpu_wait_s() == 0.0
    assert seen_beats(beat(1.0, thread_run_delay_s=3.0), beat(2.0, thread_run_delay_s=None)).cpu_wait_s() == 0.0
    assert seen_beats(beat(1.0, thread_run_delay_s=3.0), beat(2.0, thread_run_delay_s=1.0)).cpu_wait_s() == 0.0
    # a run delay that lags: the samples found the thread ready in 11 of 12 over the call's 10 s,
    # and it ran 0.2 s of them: 11/12 * 10 - 0.2 s waited; under SPIN_MIN_SAMPLES, no such measure
    lagging = [beat(0.0, samples=0, thread_ready=0), beat(10.0, thread_s=0.2, samples=12, thread_ready=11)]
    lagging = [{**record, "thread_run_delay_s": 1.0} for record in lagging]
    assert seen_beats(*lagging).cpu_wait_s() == pytest.approx(11 / 12 * 10 - 0.2)
    few = [beat(0.0, samples=0, thread_ready=0), beat(10.0, thread_s=0.2, samples=5, thread_ready=5)]
    assert seen_beats(*few).cpu_wait_s() == 0.0


def test_a_gpu_that_computes_makes_a_still_call_busy_unless_the_call_is_in_a_collective():
    """The mean of the beats that read a utilisation: 8 % and 12 % (one beat read none) is 10 %,
    the threshold. In a collective the reading is an NCCL kernel waiting for a peer: not read."""
    reads = [beat(at, gpu_util_pct=pct) for at, pct in zip(THREE, (None, 8.0, 12.0))]
    assert judged(*reads) == Judgement(BUSY, 2.0, 0.0, 0.0, False, None, 10.0)
    under = [beat(at, gpu_util_pct=pct) for at, pct in zip(THREE, (6.0, 9.0, 12.0))]
    assert judged(*under) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, None, 9.0)
    waiting = [beat(at, gpu_util_pct=90.0, collectives=IN_A_COLLECTIVE) for at in THREE]
    assert judged(*waiting) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)


def test_subprocesses_that_compute_make_a_still_call_busy_and_veto_spinning():
    """A call waiting on its async vector env's subprocesses (probe/child_activity.py): their CPU
    at 5 % of a core between them makes it busy, under that it stays blocked; a thread found in
    waits while they compute waits on real work; one that ended takes its CPU seconds with it."""
    waiting = [beat(at, subprocesses=8, subprocesses_cpu_s=cpu) for at, cpu in zip(THREE, (0.0, 0.05, 0.1))]
    assert judged(*waiting) == Judgement(BUSY, 2.0, 0.0, 0.0, False, subprocesses=(8, 0.05))  # exactly at 5 %
    under = [beat(at, subprocesses=8, subprocesses_cpu_s=cpu) for at, cpu in zip(THREE, (3.0, 3.0, 3.09))]
    assert judged(*under) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=(8, pytest.approx(0.045)))
    polling = [
        beat(at, thread_s=t, cpu_s=t, samples=n, waits=n, subprocesses=2, subprocesses_cpu_s=c)
        for at, t, n, c in zip(THREE, (0.0, 0.9, 1.8), (0, 3, 6), (0.0, 1.0, 2.0))
    ]
    assert judged(*polling) == Judgement(BUSY, 2.0, 0.9, 0.9, False, subprocesses=(2, 1.0))
    ended = [beat(at, subprocesses=n, subprocesses_cpu_s=cpu) for at, n, cpu in zip(THREE, (2, 2, 1), (5.0, 5.0, 2.0))]
    assert judged(*ended) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=(1, 0.0))
    named = {"subprocesses": 1, "subprocesses_cpu_s": 9.0, "subprocess_list": [[77, "sim --serve", "S", 9.0]]}
    first_without = [beat(100.0), *[beat(at, **named) for at in THREE[1:]]]
    assert judged(*first_without) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)  # none in the whole window


def test_subprocesses_starved_of_cpu_make_a_still_call_busy_and_veto_spinning():
    """A server loading a scene on a host loaded past its cores (stop 48's CI: under 5 % of a core
    over the window, falsely blocked at start-up): its threads waited, ready to run, for a CPU half
    the window or more (`subprocesses_run_delay_s`) — busy, and a thread polling for it waits on
    real work. Under half, or without the field (an older worker) at either end of the window, the
    CPU rule alone: blocked; one that ended takes its wait with it."""

    def waiting(run_delays):
        return [
            beat(at, subprocesses=5, subprocesses_cpu_s=c, subprocesses_run_delay_s=d)
            for at, c, d in zip(THREE, (3.0, 3.0, 3.09), run_delays)
        ]

    using = (5, pytest.approx(0.045))
    starved = Judgement(BUSY, 2.0, 0.0, 0.0, False, subprocesses=using, subprocesses_starved=0.5)
    assert judged(*waiting((10.0, 10.5, 11.0))) == starved  # exactly at half
    assert judged(*waiting((10.0, 10.4, 10.98))) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)
    older = [{k: v for k, v in b.items() if k != "subprocesses_run_delay_s"} for b in waiting((10.0, 10.9, 11.8))]
    assert judged(*older) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)
    for half in (older[:1] + waiting((10.0, 10.9, 11.8))[1:], waiting((10.0, 10.9, 11.8))[:2] + older[2:]):
        assert judged(*half) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)  # one end without it
    assert judged(*waiting((10.0, 10.0, 4.0))) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)
    polling = [
        beat(at, thread_s=t, cpu_s=t, samples=n, waits=n, subprocesses=5, subprocesses_run_delay_s=t)
        for at, t, n in zip(THREE, (0.0, 0.9, 1.8), (0, 3, 6))
    ]
    polling = [{**b, "subprocesses_cpu_s": 3.0} for b in polling]
    assert judged(*polling) == Judgement(BUSY, 2.0, 0.9, 0.9, False, subprocesses=(5, 0.0), subprocesses_starved=0.9)


def test_subprocesses_found_ready_to_run_but_barely_running_are_starved_though_their_run_delay_lags():
    """The kernel brings a run delay up to date only when the thread next runs: a server starved
    since its last turn shows none. The beats that found one of the call's subprocesses ready to
    run (`subprocesses_ready`), less the share of a core they used, half the window or more: busy
    (starved). Found asleep (none ready), the same CPU is blocked; a beat without the field does
    not count, and fewer than three with it are no evidence."""

    def waiting(ready, cpu=(3.0, 3.0, 3.02)):
        return [
            beat(at, subprocesses=2, subprocesses_cpu_s=c, subprocesses_run_delay_s=7.0, subprocesses_ready=r)
            for at, c, r in zip(THREE, cpu, ready)
        ]

    using = (2, pytest.approx(0.01))
    judgement = judged(*waiting((1, 2, 1)))
    assert judgement == Judgement(
        BUSY, 2.0, 0.0, 0.0, False, subprocesses=using, subprocesses_starved=judgement.subprocesses_starved
    )
    assert judgement.subprocesses_starved == pytest.approx(1.0 - 0.01)
    two_of_three = judged(*waiting((1, 0, 1), cpu=(3.0, 3.0, 3.0)))
    assert two_of_three.state == BUSY and two_of_three.subprocesses_starved == pytest.approx(2 / 3)
    assert judged(*waiting((0, 0, 0))) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)
    assert judged(*waiting((1, 0, 0), cpu=(3.0, 3.0, 3.0))).state == BLOCKED  # a third of the beats
    one_read = [
        {k: v for k, v in b.items() if k != "subprocesses_ready" or i == 2} for i, b in enumerate(waiting((1, 1, 1)))
    ]
    assert judged(*one_read) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=using)


def test_the_subprocesses_a_call_waits_on_are_named_with_their_share_the_computing_ones_first():
    """Each subprocess the last beat names (probe/child_activity.py: pid, command, state, CPU
    seconds) with its share of a core since the first beat: all its CPU for one started in
    between, never below 0 (a pid reused by a process with less CPU), most first."""
    first = [[11, "python a.py", "S", 4.0], [12, "python b.py", "R", 2.0], [14, "old", "S", 3.0]]
    last = [[11, "python a.py", "S", 4.0], [12, "python b.py", "R", 3.0], [13, "sim --serve", "D", 0.5]]
    last += [[14, "new", "S", 1.0]]
    beats = [
        beat(at, subprocesses=4, subprocesses_cpu_s=cpu, subprocess_list=named)
        for at, cpu, named in zip(THREE, (9.0, 9.5, 8.5), (first, first, last))
    ]
    waited_on = ((12, "python b.py", "R", 0.5), (13, "sim --serve", "D", 0.25), (11, "python a.py", "S", 0.0))
    waited_on += ((14, "new", "S", 0.0),)
    assert judged(*beats) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False, subprocesses=(4, 0.0), waited_on=waited_on)


def test_only_the_current_call_s_beats_in_the_window_are_judged():
    """Beats before the window (one seen exactly at its start is in it), and the previous call's,
    are left out: too few left to tell is no judgement (the heartbeat check decides)."""
    before = beat(99.0)  # outside a 2 s window: the 5 CPU seconds used since must not count
    after = three((5.0, 5.0, 7, 4096, 0, 0), (5.0, 5.0, 7, 4096, 0, 0), (5.0, 5.0, 7, 4096, 0, 0))
    assert judged(before, *after, window_s=2.0) == Judgement(BLOCKED, 2.0, 0.0, 0.0, False)
    assert judged(*three(STILL, STILL, STILL)[1:]) is None  # two beats
    new_call = beat(103.0, phase_started=102.5)
    assert judged(*three(STILL, STILL, STILL), new_call) is None  # a call just begun
    assert Seen().judge(now=0.0, window_s=5.0) is None


def test_beats_half_a_second_apart_are_judged():
    """The default heartbeat interval: the worker's clock moved 0.5 s over the window."""
    assert judged(beat(0.0), beat(0.25), beat(0.5)) == Judgement(BLOCKED, 0.5, 0.0, 0.0, False)


def test_beats_that_show_no_time_passing_on_the_worker_are_no_judgement():
    assert judged(beat(100.0), beat(100.0), beat(100.0)) is None
    assert judged(beat(102.0), beat(101.0), beat(100.0)) is None  # its clock set back


# (pid, command, state, share of a core): a state the words do not know is named as the kernel gives it
TWO_WAITED_ON = ((4242, "python server.py --port 0", "S", 0.0), (4243, "sim", "Z", 0.0))


@pytest.mark.parametrize(
    ("judgement", "text"),
    [
        (
            Judgement(BLOCKED, 2.04, 0.004, 0.126, False),
            "blocked: its stack did not move and it used 0% CPU in its thread, 13% in its process over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 12.0, 0.5, 1.0, True, None, 91.6),
            "busy: its stack moves, 50% CPU in its thread, 100% in its process, its GPU 92 % utilised "
            "over the last 12.0 s",
        ),
        (
            Judgement(BUSY, 3.0, 0.0, 0.75, False),
            "busy: its stack did not move, 0% CPU in its thread, 75% in its process over the last 3.0 s",
        ),
        (
            Judgement(SPINNING, 2.0, 0.9, 0.95, False, (3, 6, "select.select")),
            "spinning: its stack did not move, and its thread used 90% CPU and was found waiting in "
            "select.select in 3 of 6 samples (a wait that polls), over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 2.0, 0.0, 0.01, False, subprocesses=(2, 0.62)),
            "busy: its stack did not move, 0% CPU in its thread, 1% in its process; waiting on its 2 "
            "subprocesses, which are computing (62% CPU) over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 2.0, 0.0, 0.01, False, subprocesses=(1, 0.05), waited_on=((7, "sim", "R", 0.05),)),
            "busy: its stack did not move, 0% CPU in its thread, 1% in its process; waiting on its subprocess, "
            "which is computing (5% CPU): pid 7 (`sim`, running, 5% CPU) over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 1.6, 0.0, 0.0, False, subprocesses=(5, 0.046), subprocesses_starved=0.9),
            "busy: its stack did not move, 0% CPU in its thread, 0% in its process; waiting on its 5 "
            "subprocesses, which are starved (5% CPU, 1.4 s waiting for a CPU in 1.6 s: the host's other "
            "processes held the cores) over the last 1.6 s",
        ),
        (
            Judgement(BUSY, 2.0, 0.0, 0.0, False, subprocesses=(1, 0.02), subprocesses_starved=0.6),
            "busy: its stack did not move, 0% CPU in its thread, 0% in its process; waiting on its subprocess, "
            "which is starved (2% CPU, 1.2 s waiting for a CPU in 2.0 s: the host's other processes held the "
            "cores) over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 2.0, 0.0, 0.0, False, subprocesses=(2, 0.02), subprocesses_starved=0.6),
            "busy: its stack did not move, 0% CPU in its thread, 0% in its process; waiting on its 2 "
            "subprocesses, which are starved (2% CPU, 1.2 s waiting for a CPU in 2.0 s: the host's other "
            "processes held the cores) over the last 2.0 s",
        ),
        (
            Judgement(BLOCKED, 2.0, 0.0, 0.01, False, subprocesses=(2, 0.0), waited_on=TWO_WAITED_ON),
            "blocked: its stack did not move and it used 0% CPU in its thread, 1% in its process; its 2 "
            "subprocesses are not computing either (0% CPU): pid 4242 (`python server.py --port 0`, sleeping, "
            "0% CPU), pid 4243 (`sim`, Z, 0% CPU) over the last 2.0 s",
        ),
        (
            Judgement(BLOCKED, 2.0, 0.0, 0.01, False, subprocesses=(1, 0.049), waited_on=TWO_WAITED_ON[:1]),
            "blocked: its stack did not move and it used 0% CPU in its thread, 1% in its process; its "
            "subprocess is not computing either (5% CPU): pid 4242 (`python server.py --port 0`, sleeping, "
            "0% CPU) over the last 2.0 s",
        ),
        (
            Judgement(BUSY, 2.0, 0.04, 0.05, False, starved=0.93),
            "busy (starved): its thread waited for a CPU 93% of the time (the host's other processes held "
            "the cores), its stack did not move, 4% CPU in its thread, 5% in its process over the last 2.0 s",
        ),
    ],
    ids=[
        "blocked",
        "busy-gpu",
        "busy",
        "spinning",
        "busy-subprocesses",
        "busy-one-subprocess",
        "busy-starved-subprocesses",
        "busy-one-starved-subprocess",
        "busy-two-starved-subprocesses",
        "blocked-two-subprocesses",
        "blocked-one-subprocess",
        "starved",
    ],
)
def test_the_judgement_s_words(judgement, text):
    assert judgement.text() == text
    assert judgement.stalled == (judgement.state != BUSY)


def test_a_beat_is_kept_once_with_every_field_the_judgement_reads():
    seen = Seen()
    fields = {"thread_samples": 9, "thread_waits": 4, "thread_wait": "select.select", "gpu_util_pct": 30.0}
    fields |= {"thread_run_delay_s": 0.25}
    record = beat(100.0, thread_s=1.5, cpu_s=2.5, stack=11, io=512, beat=3, **fields)
    seen.update(record, now=20.0)
    seen.update({**record, "time": 101.0}, now=21.0)  # the same beat read again: not a new one
    assert list(seen.samples) == [
        Sample(20.0, 100.0, CALL, 1.5, 2.5, 11, 512, 9, 4, "select.select", 30.0, thread_run_delay_s=0.25)
    ]
    assert (seen.beat, seen.changed_at, seen.heartbeat_age(23.5)) == (3, 20.0, 3.5)
    seen.update({**record, "beat": 4, "time": 101.0, "phase_elapsed_s": 51.0}, now=22.0)
    assert (len(seen.samples), seen.changed_at, seen.heartbeat_age(23.5)) == (2, 22.0, 1.5)
    assert seen.phase_age({"phase_elapsed_s": 51.0}, now=23.5) == 52.5  # its own elapsed, plus the beat's age
    assert seen.phase_age({"phase_elapsed_s": None}, now=23.5) is None  # between calls


def test_a_beat_without_the_optional_fields_is_kept_with_their_defaults():
    seen = Seen()
    seen.update({"beat": 1, "time": 100.0}, now=20.0)  # a process with no phase yet, nothing sampled
    assert list(seen.samples) == [Sample(20.0, 100.0, None, None, 0.0, None, None, 0, 0, None, None)]


def test_the_watcher_keeps_a_worker_s_last_64_beats():
    seen = seen_beats(*[beat(float(at)) for at in range(100)])
    assert [sample.time for sample in seen.samples] == [float(at) for at in range(36, 100)]


def test_the_clock_offset_is_the_smallest_difference_a_beat_has_shown():
    """A beat seen 1000 s ago (monotonic), published 30 s earlier by the worker's clock than the
    watcher's wall clock then: offset 30 s; a beat seen later than it was published (a slow poll)
    shows more (45 s) and does not move it, a quicker one less (15 s) and does. Two clocks are read between the
    expected value and the watcher's: the 5 s tolerance is that, not the offset (mutated formulas
    are off by 1000 s or more)."""
    seen, seen_at = Seen(), time.monotonic() - 1000.0
    then = time.time() - 1000.0  # the watcher's wall clock when the beat was seen
    for number, (published_at, expected) in enumerate(
        [(then - 30.0, 30.0), (then - 45.0, 30.0), (then - 15.0, 15.0)], 1
    ):
        seen.update(beat(published_at, beat=number), now=seen_at)
        assert abs(seen.clock_offset - expected) < 5.0, (seen.clock_offset, expected)


def test_a_moment_on_a_worker_s_clock_on_the_watcher_s_clock():
    record = {"clock_offset_s": 30.0}  # the worker's clock is 30 s behind the watcher's
    assert on_watcher_clock(record, 100.0, now=200.0) == 130.0
    assert on_watcher_clock(record, 190.0, now=200.0) == 200.0  # never later than now

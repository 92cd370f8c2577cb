"""What the watcher saw of each worker, on its own clock: heartbeat and phase ages, and whether a
call past its deadline is blocked or busy.

Ages never subtract a worker's clock from the watcher's (machines' clocks differ by seconds or
more): a heartbeat's age is the time since the watcher saw the worker's beat counter change, and
a phase's age is the worker's own elapsed-in-phase at that beat plus that time.

Blocked or busy is told from the beats of the current call in the last `window_s`: the phase's
thread using CPU, the process using CPU (a simulator computing in threads of its own), its GPU
running kernels while it is in no collective (probe/gpu.py), the subprocesses it started computing
(an async vector env's workers loading a scene while it waits on their pipes:
probe/child_activity.py) computing or starved (below), or the thread's stack moving between beats means *busy* — the call works and is only slow; none of these
means *blocked* — a sleep, a lock, a socket or a peer that will not answer. CPU shares are taken
between two beats of the worker's own clock, so skew cancels out.

One wait uses CPU: a loop that polls (`select` with a zero timeout, `os.sched_yield()` or
`time.sleep(0)` in a loop, a non-blocking socket read until data comes). It is *spinning*, and
treated as blocked, only on evidence of a wait: on the window's beats its stack is at the same
lines, its thread uses CPU, moves no data, and at least `SPIN_WAIT_SHARE` of the samples of what
it sits in (`SPIN_MIN_SAMPLES` or more, probe/thread_activity.py) found it in a wait — a system
call it sleeps in, or a call of a C function that waits or polls — and the rest of the process
does not compute, nor do its subprocesses (a thread polling for a simulator's threads or
processes to finish waits on real work: busy).
A computation at one line — a Python loop, a long numpy or torch kernel, with system calls or not
(reading the process CPU clock is one) — is busy until `busy_allowance_s`. A loop that polls a
pure-Python flag (`while not ready: pass`) looks exactly like a computation and is judged busy.

On a loaded host a computing thread may get a few % of a core: the other processes hold the
cores while it waits, runnable, for one. The kernel counts that wait (its run delay,
`thread_run_delay_s`, probe/thread_activity.py), and the samples of what the thread sits in find
it ready to run (`thread_ready`); a thread that waited for a CPU at least `STARVED_SHARE` of the
window wanted one most of the time and is *busy (starved)*, never blocked (`starved_share`). A blocked thread sleeps and has next to no run delay. Spinning stays
spinning: its evidence is the wait the thread is found in, which a starved computation is not
(preempted, the kernel shows it outside any system call). The subprocesses a call waits on
are starved the same way: a server loading a scene on such a host once got 5 % of a core over the
window and was falsely judged blocked at start-up. Their threads' run delay
(`subprocesses_run_delay_s`), or the share of the beats that found one of them ready to run
(`subprocesses_ready`) less the share of a core they used, at least `STARVED_SHARE` of the window
means they wanted a CPU, and the call waiting on them is busy. A record without the fields (an older worker) is judged by the
rules above.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from fleetrl.watch.judging.alignment import oldest_in_flight

BLOCKED, BUSY, SPINNING = "blocked", "busy", "spinning"
# The phase's thread used at least this share of a core: it computes. A blocked thread uses ~0; a
# computing one on a loaded host may get far less than a whole core.
THREAD_BUSY = 0.05
PROCESS_BUSY = 0.50  # the process used at least half a core (more than its idle threads ever do)
# Its subprocesses used at least this share of a core between them: they compute (blocked ones use ~0)
SUBPROCESSES_BUSY = THREAD_BUSY
GPU_BUSY_PCT = 10.0  # kernels ran in at least this share of the time on average: its GPU computes
MIN_SAMPLES = 3  # beats in the window needed to tell
# Of the samples of what the thread sits in, the share that must be waits (a polling loop is
# found in its wait in ~60-100 % of them, a computation in none), and the fewest samples judged
SPIN_WAIT_SHARE = 0.5
SPIN_MIN_SAMPLES = 6
# The phase's thread waited, runnable, for a CPU at least this share of the window: it is starved
STARVED_SHARE = 0.5


@dataclass(frozen=True)
class Sample:
    seen: float  # the watcher's monotonic clock when this beat arrived
    time: float  # the worker's clock when it published the beat
    phase_started: float | None  # the worker's own clock: identifies one call of the phase
    thread_cpu_s: float | None
    cpu_s: float
    stack_signature: int | None
    thread_io_bytes: int | None = None  # bytes the phase's thread read and wrote (Linux)
    thread_samples: int = 0  # samples of what the phase's thread sits in, this call so far
    thread_waits: int = 0  # ... of which found it in a wait
    thread_wait: str | None = None  # the last wait found
    gpu_util_pct: float | None = None  # its GPU's utilisation; None without one, or in a collective
    subprocesses: int = 0  # the subprocesses it started (probe/child_activity.py), alive
    subprocesses_cpu_s: float | None = None  # ... and the CPU seconds they have used
    thread_run_delay_s: float | None = None  # seconds the phase's thread waited, runnable, for a CPU
    thread_ready: int = 0  # samples of what it sits in that found it ready to run or running
    subprocess_list: tuple = ()  # (pid, command, state, CPU seconds) of the first few of them
    subprocesses_run_delay_s: float | None = None  # seconds their threads waited, runnable, for a CPU
    subprocesses_ready: int | None = None  # how many of them were ready to run or running at this beat


@dataclass(frozen=True)
class Judgement:
    state: str  # BLOCKED, BUSY or SPINNING
    window_s: float  # the worker's seconds between the first and last beat judged
    thread_cpu: float  # share of a core used by the phase's thread
    process_cpu: float  # share of a core used by the whole process
    stack_moved: bool
    waits: tuple[int, int, str] | None = None  # spinning: (waits, samples, the wait) over the window
    gpu_util_pct: float | None = None  # its GPU's mean utilisation over the window, where read
    subprocesses: tuple[int, float] | None = None  # (how many, share of a core they used), where it has any
    starved: float | None = None  # busy (starved): the share of the window its thread waited for a CPU
    waited_on: tuple = ()  # (pid, command, state, share of a core over the window) of its first subprocesses
    subprocesses_starved: float | None = None  # the share of the window its subprocesses waited for a CPU, if starved

    @property
    def stalled(self) -> bool:
        """Blocked, or spinning (a wait that burns CPU): an incident once past the deadline."""
        return self.state != BUSY

    def text(self) -> str:
        cpu = f"{self.thread_cpu:.0%} CPU in its thread, {self.process_cpu:.0%} in its process"
        cpu += f", its GPU {self.gpu_util_pct:.0f} % utilised" if self.gpu_util_pct is not None else ""
        if self.subprocesses is not None:
            count, share = self.subprocesses
            them = f"its {count} subprocesses" if count > 1 else "its subprocess"
            if share >= SUBPROCESSES_BUSY:
                cpu += f"; waiting on {them}, which {'are' if count > 1 else 'is'} computing ({share:.0%} CPU)"
            elif self.subprocesses_starved is not None:
                waited = self.subprocesses_starved * self.window_s
                cpu += (
                    f"; waiting on {them}, which {'are' if count > 1 else 'is'} starved ({share:.0%} CPU, "
                    f"{waited:.1f} s waiting for a CPU in {self.window_s:.1f} s: the host's other processes held the cores)"
                )
            else:
                cpu += f"; {them} {'are' if count > 1 else 'is'} not computing either ({share:.0%} CPU)"
            cpu += "".join(f"{': ' if i == 0 else ', '}{process_text(p)}" for i, p in enumerate(self.waited_on))
        if self.state == SPINNING:
            waits, samples, wait = self.waits
            return (
                f"spinning: its stack did not move, and its thread used {self.thread_cpu:.0%} CPU "
                f"and was found waiting in {wait} in {waits} of {samples} samples (a wait that polls), "
                f"over the last {self.window_s:.1f} s"
            )
        if self.state == BLOCKED:
            return f"blocked: its stack did not move and it used {cpu} over the last {self.window_s:.1f} s"
        moved = "its stack moves" if self.stack_moved else "its stack did not move"
        if self.starved is not None:
            return (
                f"busy (starved): its thread waited for a CPU {self.starved:.0%} of the time (the host's "
                f"other processes held the cores), {moved}, {cpu} over the last {self.window_s:.1f} s"
            )
        return f"busy: {moved}, {cpu} over the last {self.window_s:.1f} s"


STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible sleep", "T": "stopped", "t": "stopped by a tracer"}


def process_text(process: tuple) -> str:
    """'pid 4242 (`python server.py`, sleeping, 0% CPU)': one subprocess a call waits on."""
    pid, command, state, share = process
    return f"pid {pid} (`{command}`, {STATES.get(state, state)}, {share:.0%} CPU)"


def on_watcher_clock(record: dict, worker_time: float, now: float) -> float:
    """`worker_time`, a moment on the clock of the worker that published `record`, as a moment on
    the watcher's wall clock `now`, through the record's `clock_offset_s` (the watcher's
    `Watchdog.observe` annotates it: `Seen.clock_offset`). Never later than `now`."""
    return min(now, worker_time + record["clock_offset_s"])


class Seen:
    """One worker as the watcher saw it: when its record last changed, and its recent beats."""

    def __init__(self) -> None:
        self.beat: int | None = None
        self.changed_at: float | None = None  # watcher's monotonic clock
        self.samples: deque[Sample] = deque(maxlen=64)
        # The watcher's wall clock minus the worker's, as small as any beat has shown it: a beat
        # is seen some time after it is published (up to a poll interval, more on a loaded host),
        # and the smallest difference is the one with the least of that delay in it.
        self.clock_offset: float | None = None
        # Seconds since its last beat during which the watcher itself did not run (verdict.py
        # `Checks.discount_own_absence`): a silence it could not have seen
        self.watcher_absent_s: float = 0.0
        # The first beat seen of the current call: its thread's run delay is counted from it
        self.call_start: Sample | None = None

    def update(self, record: dict, now: float) -> None:
        """`record` read at `now` (monotonic); a beat counter it has not shown before is a new beat."""
        if record.get("beat") == self.beat and self.changed_at is not None:
            return
        self.beat, self.changed_at, self.watcher_absent_s = record.get("beat"), now, 0.0
        offset = time.time() - (time.monotonic() - now) - record["time"]
        self.clock_offset = offset if self.clock_offset is None else min(self.clock_offset, offset)
        sample = Sample(
            now,
            record["time"],
            record.get("phase_started"),
            record.get("thread_cpu_s"),
            record.get("cpu_s", 0.0),
            record.get("stack_signature"),
            record.get("thread_io_bytes"),
            record.get("thread_samples", 0),
            record.get("thread_waits", 0),
            record.get("thread_wait"),
            None if oldest_in_flight(record) else record.get("gpu_util_pct"),
            record.get("subprocesses", 0),
            record.get("subprocesses_cpu_s"),
            record.get("thread_run_delay_s"),
            record.get("thread_ready", 0),
            tuple(tuple(process) for process in record.get("subprocess_list", ())),
            record.get("subprocesses_run_delay_s"),
            record.get("subprocesses_ready"),
        )
        self.samples.append(sample)
        if self.call_start is None or self.call_start.phase_started != sample.phase_started:
            self.call_start = sample

    def heartbeat_age(self, now: float) -> float:
        return now - self.changed_at

    def silence(self, now: float) -> float:
        """How long the watcher has been there to see no beat of it: its heartbeat age less the
        watcher's own absences since the last beat."""
        return max(0.0, self.heartbeat_age(now) - self.watcher_absent_s)

    def phase_age(self, record: dict, now: float) -> float | None:
        elapsed = record.get("phase_elapsed_s")
        return None if elapsed is None else elapsed + self.heartbeat_age(now)

    def cpu_wait_s(self) -> float:
        """Seconds the current call's thread has waited, runnable, for a CPU, from the first beat
        seen of the call to the last: the larger of two measures, as `starved_share` takes them —
        its run delay (exact, but brought up to date only when the thread next runs: one starved
        since its last turn shows none of that wait yet) and the share of the samples of what it
        sits in that found it ready to run, times the seconds between the beats, less the CPU
        seconds it used. 0 without either (an older worker, not Linux)."""
        first, last = self.call_start, self.samples[-1] if self.samples else None
        if first is None or last is None:
            return 0.0
        measures = []
        if first.thread_run_delay_s is not None and last.thread_run_delay_s is not None:
            measures.append(last.thread_run_delay_s - first.thread_run_delay_s)
        samples = last.thread_samples - first.thread_samples
        if samples >= SPIN_MIN_SAMPLES and first.thread_cpu_s is not None and last.thread_cpu_s is not None:
            ready = (last.thread_ready - first.thread_ready) / samples
            measures.append(ready * (last.time - first.time) - (last.thread_cpu_s - first.thread_cpu_s))
        return max([0.0, *measures])

    def judge(self, now: float, window_s: float) -> Judgement | None:
        """Blocked or busy, from the current call's beats that arrived in the last `window_s`;
        None while there are too few of them to tell (a call just begun, or beats that stopped:
        then the heartbeat check decides)."""
        if not self.samples:
            return None
        current = self.samples[-1].phase_started
        recent = [s for s in self.samples if s.seen >= now - window_s and s.phase_started == current]
        if len(recent) < MIN_SAMPLES:
            return None
        first, last = recent[0], recent[-1]
        span = last.time - first.time
        if span <= 0:
            return None
        thread = (
            (last.thread_cpu_s - first.thread_cpu_s) / span
            if first.thread_cpu_s is not None and last.thread_cpu_s is not None
            else 0.0
        )
        process = (last.cpu_s - first.cpu_s) / span
        moved = len({s.stack_signature for s in recent}) > 1
        gpu = gpu_utilisation(recent)
        children = subprocess_use(first, last, span)
        children_starved = None if children is None else subprocesses_starved(recent, span, children[1])
        computing = children is not None and (children[1] >= SUBPROCESSES_BUSY or children_starved is not None)
        busy = thread >= THREAD_BUSY or process >= PROCESS_BUSY or moved or (gpu or 0.0) >= GPU_BUSY_PCT or computing
        waits = None if computing else spin_waits(first, last, thread, process, moved)
        starved = None if waits is not None else starved_share(first, last, span, thread)
        state = SPINNING if waits is not None else BUSY if busy or starved is not None else BLOCKED
        waited_on = subprocess_shares(first, last, span) if children is not None else ()
        return Judgement(
            state, span, thread, process, moved, waits, gpu, children, starved, waited_on, children_starved
        )


def gpu_utilisation(samples: list[Sample]) -> float | None:
    """The mean GPU utilisation of the beats that read one outside a collective, else None."""
    read = [s.gpu_util_pct for s in samples if s.gpu_util_pct is not None]
    return sum(read) / len(read) if read else None


def subprocess_use(first: Sample, last: Sample, span: float) -> tuple[int, float] | None:
    """(how many, share of a core they used) of the subprocesses a call's process started, from
    its beats `first` to `last`, `span` seconds apart; None with none in the window. A subprocess
    that ended meanwhile takes its CPU seconds with it: the share is then never below 0."""
    if not last.subprocesses or first.subprocesses_cpu_s is None or last.subprocesses_cpu_s is None:
        return None
    return last.subprocesses, max(0.0, (last.subprocesses_cpu_s - first.subprocesses_cpu_s) / span)


def subprocesses_starved(recent: list[Sample], span: float, used: float) -> float | None:
    """The share of the `span` worker seconds of the beats `recent` that the call's subprocesses
    waited for a CPU, if at least `STARVED_SHARE`, else None (also without the fields: an older
    worker, no scheduler statistics); `used`: the share of a core they used. Two measures, the
    larger taken, as for a thread (`starved_share`): their threads' run delay between them (one
    that ended meanwhile takes its wait with it: never below 0), which the kernel brings up to date
    only when a thread next runs — one starved since its last turn shows none yet — and the share
    of the beats that found one of them ready to run, less the share of a core they used."""
    first, last, shares = recent[0], recent[-1], []
    if first.subprocesses_run_delay_s is not None and last.subprocesses_run_delay_s is not None:
        shares.append(max(0.0, (last.subprocesses_run_delay_s - first.subprocesses_run_delay_s) / span))
    read = [s.subprocesses_ready for s in recent if s.subprocesses_ready is not None]
    if len(read) >= MIN_SAMPLES:
        shares.append(sum(ready > 0 for ready in read) / len(read) - used)
    share = max(shares, default=0.0)
    return share if share >= STARVED_SHARE else None


def subprocess_shares(first: Sample, last: Sample, span: float) -> tuple:
    """(pid, command, state, share of a core) of the subprocesses the last beat names, their CPU
    from the first beat to the last (all of it for one that started in between), most first."""
    before = {process[0]: process[3] for process in first.subprocess_list}
    shares = [
        (pid, command, state, max(0.0, (cpu - before.get(pid, 0.0)) / span))
        for pid, command, state, cpu in last.subprocess_list
    ]
    return tuple(sorted(shares, key=lambda process: -process[3]))  # the computing ones first


def spin_waits(first: Sample, last: Sample, thread: float, process: float, moved: bool) -> tuple | None:
    """(waits, samples, the wait) if the beats from `first` to `last` show a wait that polls (the
    module's rule), else None."""
    if moved or thread < THREAD_BUSY or process - thread >= PROCESS_BUSY:
        return None
    if None in (first.thread_io_bytes, last.thread_io_bytes) or last.thread_io_bytes != first.thread_io_bytes:
        return None  # it moves data (reading a file, receiving a stream), or that cannot be read
    samples, waits = last.thread_samples - first.thread_samples, last.thread_waits - first.thread_waits
    if samples < SPIN_MIN_SAMPLES or waits < SPIN_WAIT_SHARE * samples:
        return None
    return waits, samples, last.thread_wait


def starved_share(first: Sample, last: Sample, span: float, thread: float) -> float | None:
    """The share of the `span` worker seconds from `first` to `last` that the phase's thread spent
    runnable but waiting for a CPU, if at least `STARVED_SHARE`, else None; `thread`: the share of
    a core it used.

    Why: the blocked rule reads little CPU as a thread that sleeps, and on a host loaded past its
    cores a healthy computation gets little CPU too (a false kill was seen at 4 %). The wait for a
    CPU tells them apart: a thread that waited for one most of the window wanted to run, and is
    busy; one asleep on a lock or a socket waits for none. Two measures of it, the larger taken:
    the kernel's run delay (exact, but brought up to date only when the thread next runs: a thread
    starved since its last turn shows none yet), and the share of the samples of what the thread
    sits in that found it ready to run, less the share it ran. A wait that polls is starved as much
    as a computation on a loaded host, so the spin rule's own evidence (waits) decides before this
    one: starvation explains too little CPU, not a wait. Without either (an older worker, not
    Linux) there is no evidence, and the other rules judge."""
    shares = []
    if first.thread_run_delay_s is not None and last.thread_run_delay_s is not None:
        shares.append((last.thread_run_delay_s - first.thread_run_delay_s) / span)
    samples = last.thread_samples - first.thread_samples
    if samples >= SPIN_MIN_SAMPLES:
        shares.append((last.thread_ready - first.thread_ready) / samples - thread)
    share = max(shares, default=0.0)
    return share if share >= STARVED_SHARE else None

"""What the watcher saw of each worker, on its own clock: heartbeat and phase ages, and whether a
call past its deadline is blocked or busy.

Ages never subtract a worker's clock from the watcher's (machines' clocks differ by seconds or
more): a heartbeat's age is the time since the watcher saw the worker's beat counter change, and
a phase's age is the worker's own elapsed-in-phase at that beat plus that time.

Blocked or busy is told from the beats of the current call in the last `window_s`: the phase's
thread using CPU, the process using CPU (a simulator computing in threads of its own), or the
thread's stack moving between beats means *busy* — the call works and is only slow; none of these
means *blocked* — a sleep, a lock, a socket or a peer that will not answer. CPU shares are taken
between two beats of the worker's own clock, so skew cancels out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

BLOCKED, BUSY = "blocked", "busy"
# The phase's thread used at least this share of a core: it computes. A blocked thread uses ~0; a
# computing one on a loaded host may get far less than a whole core.
THREAD_BUSY = 0.05
PROCESS_BUSY = 0.50  # the process used at least half a core (more than its idle threads ever do)
MIN_SAMPLES = 3  # beats in the window needed to tell


@dataclass(frozen=True)
class Sample:
    seen: float  # the watcher's monotonic clock when this beat arrived
    time: float  # the worker's clock when it published the beat
    phase_started: float | None  # the worker's own clock: identifies one call of the phase
    thread_cpu_s: float | None
    cpu_s: float
    stack_signature: int | None


@dataclass(frozen=True)
class Judgement:
    state: str  # BLOCKED or BUSY
    window_s: float  # the worker's seconds between the first and last beat judged
    thread_cpu: float  # share of a core used by the phase's thread
    process_cpu: float  # share of a core used by the whole process
    stack_moved: bool

    def text(self) -> str:
        cpu = f"{self.thread_cpu:.0%} CPU in its thread, {self.process_cpu:.0%} in its process"
        if self.state == BLOCKED:
            return f"blocked: its stack did not move and it used {cpu} over the last {self.window_s:.1f} s"
        moved = "its stack moves" if self.stack_moved else "its stack did not move"
        return f"busy: {moved}, {cpu} over the last {self.window_s:.1f} s"


class Seen:
    """One worker as the watcher saw it: when its record last changed, and its recent beats."""

    def __init__(self) -> None:
        self.beat: int | None = None
        self.changed_at: float | None = None  # watcher's monotonic clock
        self.samples: deque[Sample] = deque(maxlen=64)

    def update(self, record: dict, now: float) -> None:
        """`record` read at `now` (monotonic); a beat counter it has not shown before is a new beat."""
        if record.get("beat") == self.beat and self.changed_at is not None:
            return
        self.beat, self.changed_at = record.get("beat"), now
        self.samples.append(
            Sample(
                now,
                record["time"],
                record.get("phase_started"),
                record.get("thread_cpu_s"),
                record.get("cpu_s", 0.0),
                record.get("stack_signature"),
            )
        )

    def heartbeat_age(self, now: float) -> float:
        return now - self.changed_at

    def phase_age(self, record: dict, now: float) -> float | None:
        elapsed = record.get("phase_elapsed_s")
        return None if elapsed is None else elapsed + self.heartbeat_age(now)

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
        busy = thread >= THREAD_BUSY or process >= PROCESS_BUSY or moved
        return Judgement(BUSY if busy else BLOCKED, span, thread, process, moved)

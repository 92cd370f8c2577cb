"""What a thread sits in, sampled: the evidence that tells a wait that polls from a computation
(watch/judging/judgement.py).

A spin-wait — `select` with a zero timeout in a loop, `os.sched_yield()` or `time.sleep(0)` in a
loop, a non-blocking socket read until data comes — uses CPU at one line, as a long computation
does, and both may spend most of it in the kernel (reading the process CPU clock,
`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`, is a real system call). What tells them apart is *what*
the thread is in when looked at, again and again:

- the kernel's view, `/proc/self/task/<tid>/syscall`: the number of the system call the thread
  sleeps in (`WAIT_SYSCALLS`, per architecture), or "running" while it is runnable — computing,
  or inside a system call that does not sleep (a zero-timeout `select`, `sched_yield`, reading a
  clock: the kernel cannot tell these apart). `futex` is not a wait here: a thread of this
  process that gave up the GIL waits for it in a futex while the sampler holds it;
- Python's view, for the waits that never sleep: the innermost frame sits at a call whose callee
  is one of the C functions that wait or poll (`python_waits`: select, poll, epoll, sched_yield,
  sleep, a socket's recv/accept, a lock's acquire), resolved from the call's source text without
  running any of the program's code (`inspect.getattr_static`).

A sample is a wait when either view says so. Samples are taken by the heartbeat thread of the
worker's own process, on the worker's node, only in calls older than one heartbeat interval
(~30 us of CPU a sample, measured on a loaded host). `thread_io_bytes` (Linux's per-thread I/O
accounting) vetoes a wait: a thread that moves data is working. Elsewhere than Linux the kernel's view is absent.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import platform
import select
import socket
import sys
import threading
import time

# System calls a thread sleeps in while it waits. Not futex (the GIL, see above) and not read (a
# file read sleeps in I/O while the data it computes on arrives). x86_64 and aarch64 numbers; on
# another architecture the kernel's view reports no waits (only Python's view is used there).
WAIT_SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        7: "poll",
        23: "select",
        24: "sched_yield",
        35: "nanosleep",
        45: "recvfrom",
        47: "recvmsg",
        230: "clock_nanosleep",
        232: "epoll_wait",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
        441: "epoll_pwait2",
    },
    "aarch64": {  # the generic table: no poll, select or epoll_wait, only their p- variants
        22: "epoll_pwait",
        72: "pselect6",
        73: "ppoll",
        101: "nanosleep",
        115: "clock_nanosleep",
        124: "sched_yield",
        207: "recvfrom",
        212: "recvmsg",
        441: "epoll_pwait2",
    },
}
KERNEL_WAITS = WAIT_SYSCALLS.get(platform.machine(), {})


def python_waits() -> dict[object, str]:
    """The C callables a Python loop waits or polls in, each with the name the report gives it."""
    waits: dict[object, str] = {
        select.select: "select.select",
        time.sleep: "time.sleep",
        type(threading.Lock()).acquire: "Lock.acquire",
    }
    if hasattr(os, "sched_yield"):
        waits[os.sched_yield] = "os.sched_yield"
    if hasattr(select, "poll"):
        waits[type(select.poll()).poll] = "select.poll.poll"
    if hasattr(select, "epoll"):
        waits[select.epoll.poll] = "select.epoll.poll"
    for name in ("recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "accept"):
        waits[inspect.getattr_static(socket.socket, name)] = f"socket.{name}"
    return waits


PYTHON_WAITS = python_waits()


class WaitSampler:
    """The samples of one call of a phase (its thread and start), and how many were waits.

    `take` runs in the heartbeat thread before each beat; `fields` is what the beat publishes:
    counts since the call began, which the watcher differences over its window."""

    def __init__(self) -> None:
        self.call: tuple | None = None  # (phase start, thread ident) sampled
        self.samples = self.waits = self.ready = 0
        self.last_wait: str | None = None

    def take(self, call: tuple, count: int, gap_s: float, current) -> None:
        """`count` samples of `call`'s thread, `gap_s` apart, while `current()` is still `call`."""
        if call != self.call:
            self.call, self.samples, self.waits, self.ready, self.last_wait = call, 0, 0, 0, None
        ident = call[1]
        native = native_id_of(ident)
        for index in range(count):
            if index:
                time.sleep(gap_s)
            if current() != call:
                return
            wait, ready = sample(ident, native)
            self.samples += 1
            self.ready += ready
            if wait is not None:
                self.waits, self.last_wait = self.waits + 1, wait

    def fields(self, call: tuple) -> dict:
        if call != self.call:
            return {"thread_samples": 0, "thread_waits": 0, "thread_ready": 0, "thread_wait": None}
        return {
            "thread_samples": self.samples,
            "thread_waits": self.waits,
            "thread_ready": self.ready,
            "thread_wait": self.last_wait,
        }


def sample(ident: int, native_id: int | None) -> tuple[str | None, bool]:
    """(the wait thread `ident` (a `threading.get_ident()`, its kernel id `native_id`) sits in now
    — "select.select", "clock_nanosleep" — or None: it runs; whether the kernel has it ready to
    run or running, in no system call that sleeps: the evidence of starvation, watch/judging/judgement.py)."""
    view = kernel_view(native_id)
    return kernel_wait(view) or frame_wait(sys._current_frames().get(ident)), view == "running"


def kernel_view(native_id: int | None) -> str | None:
    """The first word of `/proc/self/task/<tid>/syscall`: "running" (ready to run or running), the
    number of the system call it sleeps in, or None where it cannot be read."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/syscall") as syscall:
            return syscall.read().split(maxsplit=1)[0]
    except (OSError, IndexError):
        return None


def kernel_wait(view: str | None) -> str | None:
    """The wait a `kernel_view` names, if its system call is one (`KERNEL_WAITS`)."""
    if view is None or not KERNEL_WAITS or not view.lstrip("-").isdigit():
        return None
    return KERNEL_WAITS.get(int(view))


# (code, instruction offset) -> the call's callee as a dotted name, or None: parsed once per site
_callee_names: dict[tuple, tuple[str, ...] | None] = {}


def frame_wait(frame) -> str | None:
    """The wait `frame` (a thread's innermost frame) is calling, if it sits at a call of one."""
    if frame is None:
        return None
    key = (frame.f_code, frame.f_lasti)
    if key not in _callee_names:
        _callee_names[key] = callee_name(frame.f_code, frame.f_lasti)
    dotted = _callee_names[key]
    if dotted is None:
        return None
    return PYTHON_WAITS.get(resolve(frame, dotted))


def callee_name(code, offset: int) -> tuple[str, ...] | None:
    """The callee of the call at byte `offset` of `code` as names (`("select", "select")`), from
    the call's own source span; None where that is not a call of a plain dotted name."""
    positions = list(code.co_positions())
    if offset < 0 or offset // 2 >= len(positions):
        return None
    line, end_line, column, end_column = positions[offset // 2]
    if None in (line, end_line, column, end_column):
        return None
    lines = [linecache.getline(code.co_filename, n) for n in range(line, end_line + 1)]
    lines[-1] = lines[-1].encode()[:end_column].decode(errors="replace")
    lines[0] = lines[0].encode()[column:].decode(errors="replace")
    try:
        call = ast.parse("".join(lines).strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    names, node = [], call.func
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return (node.id, *reversed(names))


def resolve(frame, dotted: tuple[str, ...]) -> object:
    """The object `dotted` names in `frame`, looked up without running any of its code."""
    root, *attributes = dotted
    code = frame.f_code
    local = root in code.co_varnames or root in code.co_cellvars or root in code.co_freevars
    scope = frame.f_locals if local else frame.f_globals
    value = scope.get(root, frame.f_builtins.get(root))
    try:
        for attribute in attributes:
            value = inspect.getattr_static(value, attribute)
    except AttributeError:
        return None
    try:
        hash(value)
    except TypeError:
        return None
    return value


def thread_io_bytes(native_id: int | None) -> int | None:
    """Bytes thread `native_id` of this process has read and written through system calls
    (sockets and pipes included); None where Linux's per-thread accounting cannot be read."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/io") as io:
            counts = dict(line.split(": ") for line in io.read().splitlines())
        return int(counts["rchar"]) + int(counts["wchar"])
    except (OSError, ValueError, KeyError):
        return None


def thread_run_delay_s(native_id: int | None) -> float | None:
    """Seconds thread `native_id` of this process has spent runnable but waiting for a CPU (the
    scheduler's run delay, the second field of `/proc/self/task/<tid>/schedstat`); None where it
    cannot be read. A thread that uses little CPU because the host's other processes take the
    cores has a run delay growing with the wall clock; one asleep on a lock or a socket has none
    (watch/judging/judgement.py: `starved_share`). One small file read: ~20 us of CPU a beat on a loaded host."""
    return None if native_id is None else schedstat_run_delay_s(f"/proc/self/task/{native_id}/schedstat")


def schedstat_run_delay_s(path: str) -> float | None:
    """The run delay in one thread's `schedstat` file (its second field, in nanoseconds), in
    seconds; None where it cannot be read (the thread ended, or no scheduler statistics)."""
    try:
        with open(path) as schedstat:
            return int(schedstat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def native_id_of(ident: int) -> int | None:
    return next((t.native_id for t in threading.enumerate() if t.ident == ident), None)

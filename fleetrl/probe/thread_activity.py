"""What a thread did in the kernel, for telling a wait that polls from a computation (watch/judgement.py).

A spin-wait — `while not ready: time.sleep(0)`, a non-blocking socket polled in a loop, `select`
with a zero timeout — uses CPU and sits at the same line on every heartbeat, as a long
computation does. What tells them apart is where the CPU goes: a wait that polls spends much of
it in system calls that return at once, having moved no data and touched no new memory; a
computation spends it in user space (a loop over Python, numpy or torch kernels: ~1-3 % kernel
time), or, when it allocates large buffers over and over, in page faults (up to ~95 % kernel
time, thousands to a hundred thousand faults a second: counted, so it is not taken for a wait). Read from Linux's
per-thread accounting (/proc/self/task/<tid>/stat and io) once per heartbeat, about 30 us;
elsewhere the fields are absent and no call is judged spinning.
"""

from __future__ import annotations

import os
import threading

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_activity(ident: int) -> dict:
    """{"thread_sys_s": kernel CPU seconds of thread `ident` (a `threading.get_ident()`),
    "thread_io_bytes": bytes it has read and written through system calls (sockets and pipes
    included), "thread_faults": its page faults}; {} where Linux's per-thread accounting cannot
    be read."""
    native = next((t.native_id for t in threading.enumerate() if t.ident == ident), None)
    if native is None:
        return {}
    try:
        with open(f"/proc/self/task/{native}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/self/task/{native}/io") as io:
            counts = dict(line.split(": ") for line in io.read().splitlines())
        return {
            "thread_sys_s": int(fields[12]) / CLOCK_TICKS,  # stime: field 15 of stat, 13th after the name
            "thread_io_bytes": int(counts["rchar"]) + int(counts["wchar"]),
            "thread_faults": int(fields[7]) + int(fields[9]),  # minflt + majflt (fields 10 and 12 of stat)
        }
    except (OSError, ValueError, KeyError, IndexError):
        return {}

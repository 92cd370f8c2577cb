"""The processes a worker's simulators started: the evidence of what a waiting call waits on, and
what ends with the worker.

A simulator often runs processes of its own: an async vector env's subprocesses, Isaac Sim's Kit,
a Unity player, a physics server — started by `multiprocessing`, `subprocess.Popen`, `os.fork` or
a shell, some daemonised (`setsid`, a double fork). The caller's thread then sits in a pipe read
while they load a scene or take a step — no CPU, a stack that does not move: exactly what a
blocked call looks like from inside the process. Judged on the waiting process alone, a server
that computes for 90 s at start-up was a false `startup_timeout`. So each beat also carries the
worker's descendants: how many, the CPU seconds they have used, the seconds their threads waited,
ready to run, for a CPU (the kernel's run delay: a server computing on a host loaded past its cores
may get 5 % of one, and the wait is what tells it from one asleep), and the first few by pid,
command, state and CPU (`subprocess_cpu`). The watcher calls the call busy while their CPU grows,
or while they wait for a CPU most of the time — up to `busy_allowance_s`, as for a thread that
computes — and, when it is blocked, names the ones it waits on (watch/judging/judgement.py).

Which processes: every descendant of this process — `/proc/<pid>/task/*/children`, transitively —
but Ray's daemons and multiprocessing's idle helpers (its resource tracker, its fork server). A watched process is a child subreaper (`become_subreaper`): a daemonised
server, whose parent exits at once, is re-parented to the worker rather than to init, so it stays
a descendant to judge and to end. Ray's daemons (GCS, raylets, their agents and workers) are
children of the controller that started them and use CPU all the time: counting them would make
every blocked controller look busy. They are told apart by where they came from, not by their
names: the code that starts Ray's nodes here (cluster/ray/local.py, cluster/isolation/nodes.py)
does it inside `starting_ray()`, and every child that appeared meanwhile is Ray's, left out with
its descendants once the nodes are up (while they start, they are what this process waits on).
A controller that starts Ray hosts no simulator: on the Ray backend the env workers are processes
of their own.

`end_descendants` ends what is left when the backend shuts down: every descendant but Ray's and
those that were there before the run's workers were built, daemonised servers included, reaped.

Read from `/proc` (Linux; elsewhere nothing is published, and the verdict is the process's own).
~0.3 ms a beat for a process with a few dozen threads and no descendants (one small read a
thread), more with many descendants (three small reads a thread of theirs).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

from fleetrl.probe.thread_activity import schedstat_run_delay_s

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PR_SET_CHILD_SUBREAPER = 36
LISTED = 4  # descendants a beat names (by pid, command, state, CPU), the first found
COMMAND_CHARS = 240  # of a descendant's command line, as published
_not_simulators: set[int] = set()  # Ray's daemons, started here (`starting_ray`)
_commands: dict[tuple[int, str], str] = {}  # (pid, start time) → command line, read once


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphaned descendants — a daemonised server
    whose parent exited — are re-parented to it, not to init. Whether it worked."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


@contextlib.contextmanager
def starting_ray():
    """Inside, this process starts Ray's daemons: every child that appears meanwhile (with its
    descendants) is Ray's, not a simulator's, once it is up. While they start they are the work
    this process waits on (a call waiting for its Ray node to come up is busy while the node's
    daemons compute), and they count."""
    before = set(children_of(os.getpid()))
    try:
        yield
    finally:
        _not_simulators.update(set(children_of(os.getpid())) - before)


def descendants() -> list[tuple[int, list[str]]]:
    """(pid, its /proc stat fields) of every live descendant of this process but Ray's daemons and
    multiprocessing's own helpers, breadth first (zombies left out: they have ended)."""
    found, pending, seen = [], children_of(os.getpid()), multiprocessing_helpers()
    while pending:
        pid = pending.pop(0)
        if pid in seen or pid in _not_simulators:
            continue
        seen.add(pid)
        fields = stat_fields(f"/proc/{pid}/stat")
        if fields is None or fields[0] == "Z":
            continue
        found.append((pid, fields))
        pending.extend(children_of(pid))
    return found


def multiprocessing_helpers() -> set[int]:
    """The pids of multiprocessing's resource tracker and fork server where this process started
    them (a spawned pool, an async vector env): idle daemons of the library, not a simulator's,
    alive as long as this process (their private attributes, read only)."""
    helpers = set()
    for module, owner, attribute in (
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
    ):
        loaded = sys.modules.get(module)
        pid = getattr(getattr(loaded, owner, None), attribute, None)
        if isinstance(pid, int):
            helpers.add(pid)
    return helpers


def subprocess_cpu() -> dict:
    """`subprocesses` (how many live descendants, Ray's daemons left out), `subprocesses_cpu_s`
    (the CPU seconds they have used), `subprocesses_run_delay_s` (the seconds their threads waited,
    ready to run, for a CPU, `run_delay_s`; null where none can be read), `subprocesses_ready`
    (how many of them the kernel shows ready to run or running: state `R`) and `subprocess_list` ([pid, command, state, CPU seconds] of the `LISTED` that used the most CPU),
    or {} with none or where `/proc` cannot be read."""
    found = descendants()
    if not found:
        return {}
    listed = sorted(found, key=lambda process: -cpu_s(process[1]))[:LISTED]
    delays = [delay for delay in (run_delay_s(pid) for pid, _ in found) if delay is not None]
    return {
        "subprocesses": len(found),
        "subprocesses_cpu_s": sum(cpu_s(fields) for _, fields in found),
        "subprocesses_run_delay_s": sum(delays) if delays else None,
        "subprocesses_ready": sum(fields[0] == "R" for _, fields in found),
        "subprocess_list": [[pid, command(pid, fields), fields[0], cpu_s(fields)] for pid, fields in listed],
    }


def run_delay_s(pid: int) -> float | None:
    """The seconds the threads of `pid` have waited, ready to run, for a CPU: the sum of the second
    fields of their `/proc/<pid>/task/<tid>/schedstat`, which the kernel brings up to date when a
    thread next runs; None where none can be read (the process ended meanwhile, or a kernel
    without scheduler statistics)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    read = [schedstat_run_delay_s(f"/proc/{pid}/task/{task}/schedstat") for task in tasks]
    waited = [delay for delay in read if delay is not None]  # a thread that ended meanwhile adds none
    return sum(waited) if waited else None


def command(pid: int, fields: list[str]) -> str:
    """Its command line (read once per process: keyed by pid and start time), shortened."""
    key = (pid, fields[19])  # field 22 of stat: the start time, which tells a reused pid apart
    if key not in _commands:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                text = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            text = ""
        _commands[key] = (text or f"[{pid}]")[:COMMAND_CHARS]
    return _commands[key]


def descendant_pids() -> set[int]:
    return {pid for pid, _ in descendants()}


def end_descendants(spare: set[int] = frozenset(), timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every descendant but Ray's daemons and `spare` (those that were there before),
    deepest first, daemonised ones included (this process is their subreaper), and reap those
    that are this process's children. Returns the pids killed."""
    victims = [pid for pid, _ in descendants() if pid not in spare]
    for pid in reversed(victims):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    for pid in victims:
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:  # ours: reaped
                    break
            fields = stat_fields(f"/proc/{pid}/stat")
            if fields is None or (fields[0] == "Z" and os.getpid() != parent_of(fields)):
                break  # gone, or another's zombie (its parent reaps it)
            time.sleep(0.02)
    return victims


def parent_of(fields: list[str]) -> int:
    return int(fields[1])


def stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc `stat` file (a process's, or one thread's under task/) after the
    command name, which may hold spaces: [0] the state, [1] the parent pid, [11] and [12] utime
    and stime, [19] the start time (fields 3, 4, 14, 15 and 22 of stat). None if it cannot be
    read (the process or thread ended meanwhile)."""
    try:
        with open(path) as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_s(fields: list[str]) -> float:
    """The CPU seconds, user and system, that `stat_fields` hold."""
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def children_of(pid: int) -> list[int]:
    """The child processes of `pid`, from each of its threads' /proc children list."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                children.extend(int(child) for child in listed.read().split())
        except OSError:
            continue
    return children

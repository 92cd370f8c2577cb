"""The CPU of the processes this process waits on: a call that waits for its own subprocesses is
working while they compute (watch/judging/judgement.py).

A vector env with `env.vectorization: async` (gymnasium's `AsyncVectorEnv`), or a simulator with a
pool of its own, runs its envs in subprocesses; the caller's thread sits in a pipe read
(`multiprocessing.connection._recv`) while they load a scene or take a step — no CPU, a stack
that does not move: exactly what a blocked call looks like from inside the process. A robot
simulator can compute for minutes in its constructor or first reset; judged on the waiting process
alone, that was a false `startup_timeout`. So each beat also carries how many such subprocesses
there are and the CPU seconds they (and their own descendants) have used, and the watcher calls
the call busy while that grows — up to `busy_allowance_s`, as for a thread that computes.
Subprocesses that are themselves blocked use no CPU and leave the verdict as it was.

Which subprocesses: those this process started through `multiprocessing` (what vector envs and
pools use), with their descendants. Not every child: a Ray driver's own daemons (GCS, raylet,
dashboard) are children of the controller too and use CPU all the time — counting them would make
every blocked controller look busy. Read from `/proc` (Linux; elsewhere nothing is published,
and the verdict is the process's own). ~0.6 ms a beat with 8 subprocesses on a loaded host;
nothing without any.
"""

from __future__ import annotations

import multiprocessing.process
import os

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def subprocess_cpu() -> dict:
    """`subprocesses` (how many this process started through multiprocessing and are alive) and
    `subprocesses_cpu_s` (the CPU seconds they and their descendants have used), or {} with none
    or where `/proc` cannot be read."""
    roots = [child.pid for child in started_children() if child.pid is not None]
    seen: set[int] = set()
    alive, total = 0, 0.0
    for root in roots:
        pending = [root]
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            cpu = process_cpu_s(pid)
            if cpu is None:
                continue  # gone meanwhile, or no /proc
            alive += pid == root
            total += cpu
            pending.extend(children_of(pid))
    return {"subprocesses": alive, "subprocesses_cpu_s": total} if alive else {}


def started_children() -> list:
    """The processes this process started through multiprocessing, read without reaping any.
    `multiprocessing.active_children()` would reap finished ones from this (the heartbeat) thread,
    racing the main thread's own `join`; its private set is read instead (empty if it is gone)."""
    return list(getattr(multiprocessing.process, "_children", ()))


def process_cpu_s(pid: int) -> float | None:
    """User and system CPU seconds of process `pid` (all its threads), from /proc/<pid>/stat."""
    fields = stat_fields(f"/proc/{pid}/stat")
    return None if fields is None else cpu_s(fields)


def stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc `stat` file (a process's, or one thread's under task/) after the
    command name, which may hold spaces: [0] the state, [11] and [12] utime and stime (fields 3,
    14 and 15 of stat). None if it cannot be read (the process or thread ended meanwhile)."""
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

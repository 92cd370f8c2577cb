"""What the watchdog raises: an `Incident` — its cause, the culprit, when the fault began — and
the causes there are.

An incident's `started` is the fault's first sign — the culprit's last progress (its last
heartbeat, the start of the phase or collective it overran) — so that `detected_after_s` measures
the watchdog, not the moment it looked. `died` turns a dead worker's last words into its incident.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetrl.watch.naming import describe

CAUSES = (
    "worker_died",
    "worker_exception",
    "collective_mismatch",
    "rank_missing_from_collective",
    "phase_timeout",
    "process_frozen",
    "node_lost",
    "peer_unreachable",
    "disk_full",
    "interrupted",
    "startup_timeout",
    "watchdog_error",
    "non_finite",
)
# Causes a restart cannot help with: an interruption (the user asked to stop), a full disk (it
# would fill again), a failed watchdog (the run would go on unwatched) and a non-finite value (the
# newest checkpoint and the same simulators bring it back: `env.nan_policy` is the way to live with
# a simulator that emits them).
NEVER_RESTART = ("interrupted", "disk_full", "watchdog_error", "non_finite")
# What a `startup_timeout` report tells the user to check.
DEADLINE_HINT = "Check the address and that the network interface it names is reachable from here (`fleetrl doctor`)."


@dataclass
class Incident:
    cause: str
    summary: str
    started: float  # when the fault began (epoch seconds), as well as it can be told
    culprit: tuple[str, int] | None = None  # (component, rank)
    detail: str = ""  # e.g. the worker's traceback
    records: dict = field(default_factory=dict)  # (component, rank) → last heartbeat record
    timeline: list = field(default_factory=list)  # (time, {"component/rank": phase}) before it
    state: str | None = None  # a stalled call's judgement: "blocked", "spinning" or "busy"
    # The watched process (component, rank) whose clock `started` is on, until the watcher has
    # moved it onto its own (a worker's exception classified where its heartbeats are not seen)
    clock: tuple[str, int] | None = None
    # The watched process the culprit runs in, where that is another name (an inline worker's
    # exception names `env rank 0`, which runs in `inline rank 0`): the report lists the culprit
    # as a worker of its own, with that process's pid, phase and stack
    host: tuple[str, int] | None = None
    # A dead worker's last words (watch/judging/last_words.py LastWords.as_dict): how it ended, its node,
    # the tail of its own stderr
    last_words: dict | None = None
    # A stalled call's subprocesses, which it waits on (watch/judging/judgement.py): pid, command, state,
    # cpu (a share of a core over the judged window) and, added by the response, stack
    waits_on: list[dict] = field(default_factory=list)
    # Seconds since `started` in which the watchdog that found it did not run (watch/watchdog.py
    # `absent_s`): the part of `detected_after_s` that is the host's, not the verdict's
    watcher_absent_s: float = 0.0
    # A busy call's seconds waiting, runnable, for a CPU (its thread's run delay in the call:
    # watch/judging/verdict.py): not counted against `busy_allowance_s`, so the detection is later by as much
    cpu_wait_s: float = 0.0


def died(key: tuple[str, int], record: dict, words, doing: str, started: float) -> Incident:
    """`worker_died` for `key` with its last words (a `LastWords`, or None where they could not be
    read) — or, where its stderr says Gloo or NCCL aborted it on a collective mismatch, that
    mismatch (`collective_mismatch`), naming it as the rank whose collectives diverged."""
    pid = f"pid {record['pid']}" if record.get("pid") else ""
    node = words.node if words else (f"node {record['node']}" if record.get("node") is not None else "")
    # what is known of its process: a Ray worker that died before its first beat, with no pid in
    # Ray's error (its construction failed), has neither pid nor node here
    where = ", ".join(part for part in (pid, node) if part)
    who = f"{describe(key)} ({where})" if where else describe(key)
    ended = words.ended if words else "its process is gone"
    fields = {"last_words": words.as_dict() if words else None, "detail": words.stderr_tail if words else ""}
    mismatch = words.mismatch if words else None
    if mismatch:
        return Incident(
            "collective_mismatch",
            f"{who} was aborted by a collective mismatch: its collectives diverged "
            f'from its peers\' ({ended}; its stderr: "{mismatch}"); {doing}',
            started,
            key,
            **fields,
        )
    return Incident("worker_died", f"{who} died: {ended}; {doing}", started, key, **fields)

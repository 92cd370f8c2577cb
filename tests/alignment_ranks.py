"""Two real ranks (tests/ranks.py: spawned, Gloo) whose flight recorders see a desynchronised DDP
step, for tests/test_alignment.py.

Each rank installs a real `Recorder` that publishes its heartbeat record into a file, wraps a
small model with fleetrl's own `ddp()` (so the recorded gradient-bucket hook runs) and makes
"train calls" as the actor does: a phase `actor.train` with a forward, a backward (one DDP
bucket) and fleetrl's metrics all-reduce. One call of rank 1 goes wrong as a user bug would —
it blocks before its forward, skips the call, or makes an extra all-reduce — while the other
rank waits for it for real. The rank that is free (not blocked in a collective) reads both
published records once the waiting rank's record shows its collective in flight, runs the
diagnosis on them, and then releases the waiting rank by making the collectives it waits for.
"""

from __future__ import annotations

import json
import os
import threading
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn

from fleetrl.config.schema import WatchdogConfig
from fleetrl.parallel import process_group, reduce
from fleetrl.parallel.recorded_fsdp import record_fsdp_collectives
from fleetrl.parallel.wrap import ddp
from fleetrl.probe import flight_recorder
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging import alignment
from fleetrl.watch.reporting.hang_report import build_hang_report, render_text
from fleetrl.watch.watchdog import Watchdog

WAIT_S = 120  # a record not showing the expected state by then fails the test (a bound, not a timing;
# 60 s was once too short on the loaded CI host: 3 test workers beside Ray runs)
# The desync cases keep one rank in a collective while the other waits for its records (twice at
# most, then a diagnosis of a few beats): the group's timeout outlasts that, so a slow host fails
# a wait by name, never by a Gloo timeout in the waiting rank.
GROUP_TIMEOUT_S = 2 * WAIT_S + 30


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x)


def train_call(model: nn.Module, recorder: Recorder, step: str = "full") -> None:
    """One actor.train call: forward + backward (one DDP bucket) + the metrics all-reduce, or
    `skip` (returns at once) or `extra` (one all-reduce more at the end)."""
    outer = recorder.enter_phase("actor.train")
    try:
        if step == "skip":
            return
        train_step(model)
        if step == "extra":
            reduce.all_reduce_sum(torch.zeros(7))
    finally:
        recorder.exit_phase(outer)


def train_step(model: nn.Module) -> None:
    model(torch.ones(3, 4)).sum().backward()
    reduce.all_reduce_sum(torch.zeros(2))


def publish_to(path: Path):
    def publish(payload: str) -> None:
        partial = path.with_suffix(".partial")
        partial.write_text(payload)
        os.replace(partial, path)

    return publish


def read_records(folder: Path) -> dict:
    return {("actor", rank): json.loads((folder / f"actor{rank}.json").read_text()) for rank in (0, 1)}


def wait_for(folder: Path, ready, what: str) -> dict:
    """The ranks' records once `ready(records)`; a rank that has not published its first record
    yet (its process still starting) is not ready."""
    deadline = time.monotonic() + WAIT_S
    records = None
    while time.monotonic() < deadline:
        try:
            records = read_records(folder)
        except FileNotFoundError:
            records = None
        if records is not None and ready(records):
            return records
        time.sleep(0.05)
    raise AssertionError(f"after {WAIT_S} s the records still do not show {what}: {records}")


def in_flight(record: dict) -> bool:
    return bool(record["collective"])


def stalled(records: dict, waiting: int, calls: int, phase: str | None) -> bool:
    """Rank `waiting` shows a collective in flight, and the other rank's record `calls` calls of
    actor.train begun and it in `phase` (a record published before it got there is not its state)."""
    other = records[("actor", 1 - waiting)]
    return in_flight(records[("actor", waiting)]) and (other["phase_counts"].get("actor.train"), other["phase"]) == (
        calls,
        phase,
    )


def named_by_torch(record: dict) -> bool:
    """torch's own recorder shows a collective in flight and has been dumped to name it."""
    trace = record["torch_trace"]
    return bool(trace and trace["in_flight"] and trace["in_flight"][0]["op"] != "?")


def torch_finding(records: dict):
    """The finding from torch's recorder alone, as on NCCL (where it is authoritative), on the
    records as the watchdog annotates them (its ages); None while they do not show one yet."""
    records = Watchdog(WatchdogConfig(), None, [], None).observe(records)
    as_on_nccl = {key: {**r, "torch_trace": {**r["torch_trace"], "authoritative": True}} for key, r in records.items()}
    return alignment.diagnose(as_on_nccl, time.time(), timeout_s=0.0)


def diagnosed_by_torch(records: dict) -> dict:
    """The diagnosis of `torch_finding`, with every rank's torch trace beside it."""
    finding = torch_finding(records)
    traces = {key: r["torch_trace"] for key, r in records.items()}
    return {"cause": finding.cause, "culprit": finding.culprit, "summary": finding.summary, "traces": traces}


def observe_beats(watchdog: Watchdog, folder: Path, beats: int = 5, apart_s: float = 0.3) -> None:
    for _ in range(beats):
        time.sleep(apart_s)  # first: beats published once the phase's thread is in its join
        watchdog.observe(read_records(folder))


def diagnosed(folder: Path) -> dict:
    """What the watchdog and the report make of the published records now: the finding
    (collective timeout 0: the waiting is real, its length does not matter here), and the verdict
    of the deadline check alone once every deadline and the collective timeout have passed (the
    waiting rank is skipped because its peer is behind, not because its wait is still short).
    The deadline check judges a call from several beats, as the watchdog does: they are read in a
    thread of their own while this one — the phase's thread of a rank that is behind — waits in a
    join, as a rank stuck before its forward would (no CPU, a stack that does not move)."""
    watchdog = Watchdog(
        WatchdogConfig(
            startup_allowance_s=1e-3,
            startup_step_allowance_s=1e-3,
            first_call_bound_s=1e-3,
            min_deadline_s=1e-3,
            collective_timeout_s=1e-3,
        ),
        None,
        [],
        None,
    )
    observer = threading.Thread(target=observe_beats, args=(watchdog, folder), name="observe-beats")
    observer.start()
    observer.join()
    records, now = watchdog.observe(read_records(folder)), time.time()
    finding = alignment.diagnose(records, now, timeout_s=0.0)
    by_deadline = watchdog.check_deadlines(records, now)
    incident = Incident(finding.cause, finding.summary, finding.started, finding.culprit, records=records)
    workers = [{"component": c, "rank": r, "node": 0} for c, r in sorted(records)]
    report = build_hang_report(incident, workers, {}, now)
    return {
        "cause": finding.cause,
        "summary": finding.summary,
        "culprit": finding.culprit,
        "waiting": finding.waiting,
        "deadline_culprit": by_deadline.culprit if by_deadline else None,
        "deadline_cause": by_deadline.cause if by_deadline else None,
        "report": report,
        "text": render_text(report),
    }


def desync(name: str, rank: int, world: int, folder: str) -> dict | None:
    """Case `name` (see CASES) in this group; returns the diagnosis on the free rank, else None."""
    folder = Path(folder) / name
    folder.mkdir(parents=True, exist_ok=True)
    recorder = Recorder("actor", rank, 0)
    flight_recorder.install(recorder)
    recorder.start_publishing(publish_to(folder / f"actor{rank}.json"), 0.05)
    torch.manual_seed(0)
    model = ddp(Model(), torch.device("cpu"))
    try:
        return CASES[name](model, recorder, rank, folder)
    finally:
        recorder.stop()
        flight_recorder.install(None)


def block_on_first_call(model, recorder, rank, folder):
    """Rank 1 is inside its first train call but never reaches its forward; rank 0 waits in DDP's
    gradient all-reduce."""
    if rank == 0:
        train_call(model, recorder)
        return None
    outer = recorder.enter_phase("actor.train")
    wait_for(folder, partial(stalled, waiting=0, calls=1, phase="actor.train"), "rank 0 waiting")
    found = diagnosed(folder)
    waiting = wait_for(
        folder,
        lambda r: named_by_torch(r[("actor", 0)]) and torch_finding(r) is not None,
        "rank 0 waiting, named and diagnosed from torch's recorder",
    )
    found["torch"] = diagnosed_by_torch(waiting)
    train_step(model)  # rank 1 comes through: rank 0's bucket completes
    recorder.exit_phase(outer)
    return found


def skip_after(good_calls: int, model, recorder, rank, folder):
    """`good_calls` good calls; in the next, rank 1 returns without its forward and backward
    (after none: its very first call, with no call before to compare its count of collectives with)."""
    for _ in range(good_calls):
        train_call(model, recorder)
    if rank == 0:
        train_call(model, recorder)
        return None
    train_call(model, recorder, "skip")
    wait_for(folder, partial(stalled, waiting=0, calls=good_calls + 1, phase=None), "rank 0 waiting")
    found = diagnosed(folder)
    train_call(model, recorder)  # what rank 0 waits for
    return found


def extra_in_steady_state(model, recorder, rank, folder):
    """Two good calls; in the third, rank 1 makes one all-reduce more."""
    for _ in range(2):
        train_call(model, recorder)
    if rank == 1:
        train_call(model, recorder, "extra")
        return None
    train_call(model, recorder)
    wait_for(folder, partial(stalled, waiting=1, calls=3, phase=None), "rank 1 waiting")
    found = diagnosed(folder)
    reduce.all_reduce_sum(torch.zeros(7))  # the partner of rank 1's extra collective
    return found


def completed(model, recorder, rank, folder):
    """Two good calls: afterwards every collective entered has completed, on both ranks."""
    for _ in range(2):
        train_call(model, recorder)
    return recorder.record()


def fsdp(model, recorder, rank, folder):
    """FSDP2 over the same model: its all-gathers and reduce-scatters are recorded and complete."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sharded = fully_shard(Model(), mesh=init_device_mesh("cpu", (2,)))
    record_fsdp_collectives(sharded)
    for _ in range(2):
        outer = recorder.enter_phase("actor.train")
        sharded(torch.ones(3, 4)).sum().backward()
        recorder.exit_phase(outer)
    return recorder.record()


def late_join(rank: int, world: int, folder: str, port: int) -> dict | None:
    """The process-group join as the actor makes it (`init_distributed`): rank 0 joins and waits
    in the rendezvous; rank 1 is inside init_distributed but has not reached its join (a start-up
    stall) until the diagnosis is taken, then joins and releases rank 0. Returns the diagnosis on
    rank 1."""
    folder = Path(folder)
    recorder = Recorder("actor", rank, 0)
    flight_recorder.install(recorder)
    recorder.start_publishing(publish_to(folder / f"actor{rank}.json"), 0.05)
    outer = recorder.enter_phase("actor.init_distributed")
    found = None
    try:
        if rank == 1:
            wait_for(folder, lambda records: in_flight(records[("actor", 0)]), "rank 0 waiting in its join")
            found = diagnosed(folder)
        process_group.init_process_group(rank, world, "127.0.0.1", port, timeout_s=WAIT_S)
        recorder.exit_phase(outer)
        found = found or {}
        found["record"] = recorder.record()
        return found
    finally:
        recorder.stop()
        flight_recorder.install(None)
        process_group.destroy_process_group()


CASES = {
    "block on the first call": block_on_first_call,
    "skip in steady state": partial(skip_after, 2),
    "skip on the first call": partial(skip_after, 0),
    "extra in steady state": extra_in_steady_state,
    "completed": completed,
    "fsdp": fsdp,
}

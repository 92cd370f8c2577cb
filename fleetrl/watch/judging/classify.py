"""An exception that reached the controller → the incident it stands for.

The incident starts at the fault's first sign, not when the controller classifies it: a worker's
exception when it was raised (`WorkerError.raised_at`), a dead Ray worker at its last heartbeat —
on the watcher's clock: where the raiser's heartbeats are seen here, moved onto it now, else left
on the raiser's clock and named (`Incident.clock`) for the watcher that sees them."""

from __future__ import annotations

import re
import shutil
import time
import traceback
from pathlib import Path
from typing import Protocol

from fleetrl.checkpoint import causes, full_disk
from fleetrl.probe.recorded_calls import WorkerError
from fleetrl.watch.incident import Incident, died
from fleetrl.watch.judging.judgement import on_watcher_clock
from fleetrl.watch.judging.last_words import LastWords
from fleetrl.watch.judging.node_loss import lost_node
from fleetrl.watch.judging.ray_memory import memory_kill
from fleetrl.watch.naming import describe

DISK_FULL_HINT = (
    "Free space on that file system or point runner.run_dir at a larger disk, then resume "
    "(runner.resume=<run dir>): the last complete checkpoint is intact, a failed save never replaces it."
)

NON_FINITE_ERROR = "NonFiniteError"  # fleetrl/non_finite.py's, matched by name as a worker's error arrives
NON_FINITE_HINT = (
    "A NaN or infinity stopped the run before it reached a checkpoint: every checkpoint holds finite "
    "weights, and the report names the newest. A simulator known to emit them now and then can run "
    "with env.nan_policy=zero or skip_episode; a loss or gradient that overflows wants a smaller "
    "algorithm.lr or a max_grad_norm."
)


class RemoteWorkers(Protocol):
    """Workers in processes this one did not fork (Ray actors), as the incident response sees them."""

    def kill_remote_workers(self) -> None:
        """End them now, from any thread (the watchdog's: this process exits right after)."""

    def stop_after_incident(self) -> None:
        """End them and disconnect, from the main thread, which carries on to exit cleanly."""

    def actor_ids(self) -> dict:
        """Ray actor id (hex) → (component, rank), to name the worker behind a RayActorError."""

    def last_words(self, key: tuple[str, int], pid: int | None) -> LastWords | None:
        """How dead worker `key` (process `pid`) ended, its node, its stderr's tail, read on its node."""


def incident_from_error(
    error: BaseException, records: dict, remote: RemoteWorkers | None = None, run_dir: Path | None = None
) -> Incident:
    """`records`: (component, rank) → heartbeat record; `remote`: the Ray workers, which name the
    worker behind an actor id and read a dead one's last words on its node. A worker's exception
    arrives as a `WorkerError` naming its raiser (on Ray inside a RayTaskError, possibly after
    travelling as another call's argument); a dead Ray worker as a RayActorError carrying its
    actor id and pid (`worker_died` with its last words, or the collective mismatch its stderr
    names: incident.died); workers Ray's memory monitor killed as `worker_died` naming them and the
    node's memory (judging/ray_memory.py); the controller's own ENOSPC is `disk_full`
    naming the file (else `run_dir`) and the bytes left there. Any of these while a worker's node
    no longer runs Ray is that node's loss (`node_lost`), the error its echo."""
    now = time.time()
    lost = lost_node(records, now)
    if lost is not None:  # a dead actor, a peer's reset connection: echoes of the node that is gone
        key, summary = lost
        return Incident("node_lost", summary, now - records[key].get("heartbeat_age_s", 0.0), key, str(error))
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # the inline backend without Ray installed
        RayActorError = ()
    if isinstance(error, RayActorError):
        key = (remote.actor_ids() if remote else {}).get(getattr(error, "actor_id", None))
        who = describe(key) if key else "a worker"
        last_beat = now - records.get(key, {}).get("heartbeat_age_s", 0.0)  # the watcher's clock, not the worker's
        if key is not None:
            pid = ray_pid(error) or records.get(key, {}).get("pid")
            words = remote.last_words(key, pid) if remote else None
            first = str(error).splitlines()[0]
            return died(key, {**records.get(key, {}), "pid": pid}, words, f"Ray lost its process: {first}", last_beat)
        return Incident(
            "worker_died",
            f"{who} died (Ray lost its process): {str(error).splitlines()[0]}",
            last_beat,
            key,
            str(error),
        )
    kill = memory_kill(str(error))
    if kill is not None:  # Ray's memory monitor killed workers: name them, not the caller that got the news
        return kill.incident(records, now, str(error))
    raised = worker_error(error)
    if raised is None and full_disk(error):  # the controller's own write: a checkpoint, metrics
        return Incident("disk_full", disk_full_summary(error, run_dir), now, None, DISK_FULL_HINT)
    if raised is None and type(error).__name__ == NON_FINITE_ERROR:  # the controller's own check (a checkpoint's state)
        return Incident("non_finite", f"the controller found {error}", now, None, NON_FINITE_HINT)
    if raised is None:  # raised in the controller itself
        return Incident(
            "worker_exception",
            f"the controller raised {type(error).__name__}: {error}",
            now,
            None,
            "".join(traceback.format_exception(error)),
        )
    key = (raised.component, raised.rank)
    started, clock = raised_on_watcher_clock(raised, records, now)
    message = raised.message.strip().splitlines()[0] if raised.message.strip() else ""
    said = f"{describe(key)} raised {raised.error_type} in {raised.phase}: {message}"
    if raised.error_type == "JoinError":
        return Incident(
            "peer_unreachable",
            f"{describe(key)} could not reach its peers: {message}",
            started,
            key,
            raised.trace,
            clock=clock,
            host=raised.clock,
        )
    diverged = (
        re.match(r"the .+ loss of actor rank (\d+)", message) if raised.error_type == "UnusedParameterError" else None
    )
    if diverged:  # every rank raises it (parallel/grad_check.py): the culprit is the rank it names
        culprit = ("actor", int(diverged.group(1)))
        said = f"{describe(culprit)} diverged ({describe(key)} raised {raised.error_type} in {raised.phase}): {message}"
        return Incident("worker_exception", said, started, culprit, raised.trace, clock=clock)
    if raised.error_type == NON_FINITE_ERROR:  # fleetrl/non_finite.py: a NaN or inf where training needs numbers
        return Incident(
            "non_finite", said, started, key, f"{NON_FINITE_HINT}\n\n{raised.trace}", clock=clock, host=raised.clock
        )
    if "No space left on device" in raised.message:
        return Incident("disk_full", said, started, key, raised.trace, clock=clock, host=raised.clock)
    return Incident("worker_exception", said, started, key, raised.trace, clock=clock, host=raised.clock)


def ray_pid(error: BaseException) -> int | None:
    """The dead actor's pid, from the `pid: N` line Ray's ActorDiedError carries."""
    found = re.search(r"^\s*pid: (\d+)$", str(error), re.MULTILINE)
    return int(found.group(1)) if found else None


def raised_on_watcher_clock(raised: WorkerError, records: dict, now: float) -> tuple[float, tuple | None]:
    """(when `raised` was raised, the process whose clock that is): on this watcher's clock (None)
    where it sees that process's heartbeats, else on the raiser's own."""
    record = records.get(raised.clock)
    if record is not None and record.get("clock_offset_s") is not None:
        return on_watcher_clock(record, raised.raised_at, now), None
    return raised.raised_at, raised.clock


def disk_full_summary(error: BaseException, run_dir: Path | None) -> str:
    path = next((e.filename for e in causes(error) if isinstance(e, OSError) and e.filename), None)
    where = Path(path) if path else run_dir
    return f"no space left on device writing {where or 'a file'}: {free_bytes(where)}"


def free_bytes(path: Path | None) -> str:
    """'N bytes free on <mount>' for the file system holding `path` (its nearest existing folder)."""
    folder = Path(path) if path else None
    while folder is not None and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if folder is None:
        return "free space unknown"
    try:
        return f"{shutil.disk_usage(folder).free} bytes free on {folder}"
    except OSError as error:
        return f"free space unknown ({error})"


def worker_error(error: BaseException) -> WorkerError | None:
    """The WorkerError inside `error` (Ray's wrapper keeps it as `.cause`), if any."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, WorkerError):
            return error
        error = getattr(error, "cause", None) or error.__cause__
        seen += 1
    return None

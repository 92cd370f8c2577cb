"""`hang_report.json` and `hang_report.txt`: what went wrong, where, and what each worker was doing.

The text names the culprit first, in one sentence a person can act on, then one line per worker,
then every worker's Python stack; past `report_groups.GROUPED` workers, the workers grouped by
state with the outliers spelled out, and each distinct stack once (watch/reporting/report_groups.py).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from fleetrl.config.redact import redact_text
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.alignment import waits_for
from fleetrl.watch.judging.judgement import process_text
from fleetrl.watch.naming import collective_text, describe, where
from fleetrl.watch.reporting.collective_table import aligned_collectives, render_table, render_torch_traces
from fleetrl.watch.reporting.report_groups import GROUPED, grouped_stacks, grouped_worker_lines

REPORT_JSON = "hang_report.json"
REPORT_TEXT = "hang_report.txt"
STALLS = ("phase_timeout", "process_frozen", "rank_missing_from_collective", "collective_mismatch", "startup_timeout")


# Asynchronous training's waits of the controller (controller/async_updates.py): whom each waits
# for, and why. A report names the controller as waiting for a culprit of those components.
ASYNC_WAITS = {
    "async.collect": (("env", "rollout"), "a collection, while the actor trains on an earlier batch"),
    "async.queue_full": (
        ("actor",),
        "an update, with the queue of collected batches full: the env and rollout workers are held back behind it",
    ),
    "async.drain": (("actor",), "the last updates, with nothing left to collect"),
}


FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')


def innermost_frame(stack: str) -> str | None:
    """'file.py:57 (func)' of the main thread: from the worker's own answer (main thread first,
    most recent call last: probe/stack_requests.py) or from faulthandler (most recent call first,
    the signalled main thread as 'Current thread')."""
    if "(most recent call last)" in stack:
        frames = FRAME.findall(stack.split("\nThread ", 1)[0])
        frame = frames[-1] if frames else None
    else:
        match = FRAME.search(stack.split("Current thread", 1)[1] if "Current thread" in stack else stack)
        frame = match.groups() if match else None
    return f"{Path(frame[0]).name}:{frame[1]} ({frame[2]})" if frame else None


def with_hosted_culprit(incident: Incident, workers: list[dict]) -> list[dict]:
    """`workers`, and the culprit where it is not one of them but runs in one (`incident.host`:
    an inline worker), listed after its process and marked as hosted by it."""
    listed = [(w["component"], w["rank"]) for w in workers]
    if incident.culprit is None or incident.culprit in listed or incident.host not in listed:
        return workers
    at = listed.index(incident.host)
    component, rank = incident.culprit
    hosted = {**workers[at], "component": component, "rank": rank, "host": list(incident.host)}
    return [*workers[: at + 1], hosted, *workers[at + 1 :]]


def build_hang_report(
    incident: Incident, workers: list[dict], stacks: dict, now: float, checkpoint: Path | None = None
) -> dict:
    """The report (module docstring); `checkpoint`: the run's newest checkpoint, which a resume
    starts from (written from finite, complete state only: fleetrl/checkpoint.py)."""
    entries = []
    for worker in with_hosted_culprit(incident, workers):
        key = (worker["component"], worker["rank"])
        process = tuple(worker["host"]) if worker.get("host") else key  # the watched process it runs in
        record = incident.records.get(process, {})
        entries.append(
            {
                "component": worker["component"],
                "rank": worker["rank"],
                "host": worker.get("host"),
                "node": worker.get("node"),
                "pid": record.get("pid"),
                "phase": record.get("phase"),
                "phase_age_s": record.get("phase_age_s"),
                "collective": record.get("collective"),
                "last_collective": record.get("last_collective"),
                "torch_trace": record.get("torch_trace"),
                "heartbeat_age_s": record.get("heartbeat_age_s"),
                "stack": stacks.get(process, "(not captured)"),
                "culprit": key == incident.culprit,
                "waits_for_culprit": key == process
                and key in incident.records
                and (
                    waits_for(incident.records, key, incident.culprit)
                    or awaits(incident.records[key], incident.culprit) is not None
                ),
            }
        )
    summary = incident.summary
    if incident.culprit is not None and incident.cause in STALLS:
        frame = innermost_frame(stacks.get(incident.culprit, ""))
        summary += f"; its main thread is at {frame}" if frame else ""
    summary += waiting_controller(incident)
    return {
        "cause": incident.cause,
        "summary": summary,
        "culprit": list(incident.culprit or []),
        "state": incident.state,
        "incident_started": incident.started,
        "reported_at": now,
        "detected_after_s": now - incident.started,
        "watcher_absent_s": incident.watcher_absent_s,
        "cpu_wait_s": incident.cpu_wait_s,
        "newest_checkpoint": str(checkpoint) if checkpoint else None,
        "waits_on": incident.waits_on,
        "detail": incident.detail,
        "last_words": incident.last_words,
        "workers": entries,
        "collectives": aligned_collectives(incident.records),
        "timeline": [{"time": t, "phases": phases} for t, phases in incident.timeline],
    }


def awaits(record: dict, culprit: tuple[str, int] | None) -> str | None:
    """Why the worker of `record` — the controller, in one of asynchronous training's waits —
    waits for `culprit`'s component; None when it does not."""
    wait = ASYNC_WAITS.get(record.get("phase") or "")
    if culprit is None or wait is None or culprit[0] not in wait[0]:
        return None
    return wait[1]


def waiting_controller(incident: Incident) -> str:
    """'; controller rank 0 waits for it in async.queue_full: ...' where the controller waits for
    the culprit in one of asynchronous training's waits (who waits for whom), else ''."""
    for key, record in incident.records.items():
        why = awaits(record, incident.culprit)
        if why is not None and key != incident.culprit:
            return f"; {describe(key)} waits for it in {record['phase']}: {why}"
    return ""


def absence_text(report: dict) -> str:
    """'; the watchdog itself did not run for 4.7 s of it ...' where it was away for a second or
    more, else '' (a report written before `watcher_absent_s` has none)."""
    absent = report.get("watcher_absent_s") or 0.0
    if absent < 1.0:
        return ""
    return (
        f"; the watchdog itself did not run for {absent:.1f} s of it: a host loaded past its cores, "
        "or its process stopped"
    )


def render_text(report: dict) -> str:
    lines = [
        f"fleetrl stopped: {report['cause']}",
        report["summary"],
        f"(detected {report['detected_after_s']:.1f} s after it began{absence_text(report)})",
        f"newest checkpoint: {report['newest_checkpoint']} (runner.resume continues from it)"
        if report.get("newest_checkpoint")
        else "no checkpoint was written",
        "",
    ]
    for process in report.get("waits_on") or []:
        lines += [f"it waits on {process_text((process['pid'], process['command'], process['state'], process['cpu']))}"]
        lines += [f"  {line}" for line in (process.get("stack") or "").splitlines()] + [""]
    words = report.get("last_words")
    if words:  # the detail is then the tail of the dead worker's stderr
        source = f" ({words['stderr_path']})" if words.get("stderr_path") else ""
        lines.append(f"last words: {words['ended']}, on {words['node']}; the end of its stderr{source}:")
    if report["detail"]:
        lines += [report["detail"].rstrip(), ""]
    lines.append("workers:")
    grouped = len(report["workers"]) > GROUPED
    if grouped:
        lines += grouped_worker_lines(report["workers"], worker_line)
    else:
        lines += [worker_line(worker) for worker in report["workers"]]
    lines.append("")
    table = render_table(report.get("collectives") or {"rows": []}, report["reported_at"])
    table += render_torch_traces(report["workers"])
    lines += [*table, ""] if table else []
    if grouped:
        return "\n".join(lines + grouped_stacks(report["workers"]))
    for worker in report["workers"]:
        if not worker.get("host"):  # a hosted worker's stack is its process's, printed under that
            lines += [
                f"--- stack of {describe((worker['component'], worker['rank']))} ---",
                worker["stack"].rstrip(),
                "",
            ]
    return "\n".join(lines)


def worker_line(worker: dict) -> str:
    key = (worker["component"], worker["rank"])
    if worker["pid"] is None:
        state = "not started: no heartbeat yet"
    else:
        state = where({"phase": worker["phase"], "phase_age_s": worker["phase_age_s"] or 0.0})
    collective = worker["collective"] or worker["last_collective"]
    in_or_last = "in" if worker["collective"] else "last"
    return (
        f"  {'>' if worker['culprit'] else ' '} {describe(key):<14} node {worker['node']} "
        f"pid {worker['pid']}: {state}"
        + (f"; {in_or_last} {collective_text(collective)}" if collective else "")
        + (f"; heartbeat {worker['heartbeat_age_s']:.1f} s ago" if worker["heartbeat_age_s"] is not None else "")
        + ("; waits for the culprit" if worker.get("waits_for_culprit") else "")
        + (f"; runs in {describe(tuple(worker['host']))}" if worker.get("host") else "")
    )


def write_hang_report(run_dir: Path, report: dict) -> tuple[str, Path]:
    """Write the report into `run_dir`, or, when that cannot take it (a full disk), into a folder
    of the system's temp dir that the returned text names. Returns (text, folder written to)."""
    text = redact_text(render_text(report))  # a stack or a worker's stderr may quote a secret
    try:
        _write_report(Path(run_dir), report, text)
        return text, Path(run_dir)
    except OSError as error:
        for name in (REPORT_JSON, REPORT_TEXT):  # no half-written report left for a reader to trip on
            (Path(run_dir) / name).unlink(missing_ok=True)
        fallback = Path(tempfile.gettempdir()) / f"fleetrl-report-{Path(run_dir).name}-{os.getpid()}"
        text += f"\n(the run directory {run_dir} could not take this report: {error}; it is in {fallback})\n"
        fallback.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_report(fallback, report, text)
        return text, fallback


def record_end(folder: Path, ended_at: float) -> None:
    """Add to the report in `folder` when the teardown had ended every process of the run but the
    one writing (`ended_at`) and how long after the detection (`ended_after_s`)."""
    add_to_report(folder, lambda report: {"ended_at": ended_at, "ended_after_s": ended_at - report["reported_at"]})


def record_restarts(folder: Path, restarts: list[dict], refusal: str) -> None:
    """Add to the last report of a run that restarted every earlier attempt (`restarts`: number,
    cause, incident_at, report: the kept report's path) and why this one did not restart."""
    add_to_report(folder, lambda report: {"restarts": restarts, "not_restarted": refusal})
    lines = [f"restarts before this incident ({len(restarts)}); not restarted: {refusal}"]
    lines += [f"  {r['number']}: {r['cause']}, report {r['report']}" for r in restarts]
    try:
        with open(folder / REPORT_TEXT, "a") as text:
            text.write("\n" + "\n".join(lines) + "\n")
    except OSError:
        pass


def add_to_report(folder: Path, fields) -> None:
    """Update the JSON report in `folder` with `fields(report)`. Best effort: the report stands
    without them (a disk that fills now); whole or not at all, so a reader never finds half."""
    path = folder / REPORT_JSON
    try:
        report = json.loads(path.read_text())
        report.update(fields(report))
        written = path.with_name(f".{REPORT_JSON}.tmp")
        written.write_text(json.dumps(report, indent=2, default=str))
        written.replace(path)
    except (OSError, ValueError, KeyError):
        pass


def _write_report(folder: Path, report: dict, text: str) -> None:
    (folder / REPORT_JSON).write_text(redact_text(json.dumps(report, indent=2, default=str)))
    (folder / REPORT_TEXT).write_text(text)

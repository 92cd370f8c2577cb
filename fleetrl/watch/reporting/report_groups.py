"""The hang report's text at a fleet's size: workers grouped by what they were doing, outliers
spelled out, identical stacks printed once.

At 1,024 workers one line per worker, one column per actor rank in the collectives table and one
stack per worker make a text nobody reads past its first screen (megabytes; the culprit's line is
one in a thousand). Past `GROUPED` workers the text instead says, per state — phase, collective,
whether the heartbeat went silent, whether it waits for the culprit — which workers were in it
as rank ranges with their nodes ("255 ranks (actor ranks 0-127,129-255) on nodes 0-3: in
actor.train; in all_reduce #42; waits for the culprit"). A group of `LISTED` workers or fewer
(the culprit's, a node that went silent alone...) is an outlier: each worker gets its own line,
as in a small report. The collectives table gets one column per set of ranks whose column reads
the same, and each distinct stack is printed once with the ranks that share it. The full
per-worker table stays in hang_report.json.
"""

from __future__ import annotations

from fleetrl.watch.naming import LISTED, collective_name, describe, describe_many, rank_ranges

GROUPED = 16  # past this many workers, the text groups them
SILENT_S = (
    2.0  # a heartbeat older than this (4 beats at the default interval) puts a worker in a group of its own state
)


def state_of(worker: dict) -> tuple:
    """What a worker's line says, without the ages that differ from worker to worker."""
    collective = worker["collective"] or worker["last_collective"]
    age = worker["heartbeat_age_s"]
    return (
        worker["pid"] is None,
        worker["phase"],
        ("in" if worker["collective"] else "last", collective_name(collective)) if collective else None,
        age is not None and age > SILENT_S,
        bool(worker.get("waits_for_culprit")),
        tuple(worker["host"]) if worker.get("host") else None,
    )


def group_text(workers: list[dict]) -> str:
    """The state the `workers` of one group share, with the spread of their ages."""
    first = workers[0]
    if first["pid"] is None:
        return "not started: no heartbeat yet"
    phase_ages = [w["phase_age_s"] or 0.0 for w in workers]
    text = f"in {first['phase']} for {spread(phase_ages)} s" if first["phase"] else "idle between calls"
    collective = first["collective"] or first["last_collective"]
    if collective:
        text += f"; {'in' if first['collective'] else 'last'} {collective_name(collective)}"
    ages = [w["heartbeat_age_s"] for w in workers if w["heartbeat_age_s"] is not None]
    text += f"; heartbeat {spread(ages)} s ago" if ages else ""
    text += "; waits for the culprit" if first.get("waits_for_culprit") else ""
    return text + (f"; runs in {describe(tuple(first['host']))}" if first.get("host") else "")


def spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"


def grouped_worker_lines(workers: list[dict], worker_line) -> list[str]:
    """The culprit's line first, then a line per group of workers in the same state (largest
    first), the members of small groups spelled out by `worker_line` (hang_report's own)."""
    groups: dict[tuple, list[dict]] = {}
    for worker in workers:
        groups.setdefault(state_of(worker), []).append(worker)
    lines = [worker_line(w) for w in workers if w["culprit"]]
    for members in sorted(groups.values(), key=lambda g: (-len(g), g[0]["component"], g[0]["rank"])):
        rest = [w for w in members if not w["culprit"]]
        if len(rest) <= LISTED:
            lines += [worker_line(w) for w in rest]
        elif rest:
            keys = [(w["component"], w["rank"]) for w in rest]
            nodes = rank_ranges(w["node"] for w in rest if w["node"] is not None)
            lines.append(f"    {describe_many(keys)} on nodes {nodes}: {group_text(rest)}")
    return lines


def grouped_stacks(workers: list[dict]) -> list[str]:
    """Each distinct stack once, under the workers that share it; the culprit's first."""
    shared: dict[str, list[dict]] = {}
    for worker in sorted(workers, key=lambda w: not w["culprit"]):
        if not worker.get("host"):  # a hosted worker's stack is its process's
            shared.setdefault(worker["stack"].rstrip(), []).append(worker)
    lines = []
    for stack, members in shared.items():
        lines += [f"--- stack of {describe_many((w['component'], w['rank']) for w in members)} ---", stack, ""]
    return lines


def grouped_columns(table: dict, texts: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The collectives table's ranks merged where their columns read the same: column names and
    the rows' cells per merged column."""
    columns: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for index, rank in enumerate(table["ranks"]):
        component, number = rank.split("/")
        columns.setdefault(tuple(row[index] for row in texts), []).append((component, int(number)))
    names = [describe_many(keys) for keys in columns.values()]
    return names, [[column[i] for column in columns] for i in range(len(texts))]

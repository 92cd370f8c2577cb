"""The hang report's table of the actor ranks' recent collectives, aligned by sequence number: one
row per (group, #n), one column per rank — done, in flight (for how long), not entered, or not a
member of that group — so the rank that is behind, or the one that made an extra collective, shows
at a glance. Where the run has a weight-sync group (parallel/sync_group.py), every rollout worker
has a column too."""

from __future__ import annotations

from fleetrl.watch.judging.alignment import (
    PROCESS_GROUP_MEMBERS,
    WEIGHT_SYNC_GROUPS,
    collectives,
    entered,
    is_member,
    waited_s,
)
from fleetrl.watch.naming import describe
from fleetrl.watch.reporting.report_groups import GROUPED, grouped_columns


def cell(key: tuple[str, int], record: dict, group: str, seq: int, found: dict | None) -> dict:
    if found is None and not is_member(key, record, group):
        return {"state": "-"}
    if found is None:
        return {"state": "not entered" if entered(record, group) < seq else "(not kept)"}
    state = "done" if found.get("finished") else "in flight"
    fields = {key: found.get(key) for key in ("op", "call_site", "started", "finished")} | {"state": state}
    if state == "in flight" and "heartbeat_age_s" in record:  # how long, on the watcher's clock
        fields["waited_s"] = waited_s(record, found, record["time"])
    return fields


def aligned_collectives(records: dict) -> dict:
    """{"ranks": ["actor/0", ...], "rows": [{"group", "seq", "cells": {rank: cell}}]} for every
    (group, seq) some actor rank still keeps; where the run has a weight-sync group (some rank
    entered it), every rollout worker's too — the one that never reached it included."""
    sync_group = any(entered(record, group) for record in records.values() for group in WEIGHT_SYNC_GROUPS)
    ranks = {
        key: record
        for key, record in sorted(records.items())
        if key[0] in PROCESS_GROUP_MEMBERS or (sync_group and key[0] == "rollout")
    }
    kept: dict[tuple[str, int], dict] = {}  # (group, seq) → {rank key: its entry}
    for key, record in ranks.items():
        log = collectives(record)
        for found in [*log.get("recent", []), *log.get("in_flight", [])]:
            kept.setdefault((found["group"], found["seq"]), {})[key] = found
    rows = [
        {
            "group": group,
            "seq": seq,
            "cells": {f"{k[0]}/{k[1]}": cell(k, r, group, seq, kept[(group, seq)].get(k)) for k, r in ranks.items()},
        }
        for group, seq in sorted(kept)
    ]
    return {"ranks": [f"{k[0]}/{k[1]}" for k in ranks], "rows": rows}


def render_table(table: dict, now: float) -> list[str]:
    """The table as text lines (none when no actor rank made a collective). Past `GROUPED` ranks,
    one column per set of ranks whose cells read the same, without the seconds waited
    (watch/reporting/report_groups.py)."""
    if not table["rows"]:
        return []
    grouped = len(table["ranks"]) > GROUPED
    texts = [[cell_text(row["cells"][rank], now, not grouped) for rank in table["ranks"]] for row in table["rows"]]
    if grouped:
        names, texts = grouped_columns(table, texts)
    else:
        names = [describe((rank.split("/")[0], int(rank.split("/")[1]))) for rank in table["ranks"]]
    width = max(len(text) for text in [*names, *(t for row in texts for t in row)]) + 2
    lines = [
        "collectives of the actor ranks, aligned by sequence number:",
        f"  {'group':<8}{'seq':>6}  " + "".join(f"{name:<{width}}" for name in names).rstrip(),
    ]
    for row, cells in zip(table["rows"], texts):
        lines.append(
            f"  {row['group']:<8}{'#' + str(row['seq']):>6}  " + "".join(f"{t:<{width}}" for t in cells).rstrip()
        )
    return lines


def cell_text(found: dict, now: float, timed: bool = True) -> str:
    state = found["state"]
    if state == "in flight" and not timed:
        state = "IN FLIGHT"
    elif state == "in flight":
        waited = found.get("waited_s", now - found["started"])  # (a report written before waited_s)
        state = f"IN FLIGHT {waited:.1f} s"
    return f"{found['op']} {state}" if found.get("op") else state


def render_torch_traces(workers: list[dict]) -> list[str]:
    """One line per rank with torch's own flight recorder on: per group the last collective
    enqueued and completed, and the ones in flight."""
    lines = []
    for worker in workers:
        trace = worker.get("torch_trace")
        if not trace:
            continue
        groups = ", ".join(
            f"{group} enqueued #{seq}, completed #{trace['completed'].get(group, 0)}"
            for group, seq in trace["entered"].items()
        )
        waiting = "; ".join(f"{e['op']} #{e['seq']} of {e['group']} (shapes {e['shapes']})" for e in trace["in_flight"])
        who = describe((worker["component"], worker["rank"]))
        lines.append(f"  {who}: {groups}" + (f"; in flight: {waiting}" if waiting else ""))
    return ["torch's flight recorder (TORCH_FR_BUFFER_SIZE):", *lines] if lines else []

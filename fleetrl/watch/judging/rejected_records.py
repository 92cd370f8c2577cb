"""A worker whose own heartbeat records are rejected: how the watchdog judges what it cannot read.

The store drops a record that is sealed with the run's secret — so written by the worker itself —
but is not a heartbeat the watchdog can compute with (a field of another type: another fleetrl
version on the worker's node, a bug), and keeps the worker's last good record, with a count of
the rejected ones, why the newest was rejected, and when (`rejected`, probe/store.py). That last
good record then ages as a frozen worker's would, and the phase it names is stale.

What a rejected record still proves: it arrived, so the worker's publishing thread runs — the
process is neither stopped nor holding the GIL, and is alive. Judging it frozen would kill a
process that may be training well, and a false kill of a healthy run costs more than a late
report. So while its rejected records keep arriving (within `heartbeat_timeout_s`), it is not
judged frozen, nor is the stale phase's deadline judged (no fresh beats: watch/judging/judgement.py);
an error in the log says it cannot be watched. Unwatched, though, it could hang unseen; so the run
is stopped only once this has lasted `busy_allowance_s` — the bound a computing call gets before
it is an incident — as `watchdog_error` (the run can no longer be watched), naming the worker and
the reason. When its rejected records stop arriving too, it is frozen as any silent worker is,
and the `process_frozen` report says its records were rejected before.
"""

from __future__ import annotations

import logging

from fleetrl.watch.naming import describe, where

log = logging.getLogger("fleetrl")


def arriving(record: dict, timeout_s: float) -> bool:
    """The worker's rejected records arrived within `timeout_s`: it publishes."""
    rejected = record.get("rejected")
    return rejected is not None and rejected["last_s"] <= timeout_s


def unwatched_s(record: dict) -> float:
    """How long the worker's records have been rejected (since its first rejected one)."""
    return record["rejected"]["for_s"]


def text(record: dict) -> str:
    """'its heartbeat records are rejected: <why> (N since its last good one, over T s)'."""
    rejected = record["rejected"]
    return (
        f"its heartbeat records are rejected: {rejected['reason']} "
        f"({rejected['records']} since its last good one, over {rejected['for_s']:.0f} s)"
    )


def note(record: dict) -> str:
    """For a silent worker's report: '; before it went silent, <text>', or '' if none were."""
    return f"; before it went silent, {text(record)}" if record.get("rejected") else ""


def past_allowance(key: tuple[str, int], record: dict, allowance_s: float, warned: set) -> str | None:
    """The incident's summary once `key`'s records have been rejected for `allowance_s`; before,
    None, and an error logged once (`warned`: the workers it was logged for)."""
    if unwatched_s(record) > allowance_s:
        return (
            f"{describe(key)} (pid {record['pid']}) cannot be watched: {text(record)}; they still arrive, so it "
            f"was not judged frozen, but unwatched past watchdog.busy_allowance_s ({allowance_s:g} s) the run is "
            f"stopped; its last good record: {where(record)}"
        )
    if key not in warned:
        warned.add(key)
        log.error(
            "%s cannot be watched: %s; they still arrive, so it is not judged frozen, but the run is stopped if "
            "this lasts watchdog.busy_allowance_s (%g s)",
            describe(key),
            text(record),
            allowance_s,
        )
    return None

"""A lost node: a whole machine gone at once, told apart from one frozen or dead process.

A worker on another machine cannot be looked up by pid from here. What can be asked from here is
whether its node still runs Ray: each worker's heartbeat names its node's raylet (`raylet`,
from `FLEETRL_RAYLET` that the Ray backend sets), and a raylet that refuses or ignores a TCP
connection means the node is down — a crash, a power loss, a kernel panic, all its processes at
once. A stopped or busy process still has a raylet that answers, so it stays `process_frozen`.
"""

from __future__ import annotations

import socket

from fleetrl.watch.naming import describe_many


def raylet_answers(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def node_lost(records: dict, key: tuple[str, int], now: float) -> tuple[tuple[str, int], str] | None:
    """The `node_lost` incident's culprit and summary when the node of worker `key` no longer runs
    Ray (naming the node and every worker it held); None while its raylet answers, or when the
    worker's record names no raylet (inline workers, runs before this field). The culprit is the
    node's first worker by key, whichever of its workers fell silent first: one lost node is one
    report, the same however its workers' last heartbeats raced."""
    record = records[key]
    raylet = record.get("raylet")
    if not raylet or raylet_answers(raylet):
        return None
    held = sorted(k for k, r in records.items() if r.get("raylet") == raylet)
    workers = describe_many(held)
    return held[0], (
        f"node {record['node']} ({record.get('host', '?')}) is lost: its Ray node manager at {raylet} "
        f"does not answer, and its workers ({workers}) stopped {now - record['time']:.1f} s ago"
    )


def lost_node(records: dict, now: float) -> tuple[tuple[str, int], str] | None:
    """The culprit and summary of the first node (by its workers' keys) that no longer runs Ray;
    None while every node's raylet answers. Each raylet is asked once."""
    asked = set()
    for key in sorted(records):
        raylet = records[key].get("raylet")
        if not raylet or raylet in asked:
            continue
        asked.add(raylet)
        lost = node_lost(records, key, now)
        if lost is not None:
            return lost
    return None

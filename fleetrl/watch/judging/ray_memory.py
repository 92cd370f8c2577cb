"""Workers that Ray's memory monitor killed: named as such, with the node's memory, not as a
mystery death or the controller's own error.

When a node's memory use passes the monitor's threshold (`RAY_memory_usage_threshold`, 0.95 of
the node's memory by default), the raylet SIGKILLs workers it chooses: nothing reaches their
stderr, so their last words say only that they ended without a signal or an error. What does say
why is the `OutOfMemoryError` their callers get: the node's use and limit, the threshold, and each
worker chosen, with its task's name — for fleetrl's actors `fleetrl-<component>-<rank>-<driver
pid>` — its pid and its own memory. Read from that text, the report names the killed workers, the
node's memory, and how much of it this run's killed workers held: on a node shared with other
jobs, usually a small part, which tells the user that the memory is someone else's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.last_words import UNEXPLAINED_END
from fleetrl.watch.naming import describe

RAY_KILLED = re.compile(r"worker\(s\) were killed due to the node running low on memory")
NODE_USE = re.compile(r"Memory on the node \(IP: ([^,]+), ID: \w+\) was ([\d.]+)GB used / ([\d.]+)GB limit")
THRESHOLD = re.compile(r"exceeded threshold of \d+B \(([\d.]+)% of \d+B limit\)")
VICTIM = re.compile(
    r"Selected to kill: .*?task name=fleetrl-(\w+)-(\d+)-\d+:.*?pid=(\d+), actual memory used=([\d.]+)GB"
)
MEMORY_HINT = (
    "Ray's memory monitor kills workers once the node's memory use passes its threshold, whoever holds "
    "the memory. Free memory on the node (other jobs' processes), run on a node with more memory, or "
    "use less (fewer envs per worker, smaller minibatches); RAY_memory_usage_threshold, set where Ray "
    "starts, moves the threshold (RAY_memory_monitor_refresh_ms=0 turns the monitor off)."
)


@dataclass(frozen=True)
class Victim:
    key: tuple[str, int]  # (component, rank)
    pid: int
    used_gb: float


@dataclass(frozen=True)
class NodeUse:
    node: str
    used_gb: float
    limit_gb: float


@dataclass(frozen=True)
class MemoryKill:
    """What Ray's `OutOfMemoryError` says: the node and its memory in use and limit (GB), the
    threshold (percent of the node's memory) and the fleetrl workers it killed. The node's line
    or the threshold can be missing from a message (another Ray version's wording): then None,
    and the report says only what the message did."""

    node_use: NodeUse | None
    threshold_pct: float | None
    victims: tuple[Victim, ...]

    def ended(self) -> str:
        """How the killed workers ended, for a dead worker's summary."""
        said = []
        if self.node_use is not None:
            use = self.node_use
            said.append(f"node {use.node} had {use.used_gb:g} of {use.limit_gb:g} GB of memory in use")
        if self.threshold_pct is not None:
            said.append(f"over its kill threshold of {self.threshold_pct:g} % of the node's memory")
        return "killed by Ray's memory monitor" + (f": {', '.join(said)}" if said else "")

    def account(self) -> str:
        """Which of this run's workers it killed and how much of the node's memory they held."""
        if not self.victims:
            return "none of the workers it killed was named in Ray's error"
        held = sum(v.used_gb for v in self.victims)
        each = ", ".join(f"{describe(v.key)} (pid {v.pid}, {v.used_gb:g} GB)" for v in self.victims)
        share = f"{held:.2f} of the {self.node_use.used_gb:g} GB in use" if self.node_use else f"{held:.2f} GB"
        return f"it killed {len(self.victims)} worker(s) of this run: {each}, together {share}"

    def incident(self, records: dict, now: float, error: str) -> Incident:
        """`worker_died` naming the first killed worker, for a controller that got the error
        itself (a worker killed while it started, before any heartbeat showed it)."""
        culprit = self.victims[0] if self.victims else None
        key = culprit.key if culprit else None
        started = now - records.get(key, {}).get("heartbeat_age_s", 0.0) if key else now
        who = f"{describe(key)} (pid {culprit.pid})" if culprit else "a worker"
        summary = f"{who} died: {self.ended()}; {self.account()}"
        return Incident("worker_died", summary, started, key, f"{MEMORY_HINT}\n\n{error}")


def memory_kill(text: str) -> MemoryKill | None:
    """The memory monitor's kill that `text` (an error's message) reports, or None."""
    if not RAY_KILLED.search(text):
        return None
    use = NODE_USE.search(text)
    threshold = THRESHOLD.search(text)
    victims: dict[int, Victim] = {}  # Ray repeats the list in the error's cause: by pid, once
    for component, rank, pid, used in VICTIM.findall(text):
        victims.setdefault(int(pid), Victim((component, int(rank)), int(pid), float(used)))
    return MemoryKill(
        NodeUse(use.group(1), float(use.group(2)), float(use.group(3))) if use else None,
        float(threshold.group(1)) if threshold else None,
        tuple(victims.values()),
    )


def explain_death(dead: Incident, echo: str) -> Incident:
    """`dead` (a worker the watchdog found gone, its stderr silent) with the memory monitor's
    kill that `echo` — the error its peers or the controller got — reports, if any: its summary
    says how it ended and what the monitor killed, its detail leads with what to do."""
    kill = memory_kill(echo)
    if kill is None or dead.cause != "worker_died":
        return dead
    if dead.culprit in {v.key for v in kill.victims} and UNEXPLAINED_END in dead.summary:
        summary = dead.summary.replace(UNEXPLAINED_END, kill.ended())
        if dead.last_words:
            dead.last_words = {**dead.last_words, "ended": kill.ended()}
    else:
        summary = f"{dead.summary}; {kill.ended()}"
    dead.summary = f"{summary}; {kill.account()}"
    dead.detail = f"{MEMORY_HINT}\n\n{dead.detail}"
    return dead

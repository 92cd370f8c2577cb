"""Which rank holds up a process group: the ranks lined up by collective sequence number.

A rank whose oldest collective in flight, `g` #n, has waited longer than
`watchdog.collective_timeout_s` waits for every rank of group `g` that has not entered #n. Each
rank's heartbeat says, per group, the last number it entered (probe/collectives.py), so:

1. A peer that never entered #n and is still inside a call is *behind*: it is the culprit
   (`rank_missing_from_collective`), and the ranks in #n are named as waiting for it — not, as a
   deadline alone would have it, the waiting ranks that overran their phase first.
2. A peer that never entered #n and has *finished* its call either skipped collectives the others
   make (an early return on local data) or the waiting ranks made one too many (a rank-dependent
   extra collective or optimisation step): the sequence numbers look the same either way. The
   rank whose count of collectives in this call departs from the call before is the culprit.
   On a phase's first call there is no call before: a peer that made no collective at all in
   the call skipped them (an extra collective comes beside the ones every rank makes, never
   instead of all of them); else the larger side of the group is taken as right; with as many
   on each side the waiting rank is named and the summary says it may be the other way round.
3. A peer inside #n with another op or other shapes: `collective_mismatch`.

The process-group join is a collective too (group `join`, probe/collectives.py): a rank inside
it waits for every actor rank that has not entered it, judged after the start-up step allowance
(ranks reach the join seconds apart while they start) rather than `collective_timeout_s`. The
weight-sync group (groups `weight_sync` and its join `weight_sync join`: parallel/sync_group.py) has
for members actor rank 0 and every rollout worker, whether or not they have entered it yet: a
rollout worker that never reaches a sync's broadcast is named as an actor rank would be. And a
rank that is past its own deadline while a peer waits for it in a collective is named by rule 1
too (`held_up_by`): the fault is the same whichever of the two deadlines falls first.

How long a rank has waited is measured as the watcher measures heartbeat ages (watch/judging/judgement.py),
never by subtracting the rank's clock from the watcher's: the rank's own elapsed time from entering
the collective to its last beat, plus the age of that beat on the watcher's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.probe.collectives import DEFAULT_GROUP, JOIN_GROUP, WEIGHT_SYNC_GROUP, WEIGHT_SYNC_JOIN
from fleetrl.watch.naming import collective_name, collective_text, describe, describe_many, where

# Components whose ranks form the actor process group: actor workers, or fused ranks
# (cluster/backends/fused.py) that host an actor rank with its env and rollout.
PROCESS_GROUP_MEMBERS = ("actor", "fused")
# The weight-sync group's members: actor rank 0 and every rollout worker
WEIGHT_SYNC_GROUPS = (WEIGHT_SYNC_GROUP, WEIGHT_SYNC_JOIN)

Key = tuple[str, int]


@dataclass(frozen=True)
class Finding:
    cause: str  # rank_missing_from_collective | collective_mismatch
    summary: str
    started: float  # when the waiting began
    culprit: Key
    waiting: tuple[Key, ...]  # the ranks held up by the culprit


def collectives(record: dict) -> dict:
    """The rank's collectives: torch's own recorder's view where it is authoritative (NCCL,
    probe/torch_trace.py), else fleetrl's log."""
    trace = record.get("torch_trace")
    return trace if trace and trace.get("authoritative") else record.get("collectives") or {}


def oldest_in_flight(record: dict) -> dict | None:
    in_flight = collectives(record).get("in_flight")
    return in_flight[0] if in_flight else None


def entered(record: dict, group: str) -> int:
    return collectives(record).get("entered", {}).get(group, 0)


def entry(record: dict, group: str, seq: int) -> dict | None:
    """This rank's collective `group` #`seq`, where it is still in flight or among the recent."""
    log = collectives(record)
    for candidate in [*log.get("in_flight", []), *reversed(log.get("recent", []))]:
        if (candidate["group"], candidate["seq"]) == (group, seq):
            return candidate
    return None


def in_flight(record: dict, group: str, seq: int) -> bool:
    return any((e["group"], e["seq"]) == (group, seq) for e in collectives(record).get("in_flight", []))


def is_member(key: Key, record: dict, group: str) -> bool:
    """Whether the rank `key` (its `record`) belongs to `group`: actor rank 0 and every rollout
    worker to the weight-sync group; every actor rank to the default group and its join; to
    another (an FSDP sub-mesh), the actor ranks that have used it."""
    if group in WEIGHT_SYNC_GROUPS:
        return key == ("actor", 0) or key[0] == "rollout"
    return key[0] in PROCESS_GROUP_MEMBERS and (group in (DEFAULT_GROUP, JOIN_GROUP) or entered(record, group) > 0)


def members(records: dict, group: str) -> dict[Key, dict]:
    """The ranks of `group` (`is_member`)."""
    return {key: record for key, record in sorted(records.items()) if is_member(key, record, group)}


def last_entered_text(record: dict, group: str) -> str:
    seq = entered(record, group)
    if seq == 0:
        return "it has entered no collective yet"
    last = entry(record, group, seq)
    return f"its last collective is {collective_name(last) if last else f'#{seq}'}"


def waited_s(record: dict, entry: dict, now: float) -> float:
    """How long the rank of `record` has been in collective `entry`, on the watcher's clock. A
    record the watcher has not annotated (no `heartbeat_age_s`) is read on its own clock against
    `now`, which must then be the rank's."""
    age = record.get("heartbeat_age_s")
    if age is None or "time" not in record:
        return now - entry["started"]
    return record["time"] - entry["started"] + age


def patience_s(entry: dict, timeout_s: float, join_timeout_s: float) -> float:
    """How long a rank may wait in collective `entry` before the ranks it waits for are named."""
    return join_timeout_s if entry["group"] in (JOIN_GROUP, WEIGHT_SYNC_JOIN) else timeout_s


def behind_peers(records: dict, key: Key) -> list[Key]:
    """The ranks of the group that `key`'s oldest collective in flight waits for (none if it has
    none in flight)."""
    waiting = oldest_in_flight(records[key])
    if not waiting:
        return []
    group, seq = waiting["group"], waiting["seq"]
    return [peer for peer, record in members(records, group).items() if entered(record, group) < seq]


def waits_for(records: dict, key: Key, culprit: Key) -> bool:
    """`culprit in behind_peers(records, key)`, without lining up the whole group: a report asks
    it of every worker, and at 1,024 workers the group for each made the report quadratic (~2 s)."""
    waiting = oldest_in_flight(records[key])
    if not waiting or culprit not in records or not is_member(culprit, records[culprit], waiting["group"]):
        return False
    return entered(records[culprit], waiting["group"]) < waiting["seq"]


def diagnose(records: dict, now: float, timeout_s: float, join_timeout_s: float | None = None) -> Finding | None:
    """The rank that holds up a collective waited in for longer than `timeout_s` (the join:
    `join_timeout_s`, by default `timeout_s` too), if any."""
    join_timeout_s = timeout_s if join_timeout_s is None else join_timeout_s
    stalled = {
        key: waiting
        for key, record in sorted(records.items())
        if (waiting := oldest_in_flight(record))
        and is_member(key, record, waiting["group"])
        and waited_s(record, waiting, now) > patience_s(waiting, timeout_s, join_timeout_s)
    }
    if not stalled:
        return None
    key, waiting = min(stalled.items(), key=lambda item: (item[1]["seq"], item[0]))
    group, seq = waiting["group"], waiting["seq"]
    began = now - waited_s(records[key], waiting, now)  # on the watcher's clock
    ranks = members(records, group)
    waiters, waits = waiting_in(ranks, waiting)
    behind = [k for k, r in ranks.items() if entered(r, group) < seq]
    for peer in behind:
        if ranks[peer].get("phase"):
            return missing(ranks[peer], peer, waiting, waiters, waits, began)
    if behind:
        return finished_peer(records, key, waiting, waiters, behind, waits, began)
    for peer, record in ranks.items():
        theirs = entry(record, group, seq)
        if theirs and (theirs["op"], theirs["shapes"]) != (waiting["op"], waiting["shapes"]):
            return Finding(
                "collective_mismatch",
                f"{'actor rank 0 and the rollout workers' if group in WEIGHT_SYNC_GROUPS else 'actor ranks'} "
                f"disagree on collective #{seq}: {describe(key)} is in {collective_text(waiting)}, "
                f"{describe(peer)} in {collective_text(theirs)}",
                max(began, now - waited_s(record, theirs, now)),
                peer,
                (key,),
            )
    return None


def waiting_in(ranks: dict[Key, dict], waiting: dict) -> tuple[tuple[Key, ...], str]:
    """The ranks of `ranks` in collective `waiting`, and the words that say so (hundreds of
    waiting ranks as ranges: naming.describe_many)."""
    waiters = tuple(k for k, r in ranks.items() if in_flight(r, waiting["group"], waiting["seq"]))
    verb = "waits" if len(waiters) == 1 else "wait"
    return waiters, f"{describe_many(waiters)} {verb} in {collective_text(waiting)}"


def missing(record: dict, peer: Key, waiting: dict, waiters: tuple[Key, ...], waits: str, began: float) -> Finding:
    """Rule 1: `peer` (its `record`), still inside a call, never entered `waiting`."""
    return Finding(
        "rank_missing_from_collective",
        f"{describe(peer)} is behind: {last_entered_text(record, waiting['group'])}, and it is {where(record)}; {waits}",
        began,
        peer,
        waiters,
    )


def held_up_by(records: dict, key: Key, now: float) -> Finding | None:
    """Rule 1 for `key`, a rank inside a call, where a peer of one of its groups waits for it in a
    collective it has not entered — however briefly the peer has waited: `key` is past its own
    deadline, and the same fault should have the same name whichever deadline falls first."""
    if not records[key].get("phase"):
        return None
    for peer in sorted(records):
        waiting = oldest_in_flight(records[peer])
        if peer == key or not waiting or not is_member(peer, records[peer], waiting["group"]):
            continue
        if waits_for(records, peer, key):
            waiters, waits = waiting_in(members(records, waiting["group"]), waiting)
            return missing(records[key], key, waiting, waiters, waits, now - waited_s(records[peer], waiting, now))
    return None


def finished_peer(
    records: dict, key: Key, waiting: dict, waiters: tuple[Key, ...], behind: list[Key], waits: str, began: float
) -> Finding:
    """Rule 2: the peers in `behind` finished their call without entering `waiting` (at `began`,
    on the watcher's clock)."""
    record, peer = records[key], behind[0]
    phase, made = record.get("phase"), record.get("collectives_in_call")
    before = record.get("call_collectives", {}).get(phase)  # its previous call of the same phase
    peer_record = records[peer]
    same_call = peer_record.get("phase_counts", {}).get(phase) == record.get("phase_counts", {}).get(phase)
    peer_made = peer_record.get("call_collectives", {}).get(phase) if same_call else None
    call = f"call {record.get('phase_counts', {}).get(phase)} of {phase}"
    extra_made = before is not None and made is not None and made > before
    skipped = before is not None and peer_made is not None and peer_made < before
    skipped_all = before is None and peer_made == 0 and bool(made)
    if not extra_made and (skipped or skipped_all or (before is None and len(waiters) > len(behind))):
        if skipped:
            how = (
                f"it finished {call} after {peer_made} collective(s), {before} in the call before: "
                "it skipped collectives the others make"
            )
        elif skipped_all:
            how = (
                f"it finished {call} without any collective, while {describe(key)} entered {made} in it: "
                "it skipped the call's collectives"
            )
        else:
            how = f"it finished {call} without entering #{waiting['seq']}, which most ranks entered"
        return Finding(
            "rank_missing_from_collective",
            f"{describe(peer)} is behind: {how} ({last_entered_text(peer_record, waiting['group'])}); {waits}",
            began,
            peer,
            waiters,
        )
    if extra_made:
        why = f"{made} collectives in {call}, {before} in the call before"
    elif before is None and len(waiters) < len(behind):
        why = f"{len(behind)} of {len(behind) + len(waiters)} ranks finished without it"
    else:
        why = f"or {describe(peer)} skipped collectives the others make: the counts per call cannot tell"
    return Finding(
        "collective_mismatch",
        f"{describe(key)} waits in {collective_text(waiting)}, which no other rank will enter: "
        f"{describe(peer)} finished its call after collective #{entered(peer_record, waiting['group'])}. "
        f"{describe(key)} made more collectives (or optimisation steps) than the others ({why})",
        began,
        key,
        tuple(behind),
    )

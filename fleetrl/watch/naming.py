"""How the watchdog and the hang report name a worker, what it is doing, and a collective — the
same words in an incident's summary, the report's worker lines and its collectives table."""

from __future__ import annotations

from fleetrl.probe.collectives import DEFAULT_GROUP


def describe(key: tuple[str, int]) -> str:
    return f"{key[0]} rank {key[1]}"


LISTED = 3  # up to this many workers are named one by one; more are summarised by rank ranges


def rank_ranges(ranks) -> str:
    """'0-127,129-255' for ranks 0..255 without 128: hundreds of ranks in a line a person reads."""
    ordered, spans = sorted(set(ranks)), []
    for rank in ordered:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def describe_many(keys) -> str:
    """'actor rank 0, actor rank 1', or past `LISTED` workers '255 ranks (actor ranks 0-127,129-255)'
    — per component, so that a culprit named beside them stands out instead of drowning in a list."""
    keys = list(keys)
    if len(keys) <= LISTED:
        return ", ".join(describe(key) for key in keys)
    components = sorted({component for component, _ in keys})
    parts = [f"{c} ranks {rank_ranges(r for k, r in keys if k == c)}" for c in components]
    return f"{len(keys)} ranks ({'; '.join(parts)})"


def where(record: dict) -> str:
    """What the worker was doing, from a record the watchdog annotated with its ages."""
    phase = record.get("phase")
    if not phase:
        return "idle between calls"
    age = record.get("phase_age_s")  # None: a record the watchdog has not seen (it is off)
    return f"in {phase}" if age is None else f"in {phase} for {age:.1f} s"


def doing(key: tuple[str, int], record: dict, records: dict) -> str:
    """What worker `key`, found dead, was doing: the call a watched process (the controller) sent
    it and waits on (`waiting_on` in that process's record: probe/flight_recorder.py), for as long
    as it was sent ago — unless the worker's own last heartbeat came after that call was sent and
    shows it in a phase (that call, one inside it, or one before it not yet ended), which says
    more. Its heartbeat alone where nothing waits on it. On a loaded host a worker's heartbeat
    thread can go seconds without a turn: its last beat then predates the call it died in."""
    sent = sent_call(key, records)
    if sent is None or (record.get("phase") and record["heartbeat_age_s"] < sent[1]):
        return where(record)
    phase, age = sent
    return f"in {phase} for {age:.1f} s"


def sent_call(key: tuple[str, int], records: dict) -> tuple[str, float] | None:
    """(phase, seconds since it was sent) of a call to worker `key` that a watched process waits
    on, from that process's record as the watchdog annotated it (its heartbeat's age added)."""
    for waiter in records.values():
        for call in waiter.get("waiting_on", ()):
            if call["component"] == key[0] and key[1] in call["ranks"]:
                return call["phase"], call["elapsed_s"] + waiter["heartbeat_age_s"]
    return None


def collective_name(collective: dict) -> str:
    """'all_reduce (ddp grad bucket 0) #73', with the group where it is not the default one."""
    group = collective.get("group", DEFAULT_GROUP)
    return f"{collective['op']} #{collective['seq']}" + ("" if group == DEFAULT_GROUP else f" of group {group}")


def collective_text(collective: dict) -> str:
    return f"{collective_name(collective)} ({collective['call_site']}, shapes {collective['shapes']})"

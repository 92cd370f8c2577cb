"""How the watchdog and the hang report name a worker, what it is doing, and a collective — the
same words in an incident's summary, the report's worker lines and its collectives table."""

from __future__ import annotations

from fleetrl.probe.collectives import DEFAULT_GROUP


def describe(key: tuple[str, int]) -> str:
    return f"{key[0]} rank {key[1]}"


def where(record: dict) -> str:
    """What the worker was doing, from a record the watchdog annotated with its ages."""
    phase = record.get("phase")
    if not phase:
        return "idle between calls"
    age = record.get("phase_age_s")  # None: a record the watchdog has not seen (it is off)
    return f"in {phase}" if age is None else f"in {phase} for {age:.1f} s"


def collective_name(collective: dict) -> str:
    """'all_reduce (ddp grad bucket 0) #73', with the group where it is not the default one."""
    group = collective.get("group", DEFAULT_GROUP)
    return f"{collective['op']} #{collective['seq']}" + ("" if group == DEFAULT_GROUP else f" of group {group}")


def collective_text(collective: dict) -> str:
    return f"{collective_name(collective)} ({collective['call_site']}, shapes {collective['shapes']})"

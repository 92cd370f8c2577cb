"""PyTorch's own flight recorder of collectives, switched on for the actor ranks and summarised
into the heartbeat — not a hand-written copy of it.

c10d records every collective of every process group in a ring buffer when `TORCH_FR_BUFFER_SIZE`
(`TORCH_NCCL_TRACE_BUFFER_SIZE` before torch 2.8) is set before the group is created — NCCL and,
in torch 2.13, Gloo alike. `torch._C._distributed_c10d._dump_fr_trace` returns it as a pickle
(torch's format, `torch.distributed.flight_recorder`; version 2.10 here): `pg_status`, per group
the last collective sequence id enqueued, started and completed, and `entries`, each collective
with its sequence id, op (`nccl:all_reduce`), sizes, creation time and state.

Why both this and fleetrl's own log (probe/collectives.py): on NCCL a collective's Future
completes when its kernel is *enqueued*, so the Python-side log cannot see a rank blocked on the
GPU; torch's recorder learns completion from the CUDA events, so on NCCL its view is the one the
alignment uses (`authoritative`). On Gloo the Future completes when the reduction has, and the
Python log (with call sites and DDP bucket indices) is used; torch's view rides along.

Cost: every heartbeat reads `pg_status` only (a dump without entries: microseconds; with its
256 entries it costs milliseconds, benchmarks/costs/collective_log.py). A collective in flight is timed
from the first beat that saw it (so to within one heartbeat interval); the entries are dumped only
once one has been in flight for `DETAIL_AFTER_S`, to name its op and sizes.
"""

from __future__ import annotations

import os
import pickle
import time

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
BUFFER_SIZE = 256  # entries kept by torch: the last few training steps' collectives
RECENT = 12  # entries carried in the heartbeat
DETAIL_AFTER_S = 1.0  # in flight this long: dump the entries to name it


def enable(buffer_size: int = BUFFER_SIZE) -> None:
    """Turn torch's recorder on for the process groups this process creates from now on (a
    size the user set is kept)."""
    os.environ.setdefault(BUFFER_ENV, str(buffer_size))


def enabled() -> bool:
    return int(os.environ.get(BUFFER_ENV) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) > 0


def dump(entries: bool) -> dict:
    """torch's recorder, as torch documents the dump (never its stack traces). NCCL's groups keep
    theirs apart, timed by CUDA events (`_dump_nccl_trace`; `_dump_fr_trace` holds the other
    backends' and is empty under NCCL — seen on an H100 with torch 2.11)."""
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    dumper = c10d._dump_nccl_trace if nccl else c10d._dump_fr_trace
    return pickle.loads(dumper(includeCollectives=entries, includeStackTraces=False, onlyActive=False))


def group_name(pg_id: str) -> str:
    """fleetrl's name for torch's process group `pg_id`: 'actor' for the default group."""
    return "actor" if str(pg_id) == "0" else f"pg {pg_id}"


def as_entry(record: dict) -> dict:
    """One of torch's entries in the shape of fleetrl's own log's."""
    done = record.get("retired") or record.get("state") == "completed"
    discovered = record.get("time_discovered_completed_ns")
    created = record["time_created_ns"] / 1e9
    return {
        "seq": record["collective_seq_id"],
        "op": record["profiling_name"],
        "group": group_name(record["pg_id"]),
        "shapes": record.get("input_sizes", []),
        "call_site": "torch flight recorder",
        "started": created,
        "finished": (discovered / 1e9 if discovered else created) if done else None,
    }


class TorchTrace:
    """This process's view of torch's recorder, kept between heartbeats."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[str, int], float] = {}  # (group, seq) → first beat it was in flight
        self.detail: dict[tuple[str, int], dict] = {}  # (group, seq) → torch's entry, once dumped
        self.recent: list[dict] = []

    def summary(self) -> dict | None:
        """The heartbeat's `torch_trace` (None where torch's recorder is off or no process group
        exists): per group the last collective entered and completed, the ones in flight (oldest
        first), in the shape of fleetrl's own log; `authoritative` on NCCL."""
        if not enabled():
            return None
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        return self.summarise(dump(entries=False)["pg_status"], dist.get_backend() == "nccl", time.time())

    def summarise(self, status: dict, authoritative: bool, now: float) -> dict:
        entered, completed, in_flight = {}, {}, []
        for pg_id, counters in sorted(status.items()):
            group = group_name(pg_id)
            entered[group] = max(counters["last_enqueued_collective"], 0)
            completed[group] = max(counters["last_completed_collective"], 0)
            in_flight += [self.in_flight(group, seq, now) for seq in range(completed[group] + 1, entered[group] + 1)]
        self.first_seen = {(e["group"], e["seq"]): e["started"] for e in in_flight}
        if any(now - entry["started"] >= DETAIL_AFTER_S and entry["op"] == "?" for entry in in_flight):
            self.fetch_detail(in_flight)
        # The counters may lag behind a completion for good (NCCL's learn of one only when torch's
        # watchdog retires the work; Gloo's were seen stuck two broadcasts behind): an entry the
        # dump found finished stays finished at every later beat, not only at the one that dumped
        done = {key for key, entry in self.detail.items() if entry["finished"] is not None}
        for group, seq in done:
            completed[group] = max(completed[group], seq)
        in_flight = [self.in_flight(e["group"], e["seq"], now) for e in in_flight if (e["group"], e["seq"]) not in done]
        return {
            "authoritative": authoritative,
            "entered": entered,
            "completed": completed,
            "in_flight": in_flight,
            "recent": self.recent,
        }

    def in_flight(self, group: str, seq: int, now: float) -> dict:
        known = self.detail.get((group, seq))
        started = self.first_seen.get((group, seq), now)
        if known is None:
            known = {"seq": seq, "op": "?", "group": group, "shapes": [], "call_site": "torch flight recorder"}
        return known | {"started": min(started, known.get("started", started)), "finished": None}

    def fetch_detail(self, in_flight: list[dict]) -> None:
        entries = [as_entry(e) for e in dump(entries=True)["entries"] if not e.get("is_p2p")]
        wanted = {(e["group"], e["seq"]) for e in in_flight}
        self.detail = {(e["group"], e["seq"]): e for e in entries if (e["group"], e["seq"]) in wanted}
        self.recent = entries[-RECENT:]

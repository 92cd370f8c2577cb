"""fleetrl's summary of torch's own flight recorder (probe/torch_trace.py): torch's per-group
counters may lag behind a completion for good (seen on Gloo in a rehearsal at 1b7d483: two
broadcasts of DDP's construction still 'in flight' by the counters two minutes after the dump
found them finished), so what a dump found finished must stay finished at every later beat, and
what it found unfinished stays in flight, named."""

from __future__ import annotations

from fleetrl.probe.torch_trace import TorchTrace, as_entry

CREATED_NS = 1_000_000_000_000


def entry(seq: int, op: str, state: str) -> dict:
    """One of torch's entries as its dump gives it."""
    return {
        "collective_seq_id": seq,
        "profiling_name": op,
        "pg_id": "0",
        "input_sizes": [[10]],
        "time_created_ns": CREATED_NS + seq,
        "state": state,
    }


def test_what_a_dump_found_finished_stays_finished_while_the_counters_lag():
    trace = TorchTrace()
    # what fetch_detail kept of a dump: seq 2 and 3 finished, seq 4 not
    found = [entry(2, "gloo:broadcast", "completed"), entry(3, "gloo:broadcast", "completed")]
    found += [entry(4, "gloo:all_reduce", "started")]
    trace.detail = {("actor", e["collective_seq_id"]): as_entry(e) for e in found}
    lagging = {"0": {"last_enqueued_collective": 4, "last_completed_collective": 1}}
    for now in (2000.0, 2060.0, 2120.0):  # the beat after the dump, and later ones
        summary = trace.summarise(lagging, False, now)
        assert summary["completed"] == {"actor": 3} and summary["entered"] == {"actor": 4}, summary
        assert [(e["seq"], e["op"], e["finished"]) for e in summary["in_flight"]] == [(4, "gloo:all_reduce", None)]

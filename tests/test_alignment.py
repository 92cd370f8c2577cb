"""The right rank: two real Gloo ranks, real flight recorders and DDP's real gradient hook; one
rank goes wrong the way a user bug does, the other really waits, and the diagnosis aligns their
published records by collective sequence number (tests/alignment_ranks.py)."""

from __future__ import annotations

from functools import partial

import pytest

from fleetrl.net import free_port
from tests.alignment_ranks import CASES, GROUP_TIMEOUT_S, desync, late_join
from tests.ranks import each_scenario, spawn_ranks

# Per call: DDP's gradient bucket, then the metrics all-reduce. DDP's constructor makes no
# recorded collective, so a case's first call enters #1 and #2.
PER_CALL = 2


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    # each case ends by itself (its waits are bounded by WAIT_S); the whole run by one group timeout a case
    return spawn_ranks(
        each_scenario,
        partial(desync, folder=str(folder)),
        list(CASES),
        group_timeout_s=GROUP_TIMEOUT_S,
        timeout_s=len(CASES) * GROUP_TIMEOUT_S,
    )


def free_rank(cases, name) -> dict:
    return next(result[name] for result in cases if result[name] is not None)


BEHIND = ("rank_missing_from_collective", ("actor", 1), (("actor", 0),))  # rank 1 holds up rank 0


def verdict(found: dict) -> tuple:
    return found["cause"], found["culprit"], found["waiting"]


def test_a_rank_blocked_before_its_first_forward_is_named_not_the_rank_waiting_for_it(cases):
    found = free_rank(cases, "block on the first call")
    assert verdict(found) == BEHIND
    assert found["summary"].startswith(
        "actor rank 1 is behind: it has entered no collective yet, and it is in actor.train"
    )
    assert "actor rank 0 waits in all_reduce (ddp grad bucket 0) #1 (" in found["summary"]
    # every deadline passed: the deadline check still blames the blocked rank, not the waiting one,
    # and as the collective miss it is (its peer waits for it), whichever deadline fell first
    assert (found["deadline_cause"], found["deadline_culprit"]) == BEHIND[:2]


def test_torch_s_own_flight_recorder_names_the_same_rank(cases):
    """torch's recorder (on Gloo here, read as it is on NCCL, where it is the one that sees
    completion): the same culprit, with torch's sequence numbers and op names."""
    found = free_rank(cases, "block on the first call")["torch"]
    assert (found["cause"], found["culprit"]) == ("rank_missing_from_collective", ("actor", 1))
    waiting, behind = found["traces"][("actor", 0)], found["traces"][("actor", 1)]
    seq = waiting["entered"]["actor"]
    assert waiting["completed"]["actor"] == behind["entered"]["actor"] == seq - 1  # incl. DDP's own set-up collectives
    assert [(e["seq"], e["op"], e["finished"]) for e in waiting["in_flight"]] == [(seq, "gloo:all_reduce", None)]
    assert waiting["in_flight"][0]["shapes"] == [[10]]  # the gradient bucket: Linear(4, 2)'s 8 + 2
    assert behind["in_flight"] == []
    assert f"; actor rank 0 waits in gloo:all_reduce #{seq} (torch flight recorder, shapes [[10]])" in found["summary"]


def test_a_rank_that_skips_a_ddp_step_is_named_by_its_count_of_collectives(cases):
    found = free_rank(cases, "skip in steady state")
    assert verdict(found) == BEHIND
    last = 2 * PER_CALL
    assert found["summary"].startswith(
        f"actor rank 1 is behind: it finished call 3 of actor.train after 0 collective(s), {PER_CALL} in the call "
        f"before: it skipped collectives the others make (its last collective is all_reduce #{last}); "
        f"actor rank 0 waits in all_reduce (ddp grad bucket 0) #{last + 1} ("
    ), found["summary"]


def test_a_rank_that_skips_its_first_ddp_step_is_named_though_no_call_before_can_be_compared(cases):
    """Two ranks, one each way and no earlier call: the rank that made no collective at all in
    the call skipped them (an extra collective of the waiting rank would come beside its others)."""
    found = free_rank(cases, "skip on the first call")
    assert verdict(found) == BEHIND
    assert found["summary"].startswith(
        "actor rank 1 is behind: it finished call 1 of actor.train without any collective, while actor rank 0 "
        "entered 1 in it: it skipped the call's collectives (it has entered no collective yet); "
        "actor rank 0 waits in all_reduce (ddp grad bucket 0) #1 ("
    ), found["summary"]


def test_a_rank_that_makes_an_extra_collective_is_named(cases):
    found = free_rank(cases, "extra in steady state")
    assert verdict(found) == ("collective_mismatch", ("actor", 1), (("actor", 0),))
    extra = 3 * PER_CALL + 1
    assert found["summary"].startswith(f"actor rank 1 waits in all_reduce #{extra} (")
    assert (
        f"made more collectives (or optimisation steps) than the others ({extra - 2 * PER_CALL} collectives in call 3 of actor.train, {PER_CALL} in the call before)"
        in found["summary"]
    )


def test_the_report_aligns_the_ranks_collectives_by_sequence_number(cases):
    found = free_rank(cases, "skip in steady state")
    report, last = found["report"], 2 * PER_CALL
    rows = {row["seq"]: row["cells"] for row in report["collectives"]["rows"]}
    assert sorted(rows) == list(range(1, last + 2))  # everything either rank made, both kept
    assert {rank: cell["state"] for rank, cell in rows[last].items()} == {"actor/0": "done", "actor/1": "done"}
    assert {rank: cell["state"] for rank, cell in rows[last + 1].items()} == {
        "actor/0": "in flight",
        "actor/1": "not entered",
    }
    assert rows[last + 1]["actor/0"]["op"] == "all_reduce (ddp grad bucket 0)"
    waiting = {w["rank"]: w["waits_for_culprit"] for w in report["workers"]}
    assert waiting == {0: True, 1: False}
    line = next(line for line in found["text"].splitlines() if line.split()[:2] == ["actor", f"#{last + 1}"])
    assert "all_reduce (ddp grad bucket 0) IN FLIGHT" in line and line.rstrip().endswith("not entered")
    torch_lines = found["text"].split("torch's flight recorder (TORCH_FR_BUFFER_SIZE):\n", 1)[1].splitlines()
    assert torch_lines[0].startswith("  actor rank 0: actor enqueued #") and torch_lines[1].startswith(
        "  actor rank 1: "
    )


def test_every_collective_entered_completes_ddp_buckets_included(cases):
    for rank, result in enumerate(cases):
        record = result["completed"]
        log = record["collectives"]
        assert log["entered"] == log["completed"] == {"actor": 2 * PER_CALL}, rank
        assert log["in_flight"] == [] and record["collective"] is None
        assert [entry["op"] for entry in log["recent"]] == ["all_reduce (ddp grad bucket 0)", "all_reduce"] * 2
        assert all(entry["finished"] >= entry["started"] for entry in log["recent"])
        assert record["call_collectives"] == {"actor.train": PER_CALL}


def test_fsdp_all_gathers_and_reduce_scatters_are_recorded_with_their_completion(cases):
    for rank, result in enumerate(cases):
        log = result["fsdp"]["collectives"]
        assert log["in_flight"] == [] and log["entered"] == log["completed"], rank
        fsdp = [entry for entry in log["recent"] if "fsdp" in entry["op"]]
        # per call: the forward's all-gather (the root module stays unsharded until after
        # backward) and the gradients' reduce-scatter
        assert [entry["op"] for entry in fsdp] == ["all_gather (fsdp)", "reduce_scatter (fsdp)"] * 2
        assert all(entry["finished"] >= entry["started"] for entry in fsdp)
        assert len({entry["group"] for entry in fsdp}) == 1
        assert result["fsdp"]["call_collectives"] == {"actor.train": 2}


def test_a_rank_stalled_before_its_process_group_join_is_named_not_the_rank_waiting_in_the_join(tmp_path):
    """The join (rendezvous and connections) is recorded as collective #1 of group `join`: rank 0
    waits in it, rank 1 is inside init_distributed but never entered it; the alignment and the
    deadline check both name rank 1 (on Ray, rank 0, in its join first, passed its start-up step
    deadline first and was named)."""
    waiting, found = spawn_ranks(late_join, str(tmp_path), free_port(), join=False)
    assert verdict(found) == BEHIND
    assert found["summary"].startswith(
        "actor rank 1 is behind: it has entered no collective yet, and it is in actor.init_distributed for "
    ), found["summary"]
    assert "; actor rank 0 waits in join (gloo rendezvous at tcp://127.0.0.1:" in found["summary"]
    assert "#1 of group join (alignment_ranks.py:" in found["summary"]
    assert (found["deadline_cause"], found["deadline_culprit"]) == BEHIND[:2]
    rows = {(row["group"], row["seq"]): row["cells"] for row in found["report"]["collectives"]["rows"]}
    assert {rank: cell["state"] for rank, cell in rows[("join", 1)].items()} == {
        "actor/0": "in flight",
        "actor/1": "not entered",
    }
    for result in (waiting, found):  # once both joined, the join is complete on each, and apart
        log = result["record"]["collectives"]
        assert log["entered"] == log["completed"] == {"join": 1} and log["in_flight"] == []

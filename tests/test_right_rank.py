"""The seed's failure end to end: two DDP actor ranks as Ray workers, rank 1 goes wrong inside
its train call — blocked in its model's forward, on the first call or in steady state, or
skipping the call's DDP step — while rank 0 really waits in DDP's gradient all-reduce. The report
names rank 1 as the culprit and rank 0 as waiting for it, with the sequence numbers, within
`watchdog.collective_timeout_s` (5 s) and the poll — on the first call too, where the phase's
deadline is still the long start-up allowance."""

from __future__ import annotations

import re

import pytest

from tests.incidents import STALL_S, assert_incident, fault, run_fault
from tests.support import TWO_ACTOR_RANKS_ON_RAY

# (fault kind, call) → words the summary must hold after "actor rank 1 is behind: ". A block in
# steady state and an extra collective are covered on real ranks by tests/test_alignment.py (and
# extra collectives on Ray by tests/test_freeze_proof.py): each run here costs ~45 s of CI.
CASES = {
    "blocked in its first forward": (("hang_in_forward", 1), "its last collective is "),
    "skipping its DDP step in steady state": (("skip_forward", 3), "it finished call 3 of actor.train after 0 "),
    # no call before to compare with (fault matrix cell skip_forward/actor/first_call/ray); on
    # real ranks in CI: tests/test_alignment.py
    "skipping its first DDP step": (("skip_forward", 1), "it finished call 1 of actor.train without any collective"),
}
SLOW = ("skipping its first DDP step",)  # ~45 s more of CI


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_the_rank_behind_is_named_not_the_rank_waiting_for_it(tmp_path, case):
    (kind, call), words = CASES[case]
    result = run_fault(tmp_path, *TWO_ACTOR_RANKS_ON_RAY, fault(kind, "actor", 1, call), checkpointed=call > 1)
    assert_incident(result, "rank_missing_from_collective", ["actor", 1], STALL_S)
    report = result.hang_report
    assert report["summary"].startswith(f"actor rank 1 is behind: {words}"), report["summary"]
    # rank 0 waits in the first collective of its call: the unused-parameter check's all-gather
    # before the first backward (parallel/grad_check.py), DDP's first gradient bucket, or the
    # advantage-normalisation all-reduce before them (minibatches of several micro-batches)
    waited = re.search(
        r"; actor rank 0 waits in (all_gather \(parameters reached by the loss\)|all_reduce( \(ddp grad bucket \d+\))?)"
        r" #(?P<seq>\d+) \(",
        report["summary"],
    )
    assert waited, report["summary"]
    seq = int(waited["seq"])
    rows = {row["seq"]: row["cells"] for row in report["collectives"]["rows"] if row["group"] == "actor"}
    assert rows[seq]["actor/0"]["state"] == "in flight" and rows[seq]["actor/1"]["state"] == "not entered"
    assert rows[seq - 1]["actor/1"]["state"] == "done"  # rank 1 is exactly one behind
    assert [w["waits_for_culprit"] for w in report["workers"] if w["component"] == "actor"] == [True, False]

"""Diagnosis at cluster scale on simulated records (fleetrl/debug/fleet.py: real flight recorders,
no processes): with 256 ranks in one group the rank that skipped a collective is named first and
the 255 that wait for it are summarised as rank ranges; a 1,024-worker report names the culprit
and the cause in its first lines, groups the rest, and stays small; the full table stays in the
JSON. benchmarks/diagnosis/scale_harness.py measures the same through the real store, by process."""

from __future__ import annotations

import time

from fleetrl.config.schema import WatchdogConfig
from fleetrl.debug.fleet import SimulatedWorker, fleet_layout
from fleetrl.watch.judging import alignment
from fleetrl.watch.reporting.hang_report import build_hang_report, render_text
from fleetrl.watch.watchdog import Watchdog

CULPRIT = ("actor", 128)
WAITS = "255 ranks (actor ranks 0-127,129-255) wait in all_reduce #42 (test_scale_diagnosis.py:"
# The text of a 1,024-worker report: the lines above the stacks grow with the number of states
# and of distinct stacks, not with the workers (report_groups.py). Two stacks here, a real one is
# ~30 frames (~3 KiB): 16 KiB is the header, the groups, the table and a few distinct stacks.
TEXT_BOUND = 16 * 1024


def fleet(workers: int, waited_s: float) -> dict:
    """{key: SimulatedWorker}: 41 steps made, then actor rank 128 skips all_reduce #42 and the
    other actor ranks have waited in it `waited_s` seconds."""
    simulated = {(c, r): SimulatedWorker(c, r, node, host=f"sim-node-{node}") for c, r, node in fleet_layout(workers)}
    for _ in range(41):
        for worker in simulated.values():
            worker.step()
    for key, worker in simulated.items():
        if key == CULPRIT:
            worker.skip()
        elif key[0] == "actor":
            worker.hold(since_s=waited_s)
    return simulated


def test_the_rank_that_skipped_a_collective_among_256_is_named_first_and_its_255_waiters_summarised():
    records = {key: worker.record() for key, worker in fleet(256, waited_s=0.0).items()}
    found = alignment.diagnose(records, time.time() + 10.0, timeout_s=5.0)
    assert found.cause == "rank_missing_from_collective"
    assert found.culprit == CULPRIT
    assert len(found.waiting) == 255
    assert found.summary.startswith(
        "actor rank 128 is behind: it finished call 42 of actor.train after 0 collective(s), 1 in the call "
        "before: it skipped collectives the others make (its last collective is all_reduce #41); " + WAITS
    )
    assert "actor rank 1," not in found.summary  # summarised, not listed one by one


def test_a_1024_worker_report_names_the_culprit_first_groups_the_rest_and_keeps_every_worker_in_the_json():
    simulated = fleet(1024, waited_s=6.0)
    records = {key: worker.record() for key, worker in simulated.items()}
    watchdog = Watchdog(WatchdogConfig(), lambda keys: records, list(records), lambda incident: None)
    incident = watchdog.poll()
    workers = [{"component": c, "rank": r, "node": n} for c, r, n in fleet_layout(1024)]
    stacks = {
        key: f'Traceback (most recent call last):\n  File "train.py", line 7, in step_{key[0]}\n' for key in records
    }
    report = build_hang_report(incident, workers, stacks, time.time())
    text = render_text(report)
    lines = text.splitlines()
    assert lines[0] == "fleetrl stopped: rank_missing_from_collective"
    assert lines[1].startswith("actor rank 128 is behind: ") and WAITS in lines[1]
    assert lines[lines.index("workers:") + 1].startswith("  > actor rank 128 node 2 pid ")
    assert lines[lines.index("workers:") + 2].startswith(
        "    768 ranks (env ranks 0-767) on nodes 4-15: idle between calls; heartbeat 0.0 s ago"
    )
    waiters = lines[lines.index("workers:") + 3]  # their phase ages spread over the time the records took
    assert waiters.startswith("    255 ranks (actor ranks 0-127,129-255) on nodes 0-3: in actor.train for 6.")
    assert waiters.endswith(" s; in all_reduce #42; heartbeat 0.0 s ago; waits for the culprit")
    assert "--- stack of 768 ranks (env ranks 0-767) ---" in lines
    assert len(text.encode()) < TEXT_BOUND
    assert len(report["workers"]) == 1024  # the full table: hang_report.json
    assert [w["rank"] for w in report["workers"] if w["culprit"]] == [128]

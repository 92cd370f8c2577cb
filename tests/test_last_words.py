"""A dead worker's last words in its report: how it ended, its node by index and name, and the
tail of its own stderr, read on its node (watch/judging/last_words.py). Real crashes in real Ray workers."""

from __future__ import annotations

import re

import pytest

from tests.incidents import SMALL
from tests.isolation import needs_isolation
from tests.support import TWO_ACTOR_RANKS_ON_RAY, train

TWO_NODES_ENV_RANK_1_ON_NODE_1 = [
    "cluster.backend=ray",
    "cluster.simulate_nodes=2",
    "cluster.num_nodes=2",
    "cluster.devices_per_node=1",
    "cluster.component_placement={actor: 0, rollout: 0, env: 0-1}",
]


@pytest.mark.parametrize(
    ("isolation", "node_name"),
    [
        ((), r"[^)]+"),  # read by the watcher, the stderr file being on its machine
        # read by a Ray task on node 1: its /tmp, and so Ray's logs, are its own. The watcher cannot
        # see a pid on another machine go: to it the death is a silence, reported process_frozen
        # after heartbeat_timeout_s unless the controller's report (Ray's error, the last words
        # read on node 1: seconds on a loaded host) comes first
        pytest.param(
            # (and isolated nodes' start, over a minute on a loaded host, its own start-up allowance)
            (
                "cluster.simulate_isolation=namespaces",
                "watchdog.heartbeat_timeout_s=30",
                "watchdog.startup_step_allowance_s=240",
            ),
            "fleetrl-n1",
            marks=[pytest.mark.slow, needs_isolation],
        ),
    ],
    ids=["simulated", "isolated"],
)
def test_a_segfaulting_env_rank_on_node_1_is_named_with_its_signal_node_and_stack(tmp_path, isolation, node_name):
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *TWO_NODES_ENV_RANK_1_ON_NODE_1,
        *isolation,
        "env.id=tests.supervisor_envs:Segfaulting",
        "env.kwargs={at_step: 20, on_rank: 1}",
        runs=tmp_path,
        timeout=240,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("worker_died", ["env", 1]), report["summary"]
    assert "killed by SIGSEGV" in report["summary"], report["summary"]
    assert re.search(rf"node 1 \({node_name}\)", report["summary"]), report["summary"]
    words = report["last_words"]
    assert words["ended"] == "killed by SIGSEGV" and re.fullmatch(rf"node 1 \({node_name}\)", words["node"]), words
    assert "Fatal Python error: Segmentation fault" in report["detail"], report["detail"]
    assert re.search(r'File ".*supervisor_envs\.py", line \d+ in step', report["detail"]), report["detail"]
    text = (result.run_dir / "hang_report.txt").read_text()
    assert "last words: killed by SIGSEGV, on node 1 (" in text and "supervisor_envs.py" in text


def test_a_rank_gloo_aborts_on_a_collective_mismatch_is_reported_as_that_mismatch_naming_it(tmp_path):
    """2 DDP actor ranks on Ray whose model all-reduces its own statistics in forward; from its 3rd
    training forward actor rank 1 reduces fewer of them. Gloo aborts rank 1 (it receives more bytes
    than its collective expects) with its mismatch message in its stderr: the report is that
    mismatch, naming rank 1 and quoting Gloo, not a dead worker."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *TWO_ACTOR_RANKS_ON_RAY,
        "model.id=tests.fault_models:StatSyncingNet",
        "model.kwargs={diverge_at: 3}",
        runs=tmp_path,
        timeout=240,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("collective_mismatch", ["actor", 1]), report["summary"]
    assert re.fullmatch(
        r"actor rank 1 \(pid \d+, node 0 \([^)]+\)\) was aborted by a collective mismatch: its collectives "
        r"diverged from its peers' \(killed by SIGABRT; its stderr: \".*Received data size doesn't match "
        r"expected size\. Is there a distributed collective mismatch in your code\?.*\"\); it was "
        # Gloo aborts in its own thread: during the call, or once the call has returned
        r"(in actor\.train for \d+\.\d s|idle between calls)",
        report["summary"],
    ), report["summary"]
    assert report["last_words"]["ended"] == "killed by SIGABRT", report["last_words"]


def test_a_rank_that_dies_in_a_call_after_its_last_heartbeat_is_reported_in_that_call(tmp_path):
    """The mismatch above, where actor rank 1's heartbeat thread stops as its model is built (as
    one that gets no turn on a loaded host): its last heartbeat predates the train call it dies in.
    The report says actor.train all the same — the call the controller sent it and was waiting on,
    for as long ago as it was sent (the controller publishes its wait as it begins) — and not the
    phase of that old heartbeat. Its silence is no freeze before it dies: a long heartbeat timeout."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *TWO_ACTOR_RANKS_ON_RAY,
        "model.id=tests.fault_models:StatSyncingNet",
        "model.kwargs={diverge_at: 3, silent: true}",
        "watchdog.heartbeat_timeout_s=200",
        runs=tmp_path,
        timeout=240,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("collective_mismatch", ["actor", 1]), report["summary"]
    assert re.search(r"\); it was in actor\.train for \d+\.\d s$", report["summary"]), report["summary"]
    dead = next(w for w in report["workers"] if (w["component"], w["rank"]) == ("actor", 1))
    assert dead["phase"] in (None, "actor.construct"), dead  # its own last word on what it did: stale

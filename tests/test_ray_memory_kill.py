"""Workers that Ray's memory monitor kills, named as such (watch/judging/ray_memory.py), for real:
a run on a Ray node whose monitor threshold (`RAY_memory_usage_threshold`, 1 % of the node's
memory) lies below any machine's memory use, so the monitor SIGKILLs the run's workers as they
start. Before, the report said "the controller raised OutOfMemoryError" and named no worker (or,
for a worker killed between calls, that it ended without a signal or error in its stderr)."""

from __future__ import annotations

import re

from fleetrl.watch.incident import died
from fleetrl.watch.judging.last_words import UNEXPLAINED_END, LastWords
from fleetrl.watch.judging.ray_memory import MEMORY_HINT, explain_death
from tests.incidents import SMALL, assert_ended_in_time
from tests.support import train

BELOW_ANY_USE = {"RAY_memory_usage_threshold": "0.01", "RAY_memory_monitor_refresh_ms": "100"}


def test_workers_rays_memory_monitor_killed_are_named_with_the_nodes_memory(tmp_path):
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        "cluster.backend=ray",
        "runner.total_env_steps=1000000",
        runs=tmp_path,
        env=BELOW_ANY_USE,
        timeout=240,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    summary = report["summary"]
    assert report["cause"] == "worker_died", summary
    component, rank = report["culprit"]
    assert component in ("env", "rollout", "actor"), summary
    assert re.search(
        rf"^{component} rank {rank} \(pid \d+[^)]*\) died: killed by Ray's memory monitor: node 127\.0\.0\.1 had "
        r"[\d.]+ of [\d.]+ GB of memory in use, over its kill threshold of 1 % of the node's memory; ",
        summary,
    ), summary
    killed = re.search(
        r"it killed (\d+) worker\(s\) of this run: (.+), together [\d.]+ of the [\d.]+ GB in use$", summary
    )
    assert killed, summary
    assert f"{component} rank {rank} (pid " in killed.group(2), summary
    assert report["detail"].startswith(MEMORY_HINT), report["detail"][:300]
    assert "OutOfMemoryError" not in summary.split(";")[0]  # the caller that got the news is not the culprit
    assert_ended_in_time(result)


# Ray 2.60's error at the caller of a worker its memory monitor killed between calls (from a real
# run: 3 workers of one run killed on a node that other jobs filled), trimmed to its lines that count
BETWEEN_CALLS = (
    "OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory. Memory on the node "
    "(IP: 127.0.0.1, ID: b94b5e5e1e5022e958d420082dca26b2656416f8f4e61c51ca7c9a89) was 21.95GB used / 23.54GB "
    "limit (0.932351)\nOOM kill reason: Memory usage 24032821248B exceeded threshold of 24012384256B (95.0% of "
    "25276194816B limit)\nSelected to kill: (Actor(b4405a68ad4fc20f577b6d0a01000000): job ID=01000000, lease "
    "ID=0200, task name=fleetrl-rollout-0-21947:WorkerHost.__init__, required resources={}, pid=22309, actual "
    "memory used=0.32GB, worker ID=b731)\nSelected to kill: (Actor(defc0ed118801c963fe03cec01000000): job "
    "ID=01000000, lease ID=0100, task name=fleetrl-actor-0-21947:WorkerHost.__init__, required resources={}, "
    "pid=22227, actual memory used=0.40GB, worker ID=0a21)\nSelected to kill: (Actor(d4f855c3a5d5f1074120e63f"
    "01000000): job ID=01000000, lease ID=0000, task name=fleetrl-env-0-21947:WorkerHost.__init__, required "
    "resources={}, pid=22225, actual memory used=0.08GB, worker ID=e8b3)\n"
)


def test_a_worker_the_watchdog_found_gone_is_named_killed_by_the_monitor_that_its_peers_heard_of():
    """The watchdog finds env rank 0's process gone, its stderr silent (`UNEXPLAINED_END`); the
    controller's error names it among the monitor's kills: the report says so, with the node's
    memory and what this run's killed workers held of it."""
    words = LastWords(UNEXPLAINED_END, "node 0 (vm)", "")
    dead = died(("env", 0), {"pid": 22225}, words, "it was idle between calls", 0.0)
    explained = explain_death(dead, BETWEEN_CALLS)
    assert explained.summary == (
        "env rank 0 (pid 22225, node 0 (vm)) died: killed by Ray's memory monitor: node 127.0.0.1 had 21.95 of "
        "23.54 GB of memory in use, over its kill threshold of 95 % of the node's memory; it was idle between "
        "calls; it killed 3 worker(s) of this run: rollout rank 0 (pid 22309, 0.32 GB), actor rank 0 (pid 22227, "
        "0.4 GB), env rank 0 (pid 22225, 0.08 GB), together 0.80 of the 21.95 GB in use"
    )
    assert explained.last_words["ended"].startswith("killed by Ray's memory monitor")
    assert explained.detail.startswith(MEMORY_HINT)

    other = died(("env", 1), {"pid": 4242}, words, "it was idle between calls", 0.0)  # not among the kills
    assert explain_death(other, BETWEEN_CALLS).summary.startswith(
        f"env rank 1 (pid 4242, node 0 (vm)) died: {UNEXPLAINED_END}; it was idle between calls; killed by Ray's"
    )
    plain = died(("env", 0), {"pid": 22225}, words, "it was idle between calls", 0.0)
    untouched = (plain.summary, plain.detail)
    explain_death(plain, "ConnectionResetError: peer reset")  # no kill reported
    assert (
        (plain.summary, plain.detail)
        == untouched
        == (
            f"env rank 0 (pid 22225, node 0 (vm)) died: {UNEXPLAINED_END}; it was idle between calls",
            "",
        )
    )


def test_a_kill_message_without_the_nodes_line_says_what_it_does_say():
    """Another Ray version may word the node's use or the threshold differently: the report then
    says the monitor killed the worker and what this run's killed workers held, with no made-up
    figures (it had said "nan of nan GB")."""
    without_node = "\n".join(line for line in BETWEEN_CALLS.split("\n") if not line.startswith("OutOfMemoryError"))
    message = "OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory.\n" + without_node
    words = LastWords(UNEXPLAINED_END, "node 0 (vm)", "")
    dead = died(("env", 0), {"pid": 22225}, words, "it was idle between calls", 0.0)
    assert explain_death(dead, message).summary == (
        "env rank 0 (pid 22225, node 0 (vm)) died: killed by Ray's memory monitor: over its kill threshold of "
        "95 % of the node's memory; it was idle between calls; it killed 3 worker(s) of this run: rollout rank 0 "
        "(pid 22309, 0.32 GB), actor rank 0 (pid 22227, 0.4 GB), env rank 0 (pid 22225, 0.08 GB), together 0.80 GB"
    )
    bare = "OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory."
    lone = died(("env", 0), {"pid": 22225}, words, "it was idle between calls", 0.0)
    assert explain_death(lone, bare).summary == (
        f"env rank 0 (pid 22225, node 0 (vm)) died: {UNEXPLAINED_END}; it was idle between calls; killed by "
        "Ray's memory monitor; none of the workers it killed was named in Ray's error"
    )

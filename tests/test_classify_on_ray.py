"""A Ray worker that died, classified in this process (watch/judging/classify.py
`incident_from_error`) from the error Ray really raised and by the Ray workers that really ran it
(cluster/ray/cluster.py `RayCluster`): who it was (its actor id), its pid (the `pid: N` line of
Ray's error, else its heartbeat), when it began (its last beat on the watcher's clock) and its last
words, read by a Ray task on its node from its own stderr file.

One private Ray node on 127.0.0.1 for the module (a few seconds); its workers are small hosts
started through `RayCluster.start_processes`, as a run's `WorkerHost`s are, and killed with
SIGKILL or failing as they are built. tests/test_last_words.py shows the same in whole runs
(subprocesses); these hold each arm of the classification exactly, in-process, where the mutation
run (benchmarks/diagnosis/mutation.sh) sees them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import ray
from ray._private import ray_constants
from ray.exceptions import RayActorError

from fleetrl.cluster.ray.cluster import RayCluster
from fleetrl.config.schema import ClusterConfig
from fleetrl.plan.placement import Assignment
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.classify import incident_from_error
from tests.support import own_children, reaping_new_children

LAST_LINE = "a worker's last line on its stderr"
SIGKILLED = "ended without a signal or error in its stderr (SIGKILL, the OOM killer, or an exit)"
DIED = "The actor died unexpectedly before finishing this task."  # Ray's first line for a dead actor
CALL_TIMEOUT_S = 60  # Ray reports a dead actor within a second or two; this only ends a wait that would not
IDLE_END_S = 60  # Ray ends an idle worker ~1 s after its task on a quiet host; on a loaded one, seconds later


class Host:
    """A run's worker host as far as Ray's death of it goes (cluster/ray/worker_host.py's
    signature): a process that says its last line and its pid when asked."""

    def __init__(self, threads: int, factory, assignment: Assignment, watch) -> None:
        pass

    def last_line(self) -> int:
        print(LAST_LINE, file=sys.stderr, flush=True)
        return os.getpid()


class FailsWhenBuilt(Host):
    """A host whose construction fails after its pid reached `pid_file` (as a first heartbeat
    would): Ray's error for it has no `pid: N` line."""

    def __init__(self, threads: int, factory, assignment: Assignment, pid_file: str) -> None:
        Path(pid_file).write_text(str(self.last_line()))
        raise RuntimeError("the worker could not be built")


@pytest.fixture(scope="module")
def cluster():
    """A new one-node Ray on 127.0.0.1 (never anyone else's), started as a run starts it; the
    environment and Ray's loopback switch are as they were after it. No CPU slots: the hosts and
    the last-words readers ask for none (as a run's do), and Ray keeps no idle worker for a free
    slot, so the reader's process ends a second after its task (not at the module's end) and each
    test ends what it started."""
    environment, loopback = dict(os.environ), ray_constants.ENABLE_RAY_CLUSTER
    # The deadline a run's session gives the connection is its supervisor's; Ray's own bounds it here
    with reaping_new_children():  # Ray's daemons: CI once found them as the next test's children
        started = RayCluster(ClusterConfig(), 0, lambda seconds, what: contextlib.nullcontext())
        try:
            yield started
        finally:
            started.shutdown()
            os.environ.clear()
            os.environ.update(environment)
            ray_constants.ENABLE_RAY_CLUSTER = loopback


@pytest.fixture(autouse=True)
def ray_ended_this_test_s_workers():
    """Waits, after each test, for the Ray worker processes it started to end. The hosts end when
    killed or failed; the last-words reader's process is Ray's to end once idle, about a second
    after its task on a quiet host but later than the session-wide check's 3 s grace on a loaded
    CI host (seen as 'ray::IDLE' left alive). A worker Ray never ends still fails that check."""
    before = {child.pid for child in own_children()}
    yield
    psutil.wait_procs([child for child in own_children() if child.pid not in before], timeout=IDLE_END_S)


def assignment(component: str, rank: int) -> Assignment:
    return Assignment(component, rank, 2, 0, 0, 0, "", 1, 0)


def killed(handle) -> tuple[RayActorError, int]:
    """The error Ray raises for `handle`'s next call once its process was killed with SIGKILL, and its pid."""
    pid = ray.get(handle.last_line.remote(), timeout=CALL_TIMEOUT_S)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RayActorError) as raised:
        ray.get(handle.last_line.remote(), timeout=CALL_TIMEOUT_S)
    return raised.value, pid


def stderr_of(pid: int, cluster: RayCluster) -> tuple[str, str]:
    """(path, text) of the dead worker's stderr file in the node's Ray logs: all of it short
    enough to be the tail a report shows (watch/judging/last_words.py: 60 lines)."""
    (path,) = Path(cluster.started.nodes[0].get_logs_dir_path()).glob(f"worker-*-{pid}.err")
    text = path.read_text().rstrip("\n")
    assert len(text.splitlines()) <= 60, text
    return str(path), text


def classified(error: BaseException, records: dict, remote) -> tuple[Incident, float, float]:
    """The incident and the watcher's clock just before and after (`started` is checked apart)."""
    before = time.time()
    incident = incident_from_error(error, records, remote)
    return incident, before, time.time()


def test_a_killed_worker_is_named_with_the_pid_in_ray_s_error_its_node_and_its_last_words(cluster):
    """Died before its first beat (no record): it began when it was found; pid from Ray's error.
    With a beat 12 s old: it began then. Without the Ray workers (no remote): a worker, unnamed."""
    key = ("env", 0)
    group = cluster.start_processes([assignment(*key)], Host, None, threading.Event(), host_class=Host)
    error, pid = killed(group.handles[0])
    assert str(error).splitlines()[0] == DIED and f"\n\tpid: {pid}\n" in str(error)
    path, text = stderr_of(pid, cluster)
    assert text.splitlines()[-1] == LAST_LINE  # what the worker said last, as the report shows it
    node = f"node 0 ({socket.gethostname()})"
    expected = Incident(
        "worker_died",
        f"env rank 0 (pid {pid}, {node}) died: {SIGKILLED}; Ray lost its process: {DIED}",
        0.0,
        key,
        text,
        last_words={"ended": SIGKILLED, "node": node, "stderr_tail": text, "stderr_path": path},
    )
    incident, before, after = classified(error, {}, cluster)
    assert replace(incident, started=0.0) == expected
    assert before <= incident.started <= after
    beats = {key: {"pid": pid, "node": 0, "heartbeat_age_s": 12.0}, ("env", 1): {"pid": 1, "heartbeat_age_s": 1.0}}
    incident, before, after = classified(error, beats, cluster)
    assert replace(incident, started=0.0) == expected
    assert before - 12.0 <= incident.started <= after - 12.0
    unnamed = Incident("worker_died", f"a worker died (Ray lost its process): {DIED}", 0.0, None, str(error))
    incident, before, after = classified(error, beats, None)
    assert replace(incident, started=0.0) == unnamed
    assert before <= incident.started <= after  # no worker named, no beat to go back to


def test_a_worker_whose_error_carries_no_pid_is_named_with_the_pid_of_its_heartbeat(cluster, tmp_path):
    """A host failing as it is built: Ray's error names no `pid: N`; its beat's pid reads its last
    words. Before its first beat there is no pid: the report says what it knows."""
    key = ("env", 1)
    pid_file = tmp_path / "pid"
    group = cluster.start_processes(
        [assignment(*key)], Host, str(pid_file), threading.Event(), host_class=FailsWhenBuilt
    )
    with pytest.raises(RayActorError) as raised:
        ray.get(group.handles[0].last_line.remote(), timeout=CALL_TIMEOUT_S)
    error, pid = raised.value, int(pid_file.read_text())
    assert "pid: " not in str(error) and "RuntimeError: the worker could not be built" in str(error)
    path, text = stderr_of(pid, cluster)
    assert LAST_LINE in text.splitlines()
    node = f"node 0 ({socket.gethostname()})"
    first = str(error).splitlines()[0]
    words = {"ended": SIGKILLED, "node": node, "stderr_tail": text, "stderr_path": path}
    expected = Incident(
        "worker_died",
        f"env rank 1 (pid {pid}, {node}) died: {SIGKILLED}; Ray lost its process: {first}",
        0.0,
        key,
        text,
        last_words=words,
    )
    beats = {key: {"pid": pid, "node": 0, "heartbeat_age_s": 3.0}}
    incident, before, after = classified(error, beats, cluster)
    assert replace(incident, started=0.0) == expected
    assert before - 3.0 <= incident.started <= after - 3.0
    # failed before its first beat: no pid to read its last words by, and nothing to say of it it does not know
    unread = Incident("worker_died", f"env rank 1 died: its process is gone; Ray lost its process: {first}", 0.0, key)
    incident, before, after = classified(error, {}, cluster)
    assert replace(incident, started=0.0) == unread
    assert before <= incident.started <= after


def test_a_dead_actor_the_run_did_not_start_is_a_worker_unnamed(cluster):
    """An actor id the Ray workers do not know: `a worker`, begun when found, whatever beats there are."""
    stranger = ray.remote(Host).options(num_cpus=0).remote(1, None, assignment("env", 0), None)
    error, _ = killed(stranger)
    beats = {("env", 0): {"pid": 1, "node": 0, "heartbeat_age_s": 12.0}}
    incident, before, after = classified(error, beats, cluster)
    assert replace(incident, started=0.0) == Incident(
        "worker_died", f"a worker died (Ray lost its process): {DIED}", 0.0, None, str(error)
    )
    assert before <= incident.started <= after

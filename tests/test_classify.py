"""An exception that reached the controller → the incident it stands for (watch/judging/classify.py), each
kind exactly: a worker's exception and when it began on the watcher's clock, a rank that could not
reach its peers, a rank that diverged, a full disk (a worker's or the controller's own, with the
file and the free bytes), a NaN or infinity (the controller's own check or a worker's), the
controller's own exception, a Ray worker that died, workers Ray's memory monitor killed, and any of these
while a node no longer runs Ray.

The errors are the real ones (fleetrl's WorkerError and UnusedParameterError, Ray's exception
classes, OSError), built in this process; a lost node is a raylet address on which a socket is
bound and not listening (the connection is refused, as a dead node's is). The Ray runs that
raise them for real are tests/test_freeze_proof.py, test_param_check.py, test_checkpoint_trust.py,
test_isolated_nodes.py and test_last_words.py, and in this process with a real Ray worker's death
and last words tests/test_classify_on_ray.py; these run in well under a second (the mutation run,
benchmarks/diagnosis/mutation.sh)."""

from __future__ import annotations

import errno
import re
import socket
import time
import traceback

from ray.exceptions import ActorDiedError, OutOfMemoryError, RayActorError, RayTaskError

from fleetrl.non_finite import NonFiniteError
from fleetrl.parallel.grad_check import UnusedParameterError
from fleetrl.probe.recorded_calls import WorkerError
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.classify import (
    DISK_FULL_HINT,
    NON_FINITE_HINT,
    incident_from_error,
    ray_pid,
    worker_error,
)
from fleetrl.watch.judging.ray_memory import MEMORY_HINT
from tests.test_ray_memory_kill import BETWEEN_CALLS

TRACE = 'Traceback (most recent call last):\n  File "env.py", line 9, in step\nInjectedFault: injected at step 40\n'
RAISED_AT = 1000.0  # on the raiser's clock


def classified(error: BaseException, records: dict | None = None, run_dir=None) -> tuple[Incident, float, float]:
    """The incident, and the watcher's clock just before and after it was classified."""
    before = time.time()
    incident = incident_from_error(error, records or {}, None, run_dir)
    return incident, before, time.time()


def raised(component: str, rank: int, error_type: str, message: str, phase: str = "env.step", clock=("inline", 0)):
    return WorkerError(component, rank, phase, error_type, message, TRACE, RAISED_AT, clock)


def test_a_worker_s_exception_names_it_and_begins_when_it_was_raised_on_the_watcher_s_clock():
    error = raised("env", 0, "InjectedFault", "\n  injected at step 40\nsecond line")
    said = "env rank 0 raised InjectedFault in env.step: injected at step 40"
    # the raiser's clock is 30 s behind the watcher's, as its heartbeats showed
    seen = {("inline", 0): {"clock_offset_s": 30.0}}
    expected = Incident("worker_exception", said, RAISED_AT + 30.0, ("env", 0), TRACE, host=("inline", 0))
    assert classified(error, seen)[0] == expected
    # its heartbeats not seen here (or no offset read yet): left on its clock, which is named
    on_its_clock = Incident(
        "worker_exception", said, RAISED_AT, ("env", 0), TRACE, clock=("inline", 0), host=("inline", 0)
    )
    assert classified(error)[0] == on_its_clock
    assert classified(error, {("inline", 0): {"clock_offset_s": None}})[0] == on_its_clock
    # on Ray: inside a RayTaskError, and that inside another raised from it (passed on as an argument)
    try:
        raise RuntimeError("the next call failed") from RayTaskError("step", TRACE, RayTaskError("step", TRACE, error))
    except RuntimeError as wrapped:
        assert worker_error(wrapped) is error
        assert classified(wrapped, seen)[0] == expected
    silent = raised("env", 0, "InjectedFault", "  \n")
    assert classified(silent, seen)[0].summary == "env rank 0 raised InjectedFault in env.step: "


def test_the_worker_error_is_looked_for_10_exceptions_deep_and_no_further():
    """Ray nests a worker's error a few levels at most; the bound ends the search on a chain of
    exceptions that lead to each other."""
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert worker_error(first) is None
    error = raised("env", 0, "InjectedFault", "injected")
    for depth, found in [(9, error), (10, None)]:  # the 10th exception is the deepest looked at
        chain = error
        for _ in range(depth):
            outer = RuntimeError("wrapped")
            outer.__cause__, chain = chain, outer
        assert worker_error(chain) is found, depth


def test_a_rank_that_could_not_reach_its_peers_is_peer_unreachable():
    error = raised("actor", 1, "JoinError", "connect to 10.0.0.2:29500 refused", "actor.init_distributed", ("actor", 1))
    said = "actor rank 1 could not reach its peers: connect to 10.0.0.2:29500 refused"
    incident = classified(error, {("actor", 1): {"clock_offset_s": -20.0}})[0]
    assert incident == Incident("peer_unreachable", said, RAISED_AT - 20.0, ("actor", 1), TRACE, host=("actor", 1))
    on_its_clock = Incident(
        "peer_unreachable", said, RAISED_AT, ("actor", 1), TRACE, clock=("actor", 1), host=("actor", 1)
    )
    assert classified(error)[0] == on_its_clock


def test_a_rank_whose_loss_left_parameters_without_a_gradient_is_named_whichever_rank_raised():
    """Every rank raises the same UnusedParameterError (parallel/grad_check.py); the culprit is the
    rank it names, not the one whose exception arrived first."""
    message = str(UnusedParameterError({"head.weight": [2]}, "policy", "update 3"))
    error = raised("actor", 0, "UnusedParameterError", message, "actor.train", ("actor", 0))
    said = f"actor rank 2 diverged (actor rank 0 raised UnusedParameterError in actor.train): {message}"
    expected = Incident("worker_exception", said, RAISED_AT, ("actor", 2), TRACE, clock=("actor", 0))
    assert classified(error)[0] == expected
    # the same words in another exception are that exception's
    other = classified(raised("actor", 0, "RuntimeError", message, "actor.train", ("actor", 0)))[0]
    assert (other.cause, other.culprit, other.host) == ("worker_exception", ("actor", 0), ("actor", 0))


def test_a_worker_whose_disk_filled_is_disk_full():
    message = "[Errno 28] No space left on device: '/data/run/checkpoints/7/actor.pt'"
    error = raised("actor", 0, "OSError", message, "actor.save", ("actor", 0))
    said = f"actor rank 0 raised OSError in actor.save: {message}"
    expected = Incident("disk_full", said, RAISED_AT, ("actor", 0), TRACE, clock=("actor", 0), host=("actor", 0))
    assert classified(error)[0] == expected


def test_the_controller_s_own_full_disk_names_the_file_or_the_run_directory_and_the_free_bytes(tmp_path):
    target = tmp_path / "run" / "checkpoints" / "model.pt"  # its folders not made yet: the nearest one's free bytes
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        except OSError as full:
            raise RuntimeError("saving the checkpoint failed") from full
    except RuntimeError as error:
        incident, before, after = classified(error)
    free = rf"\d+ bytes free on {re.escape(str(tmp_path))}"
    assert re.fullmatch(rf"no space left on device writing {re.escape(str(target))}: {free}", incident.summary)
    assert (incident.cause, incident.culprit, incident.detail) == ("disk_full", None, DISK_FULL_HINT)
    assert before <= incident.started <= after
    torch_s = RuntimeError("PytorchStreamWriter failed writing file data/0: No space left on device")  # no file name
    summary = classified(torch_s, run_dir=tmp_path / "run")[0].summary
    assert re.fullmatch(rf"no space left on device writing {re.escape(str(tmp_path / 'run'))}: {free}", summary)
    assert classified(torch_s)[0].summary == "no space left on device writing a file: free space unknown"


def test_the_controller_s_own_exception_is_a_worker_exception_with_no_culprit():
    try:
        raise ValueError("bad value")
    except ValueError as error:
        incident, before, after = classified(error)
        detail = "".join(traceback.format_exception(error))
    assert (incident.cause, incident.summary, incident.culprit) == (
        "worker_exception",
        "the controller raised ValueError: bad value",
        None,
    )
    assert incident.detail == detail and before <= incident.started <= after


def test_a_nan_is_non_finite_in_the_controller_s_own_check_and_in_a_worker_s():
    """fleetrl/non_finite.py's NonFiniteError: the controller's own (a checkpoint's state) has no
    culprit and begins now; a worker's arrives by name in its WorkerError, names the worker and
    begins when it was raised, the hint before its traceback."""
    try:
        raise NonFiniteError("parameter", "policy.head.weight", float("nan"), "checkpoint of iteration 7")
    except NonFiniteError as error:
        incident, before, after = classified(error)
    said = "the controller found non-finite parameter: policy.head.weight is nan (checkpoint of iteration 7)"
    assert (incident.cause, incident.summary, incident.culprit, incident.detail) == (
        "non_finite",
        said,
        None,
        NON_FINITE_HINT,
    )
    assert before <= incident.started <= after
    message = "non-finite env reward: reward is inf (lane 1, step 40)"
    error = raised("env", 1, "NonFiniteError", message, "env.step", ("inline", 0))
    said = f"env rank 1 raised NonFiniteError in env.step: {message}"
    hinted = f"{NON_FINITE_HINT}\n\n{TRACE}"
    expected = Incident("non_finite", said, RAISED_AT + 30.0, ("env", 1), hinted, host=("inline", 0))
    assert classified(error, {("inline", 0): {"clock_offset_s": 30.0}})[0] == expected
    on_its_clock = Incident("non_finite", said, RAISED_AT, ("env", 1), hinted, clock=("inline", 0), host=("inline", 0))
    assert classified(error)[0] == on_its_clock


def test_a_ray_worker_that_died_is_worker_died():
    """Without the Ray workers to name it (no remote), a worker; the pid Ray's message carries."""
    error = ActorDiedError()
    incident, before, after = classified(error)
    said = "a worker died (Ray lost its process): The actor died unexpectedly before finishing this task."
    assert (incident.cause, incident.summary, incident.culprit, incident.detail) == (
        "worker_died",
        said,
        None,
        str(error),
    )
    assert before <= incident.started <= after
    assert ray_pid(RayActorError(error_msg="The actor died.\n\tclass_name: WorkerHost\n\tpid: 4242\n\tname: x")) == 4242
    assert ray_pid(RayActorError(error_msg="The actor died.\n\tpid: unknown")) is None


def test_workers_ray_s_memory_monitor_killed_are_worker_died_naming_the_first_from_its_last_beat():
    """Ray's OutOfMemoryError at the caller of workers its memory monitor killed (Ray 2.60's own
    words, watch/judging/ray_memory.py): the first killed worker died, from its last beat, with the
    node's memory and the run's killed workers; the detail says what to do, then Ray's message — not
    the controller's own OutOfMemoryError. tests/test_ray_memory_kill.py has the monitor kill for real."""
    error = OutOfMemoryError(BETWEEN_CALLS)
    incident, before, after = classified(error, {("rollout", 0): {"heartbeat_age_s": 2.5}, ("env", 0): {}})
    assert (incident.cause, incident.culprit) == ("worker_died", ("rollout", 0))
    assert before - 2.5 <= incident.started <= after - 2.5
    assert incident.summary.startswith(
        "rollout rank 0 (pid 22309) died: killed by Ray's memory monitor: node 127.0.0.1 had 21.95 of 23.54 GB "
        "of memory in use, over its kill threshold of 95 % of the node's memory; it killed 3 worker(s) of this run: "
    ), incident.summary
    assert incident.detail == f"{MEMORY_HINT}\n\n{BETWEEN_CALLS}"


def test_any_error_while_a_node_no_longer_runs_ray_is_that_node_s_loss():
    """Node 0's raylet answers (a listening socket); node 1's refuses (bound, not listening): its
    workers' errors are echoes of the node that is gone, named by its first worker."""
    with socket.socket() as alive, socket.socket() as gone:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        gone.bind(("127.0.0.1", 0))
        answers, refuses = (f"127.0.0.1:{s.getsockname()[1]}" for s in (alive, gone))
        beat = {"time": time.time() - 7.0, "host": "sim-host-1", "node": 1, "heartbeat_age_s": 12.0, "raylet": refuses}
        records = {
            ("actor", 0): {**beat, "node": 0, "raylet": answers, "heartbeat_age_s": 0.5},
            ("env", 0): beat,
            ("env", 1): beat,
        }
        error = ActorDiedError()
        incident, before, after = classified(error, records)
    assert (incident.cause, incident.culprit, incident.detail) == ("node_lost", ("env", 0), str(error))
    assert incident.summary.startswith(
        f"node 1 (sim-host-1) is lost: its Ray node manager at {refuses} does not answer, "
        "and its workers (env rank 0, env rank 1) stopped "
    )
    assert before - 12.0 <= incident.started <= after - 12.0  # at its last beat
    # records the watcher has not annotated (its watchdog off): no age to go back by
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        record = {"time": time.time(), "host": "sim-host-1", "node": 1, "raylet": f"127.0.0.1:{gone.getsockname()[1]}"}
        incident, before, after = classified(error, {("env", 0): record})
    assert incident.cause == "node_lost" and before <= incident.started <= after

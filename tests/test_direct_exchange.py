"""Env ⇄ rollout through direct worker-to-worker channels (cluster/exchange/direct.py), for real:
local Ray, 2 env workers in 2 pipeline stages each (4 lanes) served by one rollout worker, real
CartPole; and the channels themselves between two real sockets."""

from __future__ import annotations

import socket
import threading

import pytest

from fleetrl.cluster.exchange.direct_channels import Channel, ChannelLost, DirectChannels
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.probe.recorded_calls import WorkerError
from tests.incidents import NOTICE_S, assert_incident, fault, promised_detection_s, run_fault
from tests.support import DIRECT_LINE, refusing_port
from tests.support import FOUR_LANES_ON_RAY as FOUR_LANES


def test_env_worker_killed_on_its_first_direct_step_is_named(tmp_path):
    """Env rank 1's process is killed (SIGKILL) as its very first `env.step` starts, inside its direct-channel loop: the rollout worker sees its channel to env
    rank 1 close, which must not be reported as the rollout's failure — the report names env rank
    1 as `worker_died`, and the run ends with no process left (`Fleetrl.finish`)."""
    result = run_fault(tmp_path, *FOUR_LANES, "cluster.exchange=direct", fault("kill", "env", 1, 1), checkpointed=False)
    assert DIRECT_LINE in result.stderr, result.stderr[-3000:]
    assert_incident(result, "worker_died", ["env", 1], NOTICE_S)


@pytest.mark.parametrize(
    ("kind", "cause", "detection"), [("hang", "phase_timeout", "stall"), ("exception", "worker_exception", "exception")]
)
def test_env_step_failing_on_its_first_direct_call_is_named(tmp_path, kind, cause, detection):
    """The very first `env.step` of env rank 1 never returns (hang) or raises (exception). A hang:
    the rollout worker waits on its channel (idle, not in a phase) while env rank 1's heartbeat
    thread still publishes its phase, so the report names env rank 1 in env.step after the
    first-call bound (3 s here). An exception travels along the channel and the rollout worker
    raises it too, so the report names env rank 1 in env.step whichever failure comes first."""
    result = run_fault(
        tmp_path,
        *FOUR_LANES,
        "cluster.exchange=direct",
        "watchdog.first_call_bound_s=3",
        fault(kind, "env", 1, 1),
        checkpointed=False,
    )
    assert DIRECT_LINE in result.stderr, result.stderr[-3000:]
    assert_incident(result, cause, ["env", 1], promised_detection_s(detection, first_call_bound_s=3))
    assert "env.step" in result.hang_report["summary"], result.hang_report["summary"]


def test_a_peer_s_error_is_raised_at_the_other_end_and_a_silent_close_names_the_peer():
    """Two ends of a real TCP connection on 127.0.0.1: a value arrives whole, a `WorkerError`
    sent along is raised by the receiver as is, and a peer that closes without a word is
    `ChannelLost` naming that peer (on the receiver's clock), for the controller to weigh."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=10)
        accepted, _ = server.accept()
    rollout = Channel(client, ("env", 1), ("rollout", 0))
    env = Channel(accepted, ("rollout", 0), ("env", 1))
    big = list(range(100_000))  # several segments: read until whole
    sender = threading.Thread(target=env.send, args=(big,))
    sender.start()
    assert rollout.receive() == big
    sender.join(10)
    raised = WorkerError("env", 1, "env.step", "ValueError", "bad action", "trace", 1.0, ("env", 1))
    env.send(raised)
    with pytest.raises(WorkerError) as caught:
        rollout.receive()
    assert (caught.value.component, caught.value.rank, caught.value.phase) == ("env", 1, "env.step")
    assert type(caught.value) is WorkerError
    env.close()
    with pytest.raises(ChannelLost) as lost:
        rollout.receive()
    assert (lost.value.component, lost.value.rank, lost.value.clock) == ("env", 1, ("rollout", 0))
    assert "rollout rank 0 lost its direct channel to env rank 1" in str(lost.value)
    rollout.close()


@pytest.mark.parametrize("overrides", [[], [*FOUR_LANES[:2], "cluster.fuse_collocated=true"]])
def test_direct_exchange_where_env_and_rollout_share_a_process_is_a_config_error(overrides):
    placement = ["cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}"] if overrides else []
    with pytest.raises(ConfigError) as caught:
        resolve(load_config("configs/ppo_cartpole.yaml", [*overrides, *placement, "cluster.exchange=direct"]))
    assert (caught.value.key, caught.value.value) == ("cluster.exchange", "direct")
    assert caught.value.valid == "'auto' or 'classic' on this layout"


def test_a_rollout_worker_that_cannot_reach_its_env_worker_says_which_and_where():
    """Connecting to a port nobody listens on (127.0.0.1): the error names the rollout worker (the
    report's raiser), the env rank and the address it tried, not a bare ConnectionRefusedError."""
    with refusing_port() as port, pytest.raises(WorkerError) as caught:
        DirectChannels(print, ("rollout", 0), b"secret").connect({1: ("127.0.0.1", port)}, 10.0)
    error = caught.value
    assert (error.component, error.rank, error.phase, error.error_type) == (
        "rollout",
        0,
        "rollout.connect",
        "ConnectionRefusedError",
    )
    assert error.message.startswith(f"cannot reach env rank 1 at 127.0.0.1:{port}: "), error.message

"""Env ⇄ rollout through a Ray Compiled Graph (cluster/exchange/compiled.py), for real: local Ray,
2 env workers in 2 pipeline stages each (4 lanes) served by one rollout worker, real CartPole."""

from __future__ import annotations

import pytest

from fleetrl.cluster.exchange.compiled import unroll_for
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from tests.incidents import NOTICE_S, assert_incident, fault, promised_detection_s, run_fault
from tests.support import COMPILED_LINE, fleetrl, four_lane_cartpole
from tests.support import FOUR_LANES_ON_RAY as FOUR_LANES

# A Ray setting that makes every compiled graph fail to build (its context rejects it): the
# compile raises for real, as on a Ray that cannot serve the layout.
BROKEN_GRAPHS = {"RAY_CGRAPH_read_iteration_timeout_s": "100"}


def test_env_step_hung_on_its_first_call_inside_the_graph_is_named(tmp_path):
    """The very first `env.step` of env rank 1 never returns, inside the graph's loop: the worker's
    heartbeat thread still publishes its phase, so the report names env rank 1 in env.step after
    the first-call bound (3 s here), and the run ends with no process left (`Fleetrl.finish`)."""
    result = run_fault(
        tmp_path,
        *FOUR_LANES,
        "cluster.exchange=compiled",
        "watchdog.first_call_bound_s=3",
        fault("hang", "env", 1, 1),
        checkpointed=False,
    )
    assert COMPILED_LINE in result.stderr, result.stderr[-3000:]
    assert_incident(result, "phase_timeout", ["env", 1], promised_detection_s("first_call", first_call_bound_s=3))
    assert "env.step" in result.hang_report["summary"], result.hang_report["summary"]


def test_env_worker_killed_on_its_first_step_inside_the_graph_is_named(tmp_path):
    """Env rank 1's process is killed (SIGKILL) as its very first `env.step` starts, inside the
    graph's loop: the controller's wait for the outcomes ends (no freeze) and the report names
    env rank 1 as `worker_died`, not the controller (Ray's failure monitor used to abort the
    controller when it closed the outcome channels, cluster/exchange/compiled.py
    `register_outcome_reads`), and the run ends with no process left (`Fleetrl.finish`)."""
    result = run_fault(
        tmp_path, *FOUR_LANES, "cluster.exchange=compiled", fault("kill", "env", 1, 1), checkpointed=False
    )
    assert COMPILED_LINE in result.stderr, result.stderr[-3000:]
    assert_incident(result, "worker_died", ["env", 1], NOTICE_S)


def test_a_compiled_graph_that_cannot_be_built_is_a_config_error_with_ray_s_reason(tmp_path):
    """`cluster.exchange: compiled` where Ray cannot compile the graph: exit 2 naming the key, the
    value, the exchanges that would run and Ray's own reason; no traceback, no hang report."""
    run = fleetrl(*four_lane_cartpole(tmp_path, "cluster.exchange=compiled"), runs=tmp_path, env=BROKEN_GRAPHS)
    assert run.code == 2, run.stderr[-3000:]
    said = (
        "fleetrl: config error at 'cluster.exchange': got 'compiled'; expected 'auto', 'direct' or 'classic' here. "
        "The compiled graph cannot be built: RAY_CGRAPH_read_iteration_timeout_s (100.0) must be less than or "
        "equal to RAY_CGRAPH_get_timeout"
    )
    assert said in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and run.hang_report is None


@pytest.mark.parametrize(
    ("overrides", "process"),
    [
        ([], "the inline backend"),
        (
            [
                *FOUR_LANES[:2],
                "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
                "cluster.fuse_collocated=true",
            ],
            "a fused rank",
        ),
    ],
)
def test_compiled_exchange_where_env_and_rollout_share_a_process_is_a_config_error(overrides, process):
    with pytest.raises(ConfigError) as caught:
        resolve(load_config("configs/ppo_cartpole.yaml", [*overrides, "cluster.exchange=compiled"]))
    assert (caught.value.key, caught.value.value) == ("cluster.exchange", "compiled")
    assert caught.value.valid == "'auto' or 'classic' on this layout" and process in caught.value.hint


@pytest.mark.parametrize(
    ("steps", "lanes", "unroll"), [(32, 4, 8), (16, 1, 8), (12, 1, 6), (13, 1, 1), (32, 16, 2), (30, 64, 1)]
)
def test_steps_per_execution_divide_the_epoch_and_bound_the_channels(steps, lanes, unroll):
    assert unroll_for(steps, lanes) == unroll

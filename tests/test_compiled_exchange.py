"""Env ⇄ rollout through a Ray Compiled Graph (cluster/compiled_exchange.py), for real: local Ray,
2 env workers in 2 pipeline stages each (4 lanes) served by one rollout worker, real CartPole."""

from __future__ import annotations

import pytest
import torch

from fleetrl.checkpoint import load_latest
from fleetrl.cluster.compiled_exchange import unroll_for
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from tests.incidents import assert_incident, detection_bound, fault, run_fault
from tests.support import FOUR_LANES_ON_RAY as FOUR_LANES
from tests.support import TIMING_METRICS as TIMING
from tests.support import Fleetrl
from tests.support import four_lane_cartpole as cartpole

COMPILED_LINE = "[fleetrl] env⇄rollout exchange: compiled graph (4 lanes, 8 steps per execution)"
# A Ray setting that makes every compiled graph fail to build (its context rejects it): the
# compile raises for real, as on a Ray that cannot serve the layout.
BROKEN_GRAPHS = {"RAY_CGRAPH_read_iteration_timeout_s": "100"}


def test_compiled_graph_is_the_default_and_collects_every_lane_s_steps(tmp_path):
    """The CI representative (one Ray run, `cluster.exchange` left at its default, `auto`): the
    graph is built for the 4 lanes, and 2 iterations collect their 128 env steps each through it
    (the env workers' own counters, summed)."""
    runs = tmp_path / "runs"
    with Fleetrl(*cartpole(runs, iterations=2), runs=runs) as compiled:
        result = compiled.finish(timeout=400).succeeded()
    assert COMPILED_LINE in result.stderr, result.stderr[-3000:]
    assert [m["global_step"] for m in result.metrics] == [128, 256]
    assert result.summary["global_step"] == 256


@pytest.mark.slow  # two Ray runs side by side: 77-124 s on the loaded 2-core host
def test_compiled_graph_trains_exactly_as_the_classic_calls_and_the_fallback_says_why(tmp_path):
    """Same seed, same calls in the same order: every iteration's metrics (losses, returns,
    global_step) and the final weights are bitwise equal. The classic run is `auto` on a Ray whose
    graphs cannot compile: it falls back and logs the reason. Both runs go side by side."""
    compiled_runs, fallback_runs = tmp_path / "compiled", tmp_path / "fallback"
    with (
        Fleetrl(*cartpole(compiled_runs, "cluster.exchange=compiled"), runs=compiled_runs) as compiled,
        Fleetrl(*cartpole(fallback_runs, "cluster.exchange=auto"), runs=fallback_runs, env=BROKEN_GRAPHS) as fallback,
    ):
        graph, calls = compiled.finish(timeout=400).succeeded(), fallback.finish(timeout=400).succeeded()
    assert COMPILED_LINE in graph.stderr, graph.stderr[-3000:]
    assert (
        "[fleetrl] env⇄rollout exchange: classic actor calls (the compiled graph cannot be built: ValueError: "
        "RAY_CGRAPH_read_iteration_timeout_s (100.0) must be less than or equal to RAY_CGRAPH_get_timeout"
    ) in calls.stderr, calls.stderr[-3000:]
    untimed = [[{k: v for k, v in m.items() if k not in TIMING} for m in run.metrics] for run in (graph, calls)]
    assert [m["global_step"] for m in untimed[0]] == [128, 256, 384, 512]
    assert untimed[0] == untimed[1]
    weights = [load_latest(run.run_dir)["actor"]["policy"] for run in (graph, calls)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


@pytest.mark.slow  # 75-85 s on the loaded host; tests/test_freeze_proof.py's env.step hang on 2 env workers runs through the graph in CI
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
    assert_incident(result, "phase_timeout", ["env", 1], 3 + 10)
    assert "env.step" in result.hang_report["summary"], result.hang_report["summary"]


def test_env_worker_killed_on_its_first_step_inside_the_graph_is_named(tmp_path):
    """Env rank 1's process is killed (SIGKILL) as its very first `env.step` starts, inside the
    graph's loop: the controller's wait for the outcomes ends (no freeze) and the report names
    env rank 1 as `worker_died`, not the controller (Ray's failure monitor used to abort the
    controller when it closed the outcome channels, cluster/compiled_exchange.py
    `register_outcome_reads`), and the run ends with no process left (`Fleetrl.finish`)."""
    result = run_fault(
        tmp_path, *FOUR_LANES, "cluster.exchange=compiled", fault("kill", "env", 1, 1), checkpointed=False
    )
    assert COMPILED_LINE in result.stderr, result.stderr[-3000:]
    assert_incident(result, "worker_died", ["env", 1], detection_bound())


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

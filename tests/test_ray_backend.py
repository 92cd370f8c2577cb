"""The Ray backend for real: a local Ray cluster, simulated nodes, pinned workers, a DDP actor.
Each run is checked for Ray processes of its own left behind (`tests.support.Fleetrl`)."""

from __future__ import annotations

import json
import os

import pytest

from tests.support import DIRECT_LINE, LEARNING_GUARD_S, train


# ~50 s of CI's budget for what test_isolated_nodes.py's seed-placement test asserts of the same
# config with each node in its own namespaces (the target, the direct channels across nodes), and
# the documented command runs this config on simulated nodes (tests/test_doc_commands.py)
@pytest.mark.slow
def test_seed_placement_trains_cartpole_on_two_simulated_nodes(tmp_path):
    """The seed report's disaggregated layout, scaled to CPU slots, end to end: 2 raylets, env
    ranks on node 1, a 2-rank DDP actor and the rollout worker on node 0, pipelined in 2 stages;
    `cluster.exchange: auto` takes the direct channels."""
    run = train("configs/ppo_cartpole_2nodes.yaml", "runner.tensorboard=false", runs=tmp_path, timeout=LEARNING_GUARD_S)
    summary = run.succeeded().summary
    assert summary["target_reached"] and summary["target_reached_step"] == summary["global_step"], summary
    assert summary["episode_return_last100"] >= 475
    assert DIRECT_LINE in run.stderr, run.stderr[-3000:]


def test_every_worker_sees_where_it_runs(tmp_path):
    """Placement variables and cluster.env_vars on every env rank; started with no PYTHONPATH (the
    nodes inherit the driver's environment: like most nodes `ray start` made), no process gets an
    empty PYTHONPATH entry, which Python would read as its current directory. And an env worker's
    process runs simulators only: its start-up (watching, heartbeats, the store client), every
    call it answers and its close never load torch (~1.5 s of CPU per process, on the start-up
    path; read at the env's close, after the run)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    train(
        "configs/ppo_cartpole.yaml",
        "runner.tensorboard=false",
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0, env: 0-1}",
        "env.num_envs=4",
        "env.id=tests.ray_envs:WhereAmI",
        f"env.kwargs={{folder: {probe}}}",
        "cluster.env_vars={FLEETRL_TEST_MARK: hello}",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=32",
        "runner.total_env_steps=64",
        runs=runs,
        timeout=600,
        env={"PYTHONPATH": ""},
    ).succeeded()
    python_paths = {path.stem: path.read_text() for path in probe.glob("*.path")}
    assert len(python_paths) == 3 and all("" not in p.split(os.pathsep) for p in python_paths.values()), python_paths
    env_imports = [json.loads(path.read_text()) for path in probe.glob("*.torch")]
    env_imports = [seen for seen in env_imports if seen["component"] == "env"]
    assert len(env_imports) == 2 and all(seen["torch_modules"] == [] for seen in env_imports), env_imports
    seen = [json.loads(path.read_text()) for path in probe.glob("*.json")]
    # The preflight doctor builds one simulator in a probe process of the driver's (with
    # cluster.env_vars applied, but outside placement).
    preflight = [s for s in seen if s["FLEETRL_COMPONENT"] is None]
    assert len(preflight) == 1, seen
    by_rank = {s["FLEETRL_RANK"]: s for s in seen if s["FLEETRL_COMPONENT"] is not None}
    assert set(by_rank) == {"0", "1"}, seen
    for rank, variables in by_rank.items():
        assert variables == {
            "FLEETRL_COMPONENT": "env",
            "FLEETRL_RANK": rank,
            "FLEETRL_WORLD_SIZE": "2",
            "FLEETRL_NODE_RANK": "0",
            "CUDA_VISIBLE_DEVICES": rank,
            "FLEETRL_TEST_MARK": "hello",
        }

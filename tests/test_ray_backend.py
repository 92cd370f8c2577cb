"""The Ray backend for real: a local Ray cluster, simulated nodes, pinned workers, a DDP actor.
Each run is checked for Ray processes of its own left behind (`tests.support.Fleetrl`)."""

from __future__ import annotations

import json

from tests.support import train


def test_seed_placement_trains_cartpole_on_two_simulated_nodes(tmp_path):
    """The seed report's disaggregated layout, scaled to CPU slots, end to end: 2 raylets, env
    ranks on node 1, a 2-rank DDP actor and the rollout worker on node 0, pipelined in 2 stages."""
    run = train("configs/ppo_cartpole_2nodes.yaml", "runner.tensorboard=false", runs=tmp_path, timeout=600)
    summary = run.succeeded().summary
    assert summary["target_reached"], summary
    assert summary["episode_return_last100"] >= 475


def probed_run(tmp_path, env_id: str, *overrides: str) -> list[dict]:
    """A short Ray run of `env_id`, an env that writes `<folder>/<pid>.json` (tests/ray_envs.py):
    what each process that built one wrote."""
    probe = tmp_path / "probe"
    probe.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    train(
        "configs/ppo_cartpole.yaml",
        "runner.tensorboard=false",
        "cluster.backend=ray",
        f"env.id={env_id}",
        f"env.kwargs={{folder: {probe}}}",
        "env.num_envs=4",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=32",
        "runner.total_env_steps=64",
        *overrides,
        runs=runs,
        timeout=600,
    ).succeeded()
    return [json.loads(path.read_text()) for path in probe.glob("*.json")]


def test_every_worker_sees_where_it_runs(tmp_path):
    seen = probed_run(
        tmp_path,
        "tests.ray_envs:WhereAmI",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0, env: 0-1}",
        "cluster.env_vars={FLEETRL_TEST_MARK: hello}",
    )
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


def test_an_env_worker_process_never_imports_torch(tmp_path):
    """An env worker's Ray process runs simulators only: its start-up (watching, heartbeats, the
    store client), every call it answers and its close never load torch (~1.5 s of CPU per
    process, on the start-up path). The probe is read at the env's close, after the run."""
    seen = probed_run(
        tmp_path,
        "tests.ray_envs:TorchProbe",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
        "--skip-doctor",
    )
    env_workers = [s for s in seen if s["component"] == "env"]
    assert len(env_workers) == 1, seen
    assert env_workers[0]["torch_modules"] == [], seen

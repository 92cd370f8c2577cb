"""Fused ranks (`cluster.fuse_collocated`): rank r of env, rollout and actor in one Ray worker.
The layout rules, then real runs on Ray: the same numbers as inline, training to the target with
2 DDP ranks, checkpoint and resume, and faults named after the fused process and its phase."""

from __future__ import annotations

import os

import pytest

from fleetrl.cli import main
from fleetrl.errors import ConfigError
from fleetrl.plan.layout import fused_assignments
from fleetrl.plan.load import load_config
from fleetrl.plan.placement import resolve_placement
from fleetrl.plan.resolve import resolve
from tests.incidents import NOTICE_S, STALL_S, assert_incident, fault, run_fault
from tests.support import LEARNING_GUARD_S, TWO_ACTOR_RANKS_ON_RAY, train

FUSE = "cluster.fuse_collocated=true"
TWO_FUSED_RANKS = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
    FUSE,
]


def layout(*overrides: str):
    return resolve(load_config("configs/ppo_cartpole.yaml", [*overrides])).layout


class TestLayout:
    def test_collocated_ranks_fuse_on_ray(self):
        assert layout(*TWO_FUSED_RANKS).backend == "fused"

    def test_inline_is_one_process_already(self):
        assert layout(FUSE, "cluster.backend=inline").backend == "inline"

    @pytest.mark.parametrize(
        "placement, words",
        [
            ("{actor: 0-1, env: 0-1, rollout: 0}", "as many env and rollout ranks as actor ranks"),
            ("{actor: 0-1, env: 2-3, rollout: 0-1}", "rank 0: env on device 2"),
        ],
    )
    def test_placement_that_cannot_fuse_names_the_key(self, placement, words):
        with pytest.raises(ConfigError) as caught:
            layout(
                "cluster.backend=ray", "cluster.devices_per_node=4", f"cluster.component_placement={placement}", FUSE
            )
        assert caught.value.key == "cluster.fuse_collocated"
        assert words in str(caught.value)

    def test_a_node_s_cpus_are_shared_by_its_fused_ranks_only(self):
        """16 CPUs and 2 devices per node: 6 component processes would get 2 threads each, the 2
        fused processes get 8."""
        placement = resolve_placement(2, 2, {"actor": "all", "rollout": "all", "env": "all"}, cpu_count_per_node=16)
        fused = fused_assignments(placement, 16)
        assert {a.cpu_threads for a in placement.assignments} == {2}
        assert [(a.component, a.rank, a.node, a.device, a.cpu_threads) for a in fused] == [
            ("fused", 0, 0, 0, 8),
            ("fused", 1, 0, 1, 8),
            ("fused", 2, 1, 2, 8),
            ("fused", 3, 1, 3, 8),
        ]

    def test_dry_run_lists_the_fused_processes(self, capsys):
        assert main(["train", "configs/ppo_cartpole.yaml", *TWO_FUSED_RANKS, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "backend: ray (fused" in out
        assert "fused rank 1 on node 0 device 1" in out

    def test_fsdp_shards_cannot_serve_inference(self):
        with pytest.raises(ConfigError, match="fsdp"):
            layout(*TWO_FUSED_RANKS, "actor.strategy=fsdp")


def test_one_fused_rank_on_ray_reproduces_the_inline_run_exactly(tmp_path):
    """Same seeds, same construction order, same thread count (the fused process takes the
    node's CPUs; the controller is given as many): the Ray worker that hosts env, rollout and
    actor computes what the controller computes inline, bit for bit."""
    runs = {}
    for backend in ("inline", "ray"):
        (tmp_path / backend).mkdir()
        runs[backend] = (
            train(
                "configs/ppo_cartpole.yaml",
                "runner.tensorboard=false",
                f"cluster.backend={backend}",
                FUSE,
                f"runner.torch_threads={os.cpu_count()}",
                "runner.total_env_steps=2560",
                "--skip-doctor",
                runs=tmp_path / backend,
                timeout=600,
            )
            .succeeded()
            .metrics
        )
    keys = ("global_step", "episode_return_last100", "policy_loss", "value_loss", "approx_kl")
    assert [[r[k] for k in keys] for r in runs["ray"]] == [[r[k] for k in keys] for r in runs["inline"]]
    assert len(runs["ray"]) == 10


@pytest.mark.parametrize(
    "length",
    [
        # training to CartPole's target: ~2.5 min of CI's budget, where what only fused ranks can get
        # wrong (counters, weight syncs, the resume) shows in four iterations; the one-rank test
        # above proves a fused rank's updates equal the inline run's
        pytest.param("runner.target_return=475", marks=pytest.mark.slow, id="to-the-target"),
        pytest.param("runner.total_env_steps=1024", id="four-iterations"),
    ],
)
def test_two_fused_ranks_train_cartpole_and_resume(tmp_path, length):
    """2 DDP ranks, each collecting its own 4 envs in its own process: no weight sync, global
    counters summed over both ranks, and a checkpoint that resumes; to the target, or four iterations."""
    first = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        *TWO_FUSED_RANKS,
        length,
        "runner.checkpoint_interval=100",
        "--skip-doctor",
        runs=tmp_path,
        timeout=LEARNING_GUARD_S,
    ).succeeded()
    run_dir, records = first.run_dir, first.metrics
    if length.startswith("runner.target_return"):
        assert records[-1]["episode_return_last100"] >= 475
        assert first.summary["target_reached_step"] == records[-1]["global_step"], first.summary
    else:
        assert [r["global_step"] for r in records] == [256, 512, 768, 1024]
    assert [r["weight_syncs"] for r in records] == [0] * len(records)  # each rank acts with its own policy
    assert [r["global_step"] for r in records[:2]] == [256, 512]  # 2 ranks x 4 envs x 32 steps
    steps = records[-1]["global_step"]
    second = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        *TWO_FUSED_RANKS,
        f"runner.resume={run_dir}",
        f"runner.total_env_steps={steps + 512}",
        "--skip-doctor",
        runs=tmp_path,
    ).succeeded()
    assert second.run_dir == run_dir
    resumed = second.metrics[len(records) :]
    assert [r["global_step"] for r in resumed] == [steps + 256, steps + 512]
    assert resumed[0]["iteration"] == records[-1]["iteration"] + 1


# (fault kind, component, rank, call) → (cause, promised detection s, words the summary must hold)
FUSED_FAULTS = {
    # rank 0 trains meanwhile and waits in the first all-reduce for rank 1, which never comes
    "env.step never returns in fused rank 1": (
        ("hang", "env", 1, 40),
        ("rank_missing_from_collective", STALL_S, "in env.step"),
    ),
    "fused rank 1 killed while training": (("kill", "actor", 1, 3), ("worker_died", NOTICE_S, "died")),
    "env.step raises in fused rank 1": (
        ("exception", "env", 1, 40),
        ("worker_exception", NOTICE_S, "in env.step"),
    ),
}


@pytest.mark.parametrize("case", FUSED_FAULTS)
def test_fault_in_a_fused_rank_names_the_process_and_the_phase(tmp_path, case):
    (kind, component, rank, call), (cause, bound, words) = FUSED_FAULTS[case]
    result = run_fault(tmp_path, *TWO_FUSED_RANKS, fault(kind, component, rank, call))
    assert_incident(result, cause, ["fused", rank], bound)
    assert words in result.hang_report["summary"]

"""Cross-rank consistency checks: every `runner.param_check_interval` iterations the actor ranks
compare a fingerprint of every parameter and buffer; a rank that diverged stops the run, naming
the tensor and the rank."""

from __future__ import annotations

import pytest
import torch

from fleetrl.checkpoint import list_checkpoints
from fleetrl.parallel.param_check import ReplicaDivergenceError, odd_ranks
from tests import param_check_support
from tests.ranks import spawn_ranks
from tests.support import TWO_ACTOR_RANKS_ON_RAY, train


def test_odd_ranks_are_the_minority():
    assert odd_ranks([7, 7, 7, 7]) == []
    assert odd_ranks([7, 8]) == [1]  # two ranks: named against rank 0
    assert odd_ranks([7, 7, 9, 7]) == [2]
    assert odd_ranks([9, 7, 7, 7]) == [0]  # rank 0 itself can be the odd one
    assert odd_ranks([1, 2, 3]) == [1, 2]


def test_error_names_tensors_and_ranks():
    error = ReplicaDivergenceError({"policy.network.pi.bias": [1], "policy.log_std": [0, 2]}, 4)
    assert "policy.network.pi.bias (rank 1)" in str(error) and "policy.log_std (ranks 0, 2)" in str(error)


def test_one_ulp_on_one_rank_is_found_and_named():
    ranks = spawn_ranks(param_check_support.perturbing_rank, timeout_s=120)
    for result in ranks:
        assert result["initial"] == "agree"
        assert result["divergence"] == {"policy.network.aux_value_head.bias": [1]}
        assert "policy.network.aux_value_head.bias (rank 1)" in result["perturbed"]
        assert result["seconds"] < 5


def test_a_diverged_rank_stops_the_run_and_keeps_the_checkpoint(tmp_path):
    """End to end: 2 DDP actor ranks on Ray; actor rank 1's network moves a bias outside the loss
    path during iteration 2 (its 12th training forward); the check after iteration 2 stops the
    run with a report naming the parameter and the rank; iteration 1's checkpoint stays."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.num_envs=4",
        "model.id=tests.param_check_support:DriftingNet",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=32",
        "algorithm.update_epochs=4",
        "runner.param_check_interval=1",
        "runner.checkpoint_interval=1",
        "runner.total_env_steps=640",
        runs=tmp_path,
    )
    # an incident (docs/reference/exit-codes.md: 4): report written, every worker ended
    assert result.code == 4, result.stderr[-3000:]
    run_dir = result.run_dir
    report = (run_dir / "hang_report.txt").read_text()
    assert "ReplicaDivergenceError" in report and "policy.network.pi.bias (rank 1)" in report, report
    assert [p.name for p in list_checkpoints(run_dir)] == ["ckpt_00000001.pt"]
    saved = torch.load(list_checkpoints(run_dir)[0], weights_only=False)
    assert saved["iteration"] == 1


@pytest.mark.parametrize("drop_at", [1, 20], ids=["first-step", "after-warm-up"])
def test_a_rank_leaving_its_value_head_without_gradient_is_named_before_the_reduction(drop_at):
    """Seed 2's trap on 2 Gloo ranks: actor rank 1 stops using its value head at its first
    training forward, or at its 20th (iteration 0 has 12 gradient steps: after warm-up). Without the check Gloo
    aborts rank 1 on mismatched buckets; with it every rank raises the same error, naming the
    rank, the step and the parameters, before the reduction."""
    ranks = spawn_ranks(param_check_support.head_dropping_rank, drop_at, timeout_s=120)
    iteration = 0 if drop_at == 1 else 1
    for result in ranks:
        assert result["iteration"] == iteration, result
        error = result["error"]
        assert error.startswith("UnusedParameterError: the PPO loss of actor rank 1 left 2 trainable parameter(s)"), (
            error
        )
        assert "network.v.weight (rank 1); network.v.bias (rank 1)" in error, error
        step = 1 if drop_at == 1 else 20 - 12  # the gradient steps of iteration 0 were 12
        assert f"without a gradient at gradient step {step}:" in error, error


def test_seed_2s_trap_on_ray_names_the_rank_step_and_parameters_not_a_dead_worker(tmp_path):
    """End to end, seed 2's shape: 2 DDP actor ranks on Ray, actor rank 1 drops its value head
    from its 20th training forward (iteration 2). The report names rank 1, the step and the
    head's parameters; nobody is reported dead of Gloo's abort."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.num_envs=4",
        "model.id=tests.fault_models:HeadDroppingNet",
        "model.kwargs={drop_at: 20}",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=32",
        "algorithm.update_epochs=4",
        "runner.total_env_steps=6400",
        runs=tmp_path,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("worker_exception", ["actor", 1]), report["summary"]
    summary = report["summary"]
    assert "the PPO loss of actor rank 1 left 2 trainable parameter(s) without a gradient at gradient step" in summary
    assert "network.v.weight (rank 1); network.v.bias (rank 1)" in summary and "of actor.train call" in summary

"""Cross-rank consistency checks: every `runner.param_check_interval` iterations the actor ranks
compare a fingerprint of every parameter and buffer; a rank that diverged stops the run, naming
the tensor and the rank."""

from __future__ import annotations

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
    # an incident (README: exit code 4): report written, every worker ended
    assert result.code == 4, result.stderr[-3000:]
    run_dir = result.run_dir
    report = (run_dir / "hang_report.txt").read_text()
    assert "ReplicaDivergenceError" in report and "policy.network.pi.bias (rank 1)" in report, report
    assert [p.name for p in list_checkpoints(run_dir)] == ["ckpt_00000001.pt"]
    saved = torch.load(list_checkpoints(run_dir)[0], weights_only=False)
    assert saved["iteration"] == 1

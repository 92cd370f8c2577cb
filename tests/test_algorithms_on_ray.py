"""SAC, PPG and token-level PPO through the real runtime: 2 DDP actor ranks as Ray workers under
the watchdog, replicas compared every few iterations — each run finishes with no incident and
leaves none of its Ray processes behind."""

from __future__ import annotations

import math

from tests.support import TWO_ACTOR_RANKS_ON_RAY, train


def test_sac_with_two_ddp_ranks_on_ray(tmp_path):
    """Each rank trains on its own replay shard; the replicas (targets and alpha included) are
    compared every 5th iteration; env steps are counted over all env columns, not per rank."""
    run = train(
        "configs/sac_pendulum.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.num_envs=4",
        "algorithm.num_steps=4",
        "algorithm.minibatch_size=32",
        "algorithm.learning_starts=64",
        "model.hidden_sizes=[32, 32]",
        "runner.param_check_interval=5",
        "runner.checkpoint_interval=10",
        "runner.target_return=null",
        "runner.total_env_steps=640",
        runs=tmp_path,
    ).succeeded()
    records = run.metrics
    assert len(records) == 40 and records[-1]["global_step"] == 640
    assert records[-1]["replay_size"] == 640  # summed over both ranks' shards
    trained = [r for r in records if r["grad_steps"]]
    assert trained and all(math.isfinite(r["q_loss"]) and r["alpha"] > 0 for r in trained)
    assert run.summary["iterations"] == 40


def test_token_level_ppo_with_grpo_and_two_ddp_ranks_on_ray(tmp_path):
    """Discretised Pendulum actions, per-token ratios, group-relative advantages whose groups lie
    within one rank's env columns."""
    run = train(
        "configs/ppo_pendulum_tokens.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.num_envs=8",
        "env.max_episode_steps=32",
        "algorithm.num_steps=32",
        "algorithm.minibatch_size=64",
        "algorithm.update_epochs=2",
        "algorithm.adv_type=grpo",
        "algorithm.group_size=4",
        "algorithm.norm_adv=false",
        "runner.param_check_interval=2",
        "runner.checkpoint_interval=4",
        "runner.target_return=null",
        "runner.total_env_steps=2048",
        runs=tmp_path,
    ).succeeded()
    records = run.metrics
    assert len(records) == 8 and records[-1]["global_step"] == 2048
    assert records[-1]["episodes"] == 8 * 8  # 32-step episodes: every env ends one per iteration
    assert all(math.isfinite(r["policy_loss"]) and math.isfinite(r["approx_kl"]) for r in records)
    assert run.summary["iterations"] == 8

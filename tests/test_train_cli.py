"""End to end through the `fleetrl` command: train CartPole to a learned policy, evaluate it,
plot it; and a continuous-action (Box) smoke run with observation and reward normalisation."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.controller.loop import Trainer
from fleetrl.evaluate import evaluate
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.tracking.jsonl import read_metrics
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import play
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.support import FLEETRL, LEARNING_GUARD_S, REPO, fleetrl, subprocess_env, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """One real training run, shared by the tests below: the config file's 100k-step budget,
    stopping early once the last-100-episode mean reaches 195 (it gets there in ~30k steps)."""
    tmp = tmp_path_factory.mktemp("cartpole")
    result = train(
        CARTPOLE, "runner.seed=1", "runner.target_return=195", runs=tmp / "runs", cwd=tmp, timeout=LEARNING_GUARD_S
    )
    assert result.code == 0, result.stderr[-3000:]
    assert f"run directory: {result.run_dir}" in result.stdout
    return result.run_dir


def test_cartpole_learns(cartpole_run):
    summary = json.loads((cartpole_run / "summary.json").read_text())
    assert summary["target_reached"] is True, summary
    assert summary["episode_return_last100"] >= 195
    assert summary["target_reached_step"] == summary["global_step"] <= 100_000  # stopped there
    records = read_metrics(cartpole_run)
    assert len(records) == summary["iterations"]
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    assert [r["global_step"] for r in records] == [256 * i for i in range(1, len(records) + 1)]
    assert records[-1]["episode_return_last100"] == pytest.approx(summary["episode_return_last100"])
    assert records[0]["episode_return_last100"] < 100  # it did learn: CartPole starts near 20
    for key in ("policy_loss", "value_loss", "approx_kl", "lr"):
        assert all(math.isfinite(r[key]) for r in records), key
    assert (cartpole_run / "config.yaml").is_file() and (cartpole_run / "train.log").stat().st_size > 0
    assert list((cartpole_run / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events"
    assert load_latest(cartpole_run)["iteration"] == summary["iterations"]


def test_eval_json(cartpole_run):
    result = fleetrl("eval", str(cartpole_run), "--episodes", "5", "--json", cwd=cartpole_run.parent)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["episodes"] == 5
    assert report["mean"] >= 195, report
    assert report["min"] <= report["mean"] <= report["max"] <= 500
    assert report["deterministic"] is True
    assert report["run_dir"] == str(cartpole_run)
    # every episode listed (no success or task: CartPole reports none), and the whole result written
    episodes = report["per_episode"]
    assert sorted((e["env"], e["episode"]) for e in episodes) == [(env, 0) for env in range(5)]
    assert min(e["return"] for e in episodes) == report["min"] and max(e["return"] for e in episodes) == report["max"]
    assert all(set(e) == {"env", "episode", "return", "length"} for e in episodes)
    written = cartpole_run / "eval" / "seed10000_episodes5.json"
    assert report["written"] == str(written) and json.loads(written.read_text())["per_episode"] == episodes


def test_report_writes_two_pngs(cartpole_run):
    result = fleetrl("report", str(cartpole_run), cwd=cartpole_run.parent)
    assert result.code == 0, result.stderr
    for name in ("learning_curve.png", "time_per_phase.png"):
        path = cartpole_run / name
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        assert path.stat().st_size > 5_000, f"{name} looks empty"
        assert str(path) in result.stdout


def test_eval_uses_the_runs_torch_threads(cartpole_run):
    """`runner.torch_threads` (1 in this run) must hold in `fleetrl eval` too: with torch's
    default (one thread per core) the tiny per-step forward passes of evaluation contend for the
    cores (on this 2-core machine under load: 13 s instead of 0.1 s for 5 CartPole episodes)."""
    script = (
        "import sys, torch\nfrom fleetrl.cli import main\n"
        f"code = main(['eval', {str(cartpole_run)!r}, '--episodes', '1', '--json'])\n"
        "print('THREADS', torch.get_num_threads(), code)\n"
    )
    result = subprocess.run(
        [*FLEETRL[:1], "-c", script],
        cwd=cartpole_run.parent,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    configured = load_config(cartpole_run / "config.yaml").runner.torch_threads
    assert configured == 1
    assert f"THREADS {configured} 0" in result.stdout


def test_eval_and_report_user_errors(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--episodes", "2"]) == 2
    assert "not a fleetrl run directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_eval_episodes_must_be_positive(cartpole_run, capsys):
    assert main(["eval", str(cartpole_run), "--episodes", "0"]) == 2
    assert "--episodes" in capsys.readouterr().err


# --- continuous actions ------------------------------------------------------------------------


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_pendulum_with_normalisation_trains_checkpoints_and_evaluates(tmp_path):
    config = load_config(
        None,
        [
            "env.id=Pendulum-v1",
            "env.num_envs=2",
            "env.normalize_obs=true",
            "env.normalize_reward=true",
            "algorithm.num_steps=64",
            "algorithm.minibatch_size=64",
            "algorithm.update_epochs=2",
            "runner.total_env_steps=256",
            "runner.tensorboard=false",
            f"runner.run_dir={tmp_path}",
        ],
    )
    summary = Trainer(resolve(config), live_progress=False).train()
    run_dir = Path(summary["run_dir"])
    assert (summary["iterations"], summary["global_step"]) == (2, 256)
    records = read_metrics(run_dir)
    assert len(records) == 2
    assert all(math.isfinite(r["policy_loss"]) and math.isfinite(r["value_loss"]) for r in records)

    state = load_latest(run_dir)
    assert state["actor"]["policy"]["log_std"].shape == (1,)  # the Gaussian's learned log std
    (env_state,) = state["env"]
    # 2 reset observations + 128 steps x 2 envs (Pendulum truncates at 200: no final obs yet);
    # RunningMeanStd starts at count 1e-4
    assert env_state["obs_norm"]["count"] == pytest.approx(2 + 256 + 1e-4)
    assert env_state["obs_norm"]["mean"].shape == (3,)
    assert np.abs(env_state["obs_norm"]["mean"]).max() > 1e-3
    assert env_state["reward_norm"]["count"] == pytest.approx(256 + 1e-4)
    assert env_state["reward_norm"]["var"] != pytest.approx(1.0)

    # eval restores (and freezes) the statistics: it matches a replay that loads them, and not
    # one that does not
    result = evaluate(run_dir, episodes=2, seed=123)
    assert result["episodes"] == 2

    def replay(restore: bool) -> list[float]:
        env = EnvWorker(config.env, config.algorithm.gamma, 123, num_envs=2, training=False)
        try:
            if restore:
                env.load_state_dict(env_state)
            policy = Policy.from_config(config.model, env.observation_space, env.action_space)
            policy.load_state_dict(state["actor"]["policy"])
            returns = play(env, RolloutWorker(policy), 2, True, False).returns
            if restore:
                assert env.obs_norm.stats.count == env_state["obs_norm"]["count"], "stats moved in eval"
            return returns
        finally:
            env.close()

    restored = replay(restore=True)
    assert result["mean"] == pytest.approx(float(np.mean(restored)), rel=1e-6)
    assert result["min"] == pytest.approx(min(restored), rel=1e-6)
    assert result["mean"] != pytest.approx(float(np.mean(replay(restore=False))), rel=1e-6)

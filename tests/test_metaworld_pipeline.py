"""The Meta-World pipeline through the CLI, as a user runs it (docs/guides/manipulation.md,
Meta-World): `fleetrl record` of Meta-World's scripted policies → `fleetrl sft` → `fleetrl train`
from it → `fleetrl eval` with Meta-World's figures (success per task, their mean, every episode), on
state and on camera images; the Hugging Face VLA config trained briefly; and a scene build or first
render that computes past the watchdog's start-up bounds is a warning, never a `startup_timeout`.

Small for CI: two cheap tasks, 2 envs, a few steps; the committed results come from the configs'
own sizes (docs/benchmarks/metaworld/)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from fleetrl.checkpoint import load_latest
from tests.support import fleetrl, sft_then_train, train

TASKS = ["reach-v3", "button-press-topdown-v3"]


def small_env(observation: str) -> str:
    return (
        f"env.kwargs={{tasks: [{', '.join(TASKS)}], observation: {observation}, image_size: 16,"
        " max_steps: {reach-v3: 12, button-press-topdown-v3: 12}}"
    )


SMALL = ["env.num_envs=2", "algorithm.num_steps=8", "algorithm.minibatch_size=8", "runner.tensorboard=false"]


def record_sft_train(tmp_path, env: str, record_env: str, *extra: str, both: tuple[str, ...] = ()):
    """`fleetrl record` (2 episodes), `fleetrl sft` from them, `fleetrl train` from that: the SFT
    run's and the RL run's results. Start-up bounds far below a scene's build (a MuJoCo compile)
    and EGL's first render: each computes past them, and is a warning, not a startup_timeout."""
    demos = tmp_path / "demos"
    recorded = fleetrl(
        "record", "configs/sft_metaworld.yaml", record_env, "--episodes", "2", "--out", str(demos), timeout=180
    )
    assert recorded.code == 0, recorded.stderr
    assert "2 successful episodes of 2 attempted" in recorded.stdout
    # beats (and polls) every 50 ms: enough of them inside a scene build, however fast the host, to
    # judge it busy (judging/judgement.py MIN_SAMPLES), rather than past its bound with too few to tell
    beats = ("watchdog.heartbeat_interval_s=0.05", "watchdog.poll_interval_s=0.05")
    bounds = ("watchdog.first_call_bound_s=0.05", "watchdog.startup_step_allowance_s=0.05", *beats)
    sft, rl = sft_then_train(
        tmp_path,
        (
            "configs/sft_metaworld.yaml",
            record_env,
            *SMALL,
            f"algorithm.demonstrations={demos}",
            "algorithm.updates_per_iteration=3",
            "runner.total_env_steps=16",
            *both,
            *bounds,
        ),
        ("configs/ppo_metaworld.yaml", env, *SMALL, *extra, *both, *bounds),
    )
    assert "slow: " in sft.stderr + rl.stderr and "startup_timeout" not in sft.stderr + rl.stderr
    assert all(record["bc_loss"] > 0 for record in sft.metrics)
    return sft, rl


def test_record_sft_train_then_eval_per_task(tmp_path):
    """On state, inputs standardised (`model.standardize_inputs`): the pipeline, then Meta-World's
    figures from `fleetrl eval`: 20 episodes on 10 envs are one round of both tasks per env, 10
    per task, each episode listed and written."""
    env = small_env("state")
    # the scripted policies need ~50-70 steps: record with a longer limit than RL's
    sft, rl = record_sft_train(
        tmp_path,
        env,
        env.replace("{reach-v3: 12, button-press-topdown-v3: 12}", "150"),
        "runner.total_env_steps=32",
        both=("model.standardize_inputs=true",),
    )
    # The statistics are the demonstrations' (read here from LeRobot's parquet), in both trunks,
    # and the RL stage holds them unchanged: the weights carry them, no update moves them.
    files = sorted((tmp_path / "demos/data").glob("*/*.parquet"))
    frames = pd.concat([pq.read_table(path).to_pandas() for path in files])
    sft_weights, rl_weights = (load_latest(run.run_dir)["actor"]["policy"] for run in (sft, rl))
    for key in ("state", "proprio"):
        values = np.stack(frames[f"observation.{key}"].to_numpy()).astype(np.float64)
        std = values.std(0)
        expected = {"mean": values.mean(0), "std": np.where(std < 1e-6, 1.0, std)}
        assert (std > 1e-3).any() and (key == "proprio" or (std < 1e-6).any())  # state: a second object's constant
        for trunk in ("network", "network.critic"):
            for name, value in expected.items():
                held = sft_weights[f"{trunk}.inputs.{key}.{name}"]
                assert torch.allclose(held.double(), torch.from_numpy(value), rtol=1e-5, atol=1e-6), (trunk, key, name)
                assert torch.equal(rl_weights[f"{trunk}.inputs.{key}.{name}"], held)
    assert [record["policy_trained"] for record in rl.metrics] == [0, 0]  # the config's critic warm-up
    per_task = {key for record in rl.metrics for key in record if key.startswith("success_rate/")}
    assert per_task == {f"success_rate/{task}" for task in TASKS}

    played = fleetrl("eval", str(rl.run_dir), "--episodes", "20", "--seed", "50000", "--json", timeout=180)
    assert played.code == 0, played.stderr
    report = json.loads(played.stdout)
    episodes = report["per_episode"]
    assert [sorted(e) for e in episodes] == [["env", "episode", "length", "return", "success", "task"]] * 20
    assert sorted((e["env"], e["episode"]) for e in episodes) == [(env, n) for env in range(10) for n in range(2)]
    for task in TASKS:
        mine = [e["success"] for e in episodes if e["task"] == task]
        assert len(mine) == 10 and report[f"success_rate/{task}"] == sum(mine) / 10
    rates = [report[f"success_rate/{task}"] for task in TASKS]
    assert report["success_rate_task_mean"] == sum(rates) / 2
    written = rl.run_dir / "eval" / "seed50000_episodes20.json"
    assert json.loads(written.read_text())["per_episode"] == episodes

    held_out = fleetrl(
        "eval", str(rl.run_dir), "env.kwargs.instructions=held_out", "--episodes", "2", "--seed", "50000", timeout=180
    )
    assert held_out.code == 0, held_out.stderr
    assert "success per task:" in held_out.stdout and "mean over tasks" in held_out.stdout
    assert (rl.run_dir / "eval" / "seed50000_episodes2_instructions-held_out.json").is_file()
    refused = fleetrl("eval", str(rl.run_dir), "model.embed_dim=32", timeout=60)
    assert refused.code == 2 and "only env keys" in refused.stderr and "model.embed_dim=32" in refused.stderr


# ~180 s on a loaded 2-core host, over the CI share (about 240 s for all its tests): CI
# covers camera images through the CLI with the VLA test below and the env's own render test.
@pytest.mark.slow
def test_record_sft_train_on_camera_images(tmp_path):
    """On 16×16 `corner` images of one task: demonstrations with images, cloned, then PPO."""
    env = (
        small_env("pixels")
        .replace("reach-v3, button-press-topdown-v3", "reach-v3")
        .replace(", button-press-topdown-v3: 12", "")
    )
    _, rl = record_sft_train(tmp_path, env, env.replace("{reach-v3: 12}", "150"), "runner.total_env_steps=32")
    assert [record["iteration"] for record in rl.metrics] == [1, 2] and "success_rate/reach-v3" in rl.metrics[1]


def test_vla_config_trains_on_camera_images(tmp_path, tiny_paligemma):
    """configs/ppo_metaworld_vla.yaml: the tiny PaliGemma with LoRA, chunks of 4, on 32×32 corner images."""
    finished = train(
        "configs/ppo_metaworld_vla.yaml",
        small_env("pixels").replace("image_size: 16", "image_size: 32"),
        f"model.path={tiny_paligemma}",
        "env.num_envs=2",
        "algorithm.num_steps=4",
        "algorithm.minibatch_size=8",
        "algorithm.update_epochs=1",
        "runner.total_env_steps=32",
        "runner.tensorboard=false",
        runs=tmp_path,
        timeout=300,
    )
    assert finished.code == 0, finished.stderr
    # 2 envs × 4 decisions × 4 steps: the 12-step episodes end inside the last chunks
    assert [record["iteration"] for record in finished.metrics] == [1] and "success_rate" in finished.metrics[0]

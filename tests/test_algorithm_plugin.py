"""A fourth algorithm plugged in from outside the package (tests/reinforce_algorithm.py):
trained through the ordinary `Trainer`, and through `fleetrl train` found by its entry point;
the loader, the validation and the console line treat it as they treat the built-in algorithms.
"""

from __future__ import annotations

import math
import os

import pytest

from fleetrl.algos.registry import algorithm_names, algorithm_spec, register_algorithm, unregister_algorithm
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.progress import summary_line
from fleetrl.run_dir import LOG_FILE
from fleetrl.tracking.jsonl import read_metrics
from tests.reinforce_algorithm import SPEC, ReinforceActor, ReinforceConfig
from tests.support import subprocess_env, train

REINFORCE = ["algorithm.name=reinforce", "env.num_envs=4", "algorithm.num_steps=32"]


@pytest.fixture(autouse=True)
def reinforce_registered():
    """REINFORCE registered for this test only, as a plugin's import would register it."""
    register_algorithm(SPEC)
    yield
    unregister_algorithm(SPEC.name)


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_the_plugged_in_algorithm_trains_through_the_trainer(tmp_path):
    config = load_config(
        None,
        [
            *REINFORCE,
            "algorithm.baseline_coef=0.25",
            "runner.total_env_steps=512",
            "runner.tensorboard=false",
            f"runner.run_dir={tmp_path}",
        ],
    )
    assert type(config.algorithm) is ReinforceConfig and config.algorithm.baseline_coef == 0.25
    summary = Trainer(resolve(config), live_progress=False).train()
    assert summary["iterations"] == 4  # 512 steps / (32 steps × 4 envs)
    records = read_metrics(summary["run_dir"])
    assert len(records) == 4
    assert all(math.isfinite(r["pg_loss"]) and r["baseline_loss"] > 0 for r in records)
    # the console line (written to train.log too) carries its own metric, as its spec says
    log_lines = (tmp_path.glob(f"*/{LOG_FILE}").__next__()).read_text().splitlines()
    iteration_lines = [line for line in log_lines if "| return(100)" in line]
    assert len(iteration_lines) == 4
    assert f"| baseline {records[-1]['baseline_loss']:.3f}" in iteration_lines[-1]
    assert "| kl " not in iteration_lines[-1]


def test_the_registry_names_it_and_the_loader_builds_its_section():
    assert "reinforce" in algorithm_names()
    assert algorithm_spec("reinforce").actor is ReinforceActor
    record = {"iteration": 3, "global_step": 384, "steps_per_s": 1000.0, "baseline_loss": 1.23456}
    line = summary_line(record, algorithm_spec("reinforce").console_metrics)
    assert line.endswith("| return(100) n/a | baseline 1.235")
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["algorithm.name=reinforc"])
    assert caught.value.key == "algorithm.name" and "did you mean 'reinforce'" in str(caught.value)


@pytest.mark.parametrize("value", [2, -0.5, "high"])
def test_a_bad_value_of_its_own_key_is_a_config_error(value):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*REINFORCE, f"algorithm.baseline_coef={value}"])
    assert caught.value.key == "algorithm.baseline_coef" and caught.value.value == value


def test_another_algorithms_key_is_an_error_naming_it():
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*REINFORCE, "algorithm.clip_coef=0.1"])
    assert caught.value.key == "algorithm.clip_coef"
    assert "'clip_coef' is a key of ppo and ppg, not of reinforce" in str(caught.value)
    assert "baseline_coef" in caught.value.valid  # its own keys are the valid ones
    # and the other way round: its key is not PPO's
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["algorithm.baseline_coef=0.5"])
    assert "'baseline_coef' is a key of reinforce, not of ppo" in str(caught.value)


def test_an_installed_plugin_is_found_by_its_entry_point(tmp_path):
    """A package that declares `[fleetrl.algorithms] reinforce = module:SPEC` in its metadata
    trains from the command line: the CLI and its worker processes find the algorithm by name."""
    site = tmp_path / "site"
    info = site / "fleetrl_reinforce-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetrl-reinforce\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fleetrl.algorithms]\nreinforce = tests.reinforce_algorithm:SPEC\n")
    config = tmp_path / "reinforce.yaml"
    config.write_text("algorithm:\n  name: reinforce\n  num_steps: 32\n  baseline_coef: 0.25\nenv:\n  num_envs: 4\n")
    result = train(
        config,
        "runner.total_env_steps=256",
        "runner.tensorboard=false",
        "--skip-doctor",
        runs=tmp_path / "runs",
        env={"PYTHONPATH": os.pathsep.join([str(site), subprocess_env()["PYTHONPATH"]])},
    ).succeeded()
    records = result.metrics
    assert len(records) == 2 and all(r["baseline_loss"] > 0 for r in records)


def test_unregistered_it_is_unknown_again():
    """What the fixture registered is gone once unregistered: no later test sees REINFORCE unless
    it registers it (or installs its entry point)."""
    unregister_algorithm(SPEC.name)
    try:
        assert "reinforce" not in algorithm_names()
        with pytest.raises(ConfigError) as caught:
            load_config(None, REINFORCE)
        assert (caught.value.key, caught.value.value) == ("algorithm.name", "reinforce")
    finally:
        register_algorithm(SPEC)  # for the fixture's own unregistering

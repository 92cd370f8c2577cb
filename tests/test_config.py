"""Config mistakes, through the real `fleetrl train` command: exit code 2, one message on stderr
naming the key, the bad value and what is valid, no traceback, nothing started.
And the happy path: overrides are YAML-typed, the saved config reloads to an equal Config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetrl.algos.ppo.config import PPOConfig
from fleetrl.cli import main
from fleetrl.config.loader import read_yaml, save_config
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError, UserError
from fleetrl.plan.load import load_config, parsed_algorithm
from tests.support import REPO, Finished, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
QUICK = ["runner.total_env_steps=512", "runner.tensorboard=false", "runner.checkpoint_interval=1000"]


def train_quick(tmp_path: Path, *args: str, config: str = CARTPOLE) -> Finished:
    """`fleetrl train` in a subprocess, run directories under tmp_path/runs, cwd tmp_path."""
    return train(config, *QUICK, *args, runs=tmp_path / "runs", cwd=tmp_path, timeout=120)


def config_for(override: str, folder: Path) -> str:
    """The CartPole config; for a network of one's own (`model.id=module:attr`) without its MLP
    keys, which another kind of model does not take."""
    if not override.startswith("model.id=") or ":" not in override:
        return CARTPOLE
    raw = read_yaml(CARTPOLE)
    del raw["model"]
    (folder / "custom_model.yaml").write_text(yaml.safe_dump(raw))
    return str(folder / "custom_model.yaml")


BAD_INPUTS = {
    # id: (override, fragments the message must contain)
    "unknown key": ("algorithm.gama=0.9", ["algorithm.gama", "0.9", "did you mean 'gamma'"]),
    "wrong type": ("env.num_envs=abc", ["env.num_envs", "'abc'", "int"]),
    "unknown env id": ("env.id=CartPol-v1", ["env.id", "CartPol-v1", "'CartPole-v1'"]),
    "negative lr": ("algorithm.lr=-0.001", ["algorithm.lr", "-0.001", "> 0"]),
    "minibatch not dividing the batch": (
        "algorithm.minibatch_size=100",
        ["algorithm.minibatch_size", "100", "divisor", "256"],
    ),
    "unknown section": ("algorithmm.lr=0.1", ["algorithmm", "did you mean 'algorithm'"]),
    "model entry point, missing attribute": (
        "model.id=fleetrl.models.mlp:ActorCriticMLx",
        ["model.id", "fleetrl.models.mlp:ActorCriticMLx", "did you mean 'ActorCriticMLP'"],
    ),
    # the override's value is not valid YAML
    "malformed override value": ("model.hidden_sizes=[32,", ["model.hidden_sizes", "[32,"]),
    "resume from a folder that does not exist": (
        "runner.resume=/nonexistent/fleetrl-run",
        ["runner.resume", "/nonexistent/fleetrl-run"],
    ),
    "env kwargs the env does not take": ("env.kwargs={no_such_arg: 1}", ["env.kwargs", "no_such_arg"]),
}

# More of the same, through `fleetrl.cli.main` in this process (a subprocess costs ~1.5 s of imports).
MORE_BAD_INPUTS = {
    "bool for int": ("env.num_envs=true", ["env.num_envs", "True", "int"]),
    "bad choice": ("model.activation=sigmoid", ["model.activation", "sigmoid", "tanh", "relu"]),
    "gamma out of range": ("algorithm.gamma=1.5", ["algorithm.gamma", "1.5", "[0, 1]"]),
    "model entry point, missing module": (
        "model.id=no_such_module_xyz:Net",
        ["model.id", "no_such_module_xyz:Net", "no_such_module_xyz"],
    ),
    "model entry point, no colon": ("model.id=mlpp", ["model.id", "mlpp", "module:attr"]),
    "model entry point, not callable": (
        "model.id=fleetrl.models.mlp:ACTIVATIONS",
        ["model.id", "fleetrl.models.mlp:ACTIVATIONS", "callable"],
    ),
    "env entry point, missing attribute": (
        "env.id=tests.envs:CountingEnvv",
        ["env.id", "tests.envs:CountingEnvv", "did you mean 'CountingEnv'"],
    ),
    "override without '='": ("algorithm.lr", ["algorithm.lr", "section.key=value"]),
    "zero hidden size": ("model.hidden_sizes=[32,0]", ["model.hidden_sizes[1]", "got 0", "positive"]),
    "string for a list": ("model.hidden_sizes=64", ["model.hidden_sizes", "64", "list"]),
    "section that is not a mapping": ("runner=3", ["runner", "3", "mapping"]),
    "zero max_episode_steps": ("env.max_episode_steps=0", ["env.max_episode_steps", "0"]),
    # each algorithm's section holds its own keys; another algorithm's key is named as such
    "ppg key with ppo": ("algorithm.n_pi=4", ["algorithm.n_pi", "'n_pi' is a key of ppg, not of ppo"]),
    "sac key with ppo": ("algorithm.tau=0.1", ["algorithm.tau", "'tau' is a key of sac, not of ppo"]),
    "unknown algorithm": ("algorithm.name=ppgg", ["algorithm.name", "ppgg", "'ppo'", "did you mean 'ppg'"]),
    "bad choice of an algorithm key": ("algorithm.adv_type=gpro", ["algorithm.adv_type", "gpro", "grpo"]),
    # keys that moved into an algorithm's package say where they went
    "moved key": (
        "runner.checkpoint_replay_buffer=true",
        ["runner.checkpoint_replay_buffer", "it is algorithm.checkpoint_replay_buffer now"],
    ),
    "removed key": ("model.aux_value_head=true", ["model.aux_value_head", "adds the head to the policy itself"]),
}


def assert_user_error(result: Finished, fragments: list[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 2, f"exit code {result.code}; stderr:\n{result.stderr}"
    message = result.stderr.strip()
    assert message.startswith("fleetrl: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("override, fragments", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_override_is_a_clear_user_error(tmp_path, override, fragments):
    result = train_quick(tmp_path, override, config=config_for(override, tmp_path))
    assert_user_error(result, fragments)
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run directory was created before the error"


@pytest.mark.parametrize("override, fragments", MORE_BAD_INPUTS.values(), ids=MORE_BAD_INPUTS.keys())
def test_more_bad_overrides_in_process(tmp_path, capsys, override, fragments):
    code = main(["train", config_for(override, tmp_path), *QUICK, f"runner.run_dir={tmp_path / 'runs'}", override])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    message = captured.err.strip()
    assert message.startswith("fleetrl: ") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not (tmp_path / "runs").exists()


def test_missing_config_file(tmp_path):
    missing = tmp_path / "no_such_config.yaml"
    result = train_quick(tmp_path, config=str(missing))
    assert_user_error(result, [str(missing), "not found"])


def test_unknown_section_in_the_file(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("env:\n  id: CartPole-v1\ntrainer:\n  lr: 0.1\n")
    result = train_quick(tmp_path, config=str(config))
    assert_user_error(result, ["trainer", "env", "runner"])


def test_file_that_is_not_yaml(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("env: [unclosed\n")
    result = train_quick(tmp_path, config=str(config))
    assert_user_error(result, [str(config), "YAML"])


def test_dry_run_starts_nothing(tmp_path):
    result = train_quick(tmp_path, "--dry-run")
    assert result.code == 0, result.stderr
    assert "inline" in result.stdout
    assert not (tmp_path / "runs").exists()


# --- in-process: parsing and round trips --------------------------------------------------------


def test_overrides_are_parsed_as_yaml():
    config = load_config(
        CARTPOLE,
        [
            "algorithm.lr=3e-4",
            "model.hidden_sizes=[32,32]",
            "env.normalize_obs=true",
            "algorithm.target_kl=0.02",
            "runner.name=null",
            "env.kwargs={render_mode: null}",
            "algorithm.gamma=1",
            "runner.seed=7",
        ],
    )
    assert config.algorithm.lr == 3e-4 and type(config.algorithm.lr) is float
    assert config.model.hidden_sizes == [32, 32]
    assert config.env.normalize_obs is True
    assert config.algorithm.target_kl == 0.02
    assert config.runner.name is None
    assert config.env.kwargs == {"render_mode": None}
    assert config.algorithm.gamma == 1.0 and type(config.algorithm.gamma) is float
    assert config.runner.seed == 7 and type(config.runner.seed) is int
    # and the file's values are kept where not overridden
    assert config.algorithm.update_epochs == 10 and config.env.id == "CartPole-v1"


def test_later_override_wins():
    config = load_config(CARTPOLE, ["runner.seed=2", "runner.seed=3"])
    assert config.runner.seed == 3


def test_defaults_without_a_file():
    assert load_config(None) == parsed_algorithm(Config())
    assert type(load_config(None).algorithm) is PPOConfig


def test_a_default_config_imports_no_torch():
    """config/ is the bottom layer: building the defaults imports no algorithm, hence no torch."""
    code = (
        "import sys\n"
        "from fleetrl.config.schema import Config\n"
        "Config()\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith(('torch', 'fleetrl')))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_override_into_an_empty_section_of_the_file(tmp_path):
    """`runner:` with nothing under it is valid YAML (the section is None); a dotted override
    into it must still work, as it does for a section that is absent."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("env:\n  id: CartPole-v1\nrunner:\n")
    assert load_config(config_file).runner.seed == 1
    assert load_config(config_file, ["runner.seed=3"]).runner.seed == 3


def test_override_through_a_value_is_an_error():
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["env.id.x=1"])
    assert "env.id" in str(caught.value)


def test_save_config_round_trip(tmp_path):
    config = load_config(
        CARTPOLE,
        [
            "algorithm.lr=1e-5",
            "model.hidden_sizes=[16, 8]",
            "env.kwargs={a: 1, b: [1, 2]}",
            "algorithm.target_kl=0.015",
            "env.max_episode_steps=200",
            "runner.name=x y:z",
        ],
    )
    path = tmp_path / "config.yaml"
    save_config(config, path)
    assert load_config(path) == config


def test_run_directory_config_reloads_to_the_same_config(tmp_path):
    overrides = [
        "algorithm.lr=3e-4",
        "model.hidden_sizes=[32,32]",
        "env.num_envs=4",
        "algorithm.minibatch_size=64",
        "runner.seed=5",
    ]
    result = train_quick(tmp_path, *overrides)
    assert result.code == 0, result.stderr
    saved = load_config(result.run_dir / "config.yaml")
    expected = load_config(CARTPOLE, [*QUICK, f"runner.run_dir={tmp_path / 'runs'}", *overrides])
    assert saved == expected
    assert saved.algorithm.lr == 3e-4 and saved.model.hidden_sizes == [32, 32]


def test_user_error_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["env.num_envs=0"])
    assert caught.value.key == "env.num_envs" and caught.value.value == 0
    assert isinstance(caught.value, UserError)

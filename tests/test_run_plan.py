"""The one resolve step (plan/resolve.py): a rule across sections fails at `resolve`, with the
message `fleetrl train` prints (exit 2); the plan it returns cannot change under the run; and the
controller unpickles it in its first instant without importing torch."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

from fleetrl.cli import main
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_unchecked
from fleetrl.plan.resolve import resolve
from tests.support import REPO, subprocess_env

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")

# id: (overrides, the key named; for rules this step moved into plan/, the whole message)
BROKEN_RULES = {
    "watchdog keys (the config alone)": (["watchdog.heartbeat_interval_s=6"], "watchdog.heartbeat_interval_s", None),
    "a backend that cannot hold the placement": (
        [
            "cluster.backend=inline",
            "cluster.devices_per_node=2",
            "cluster.component_placement={actor: 0-1, rollout: 0}",
        ],
        "cluster.backend",
        None,
    ),
    "the minibatch over the actor ranks": (
        [
            "env.num_envs=12",
            "algorithm.minibatch_size=128",
            "cluster.devices_per_node=3",
            "cluster.component_placement={actor: 0-2, rollout: 0}",
        ],
        "algorithm.minibatch_size",
        None,
    ),
    "a fault in an eval worker the run does not start": (
        ["debug.fault={kind: exception, component: eval}"],
        "debug.fault.component",
        "config error at 'debug.fault.component': got 'eval'; expected another component, or "
        "runner.eval_interval > 0: this run starts no eval worker. cluster.component_placement.eval "
        "places it when the run evaluates",
    ),
    # once raised by the env worker's constructor, on Ray inside a worker already started
    "reset groups split by a pipeline stage": (
        [
            "algorithm.adv_type=grpo",
            "algorithm.group_size=4",
            "algorithm.norm_adv=false",
            "rollout.pipeline_stage_num=4",
        ],
        "algorithm.group_size",
        "config error at 'algorithm.group_size': got 4; expected a divisor of the envs per env worker "
        "stage (2): a group of envs is reset together",
    ),
}


@pytest.mark.parametrize("overrides, key, message", BROKEN_RULES.values(), ids=BROKEN_RULES.keys())
def test_a_broken_rule_fails_at_resolve_with_the_message_the_command_prints(tmp_path, capsys, overrides, key, message):
    overrides = [*overrides, f"runner.run_dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError) as raised:
        resolve(load_unchecked(CARTPOLE, overrides))
    assert raised.value.key == key
    if message is not None:
        assert str(raised.value) == message
    assert main(["train", CARTPOLE, *overrides, "--dry-run"]) == 2
    assert capsys.readouterr().err == f"fleetrl: {raised.value}\n"
    assert not (tmp_path / "runs").exists()


def test_the_algorithm_is_checked_against_the_command(capsys):
    """`fleetrl sft` runs supervised algorithms: PPO is refused there, naming the command to use."""
    with pytest.raises(ConfigError) as raised:
        resolve(load_unchecked(CARTPOLE), "sft")
    assert str(raised.value) == (
        "config error at 'algorithm.name': got 'ppo'; expected one of ['bc'] with fleetrl sft. "
        "it is a reinforcement-learning algorithm: run it with fleetrl train"
    )
    assert main(["sft", CARTPOLE, "--dry-run"]) == 2
    assert capsys.readouterr().err == f"fleetrl: {raised.value}\n"
    assert resolve(load_unchecked(CARTPOLE), "train").spec.name == "ppo"


def test_the_plan_is_frozen_and_holds_its_own_config():
    config = load_unchecked(CARTPOLE)
    plan = resolve(config)
    for field, value in (("config", config), ("layout", plan.layout)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(plan, field, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layout.backend = "ray"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.placement.assignments[0].rank = 1
    config.env.num_envs = 3  # breaks the minibatch rule: what the caller changes afterwards is not the plan's
    assert plan.config.env.num_envs == 8 and plan.config is not config
    assert (plan.layout.backend, plan.placement.world_size("actor"), plan.spec.name) == ("inline", 1, "ppo")


def test_a_trainer_takes_the_plan_resolved_where_the_run_was_asked_for(tmp_path):
    """A Config is resolved by whoever asks for the run, once; handed a Config, the Trainer says how,
    before it opens a run directory or starts anything."""
    from fleetrl.controller.loop import Trainer

    config = load_unchecked(CARTPOLE, [f"runner.run_dir={tmp_path}"])
    with pytest.raises(TypeError, match=r"Trainer takes a RunPlan, not Config: Trainer\(resolve\(config\)\)"):
        Trainer(config)
    assert list(tmp_path.iterdir()) == []


def test_the_controller_unpickles_its_plan_before_torch_is_imported():
    """The supervisor's orders carry the plan; the controller reads them in its first instant,
    before it starts Ray's daemons and its heartbeats: no rule, algorithm or torch is imported by
    that (the spec is looked up by name when first asked for)."""
    plan = resolve(load_unchecked(CARTPOLE, ["cluster.devices_per_node=1"]))
    script = (
        "import pickle, sys\n"
        "plan = pickle.loads(sys.stdin.buffer.read())\n"
        "print(sorted(m for m in ('torch', 'fleetrl.plan.rules', 'fleetrl.algos.ppo.actor') if m in sys.modules))\n"
        "print(plan.layout.backend, type(plan.config.algorithm).__name__, plan.config.env.num_envs)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(plan),
        capture_output=True,
        env=subprocess_env(),
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == ["[]", "inline PPOConfig 8"]


@pytest.mark.parametrize(
    "config, overrides",
    [
        ("ppo_cartpole.yaml", []),
        ("ppg_cartpole.yaml", []),
        ("sac_halfcheetah.yaml", []),
        # a rehearsed failure on the component's main method (a fault naming another method
        # imports the worker class, to check that it has the method)
        ("ppo_cartpole.yaml", ["debug.fault={kind: kill, component: actor, call: 3}"]),
    ],
)
def test_checking_a_config_imports_no_torch(config, overrides):
    """`fleetrl train --dry-run` — the config read, its rules run, its placement resolved, what
    `fleetrl train`'s supervisor does before it starts the controller — and the supervisor's own
    modules import no torch: the algorithms' specs name their workers by reference (seconds of
    CPU at every start, hundreds of starts in this suite)."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['fleetrl', 'train', sys.argv[1], 'cluster.devices_per_node=1', *sys.argv[2:], '--dry-run']\n"
        "try:\n"
        "    runpy.run_module('fleetrl', run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "import fleetrl.supervise.supervisor\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'torch'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "configs" / config), *overrides],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("backend: ") and result.stdout.splitlines()[-1] == "[]", result.stdout

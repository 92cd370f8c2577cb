"""Every key of the schema, walked with bad values through the real `fleetrl train --dry-run`:
each one is exit code 2 with one message naming the key, never a traceback.

The keys are the section dataclasses' fields, enumerated (`walk_section`), so a key added later
is walked without touching this file. The bad values come from each field's annotation
(constraints.py): a value of the wrong type always; then one outside its `Range`, one that is not
among its `Literal` choices, a list with a bad element, a `Check`'s rejected value. A key whose
annotation yields nothing beyond the wrong type must be named below, either with a bad value and
the rule that rejects it (`SEMANTIC_BAD`) or with the reason it has none (`ANY_VALUE`); any other
such key fails `test_every_key_has_a_bad_value`. Rules that relate keys get their own cases.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import types
import typing
from pathlib import Path

import pytest

from fleetrl.algos.registry import algorithm_names, algorithm_spec
from fleetrl.cli import main
from fleetrl.config.constraints import Check, Range
from fleetrl.config.loader import coerce
from fleetrl.config.model_sections import MODEL_SECTIONS, CustomModelConfig, MlpModelConfig
from fleetrl.config.schema import SECTION_TYPES
from fleetrl.debug.faults import DEFAULT_METHOD, worker_methods
from tests.support import FLEETRL, LEROBOT_DATASETS, REPO, subprocess_env, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")

# Keys whose annotation gives no bad value but whose value a rule checks: (bad value, the rule).
SEMANTIC_BAD = {
    "algorithm.name": ("pppo", "one of the registered algorithms"),
    "env.id": ("CartPol-v1", "resolved as a Gymnasium id or entry point"),
    "env.kwargs": ({"no_such_arg": 1}, "checked against the env's signature"),
    "model.id": ("mlpp", "'mlp' or a module:attr entry point"),
    "model.kwargs": ({"depth": 3}, "checked against the custom network's signature"),
    "cluster.simulate_clock_skew_s": ({"5": 30}, "node indices below cluster.num_nodes with seconds"),
    "runner.resume": ("/nonexistent/fleetrl-run", "a run directory holding a checkpoint"),
    "runner.init_from": ("/nonexistent/fleetrl-run", "a run directory or a checkpoint file"),
    "algorithm.demonstrations": ("/nonexistent/demos", "a LeRobotDataset folder holding meta/info.json"),
    "cluster.component_placement": ({"actor": "0-99"}, "resolved against the cluster"),
    "cluster.env_vars": ({"NCCL_DEBUG": [1]}, "names with scalar values"),
    "debug.fault": ({"kind": "explode", "component": "actor"}, "watch/faults.check_fault"),
    "model.path": ("/nonexistent/model", "an existing model folder (checked before anything starts)"),
    "model.lora": ({"rank": 0}, "its own keys' types and ranges"),
    "model.flow": ({"steps": 0}, "its own keys' types and ranges"),
    "model.l1": ({"width": 0}, "its own keys' types and ranges"),
    "model.state_key": ("proprio", "the continuous heads' key: with the tokens head only its default"),
}
# Keys every value of whose type is valid.
ANY_VALUE = {
    "runner.run_dir": "any folder; it is created when the run starts",
    "runner.name": "any text; it names the run's folder",
    "cluster.ray_address": "any address ray.init takes; Ray checks it when it connects",
}


def hints(section_type: type) -> dict:
    return typing.get_type_hints(section_type, include_extras=True)


CUSTOM_MODEL = "fleetrl.models.mlp:ActorCriticMLP"  # a network class as a user's model.id names one


def sections() -> list[tuple[str, type, str | None]]:
    """(prefix, section dataclass, the key=value choosing it): every section of the schema, the
    `algorithm` section once per registered algorithm and the `model` section once per kind of
    model (each has its own dataclass; None: the CartPole PPO config, whose model is an MLP)."""
    skip = ("algorithm", "model")
    found = [(prefix, section_type, None) for prefix, section_type in SECTION_TYPES.items() if prefix not in skip]
    found += [("algorithm", algorithm_spec(name).config, f"algorithm.name={name}") for name in algorithm_names()]
    found += [("model", MlpModelConfig, None), ("model", CustomModelConfig, f"model.id={CUSTOM_MODEL}")]
    found += [("model", section, f"model.id={kind}") for kind, section in MODEL_SECTIONS.items() if kind != "mlp"]
    return found


def config_for(selection: str | None, folder: Path) -> str:
    """The shipped CartPole PPO config, or one that names only the selecting key (other algorithms'
    and models' sections do not take PPO's or the MLP's keys)."""
    if selection is None:
        return CARTPOLE
    dotted, value = selection.split("=")
    section, key = dotted.split(".")
    path = folder / "selected.yaml"
    path.write_text(json.dumps({section: {key: value}}))
    return str(path)


def strip(hint):
    """The type under `Annotated[...]` and `... | None`."""
    if typing.get_origin(hint) is typing.Annotated:
        return strip(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return strip(inner)
    return hint


def wrong_type(hint) -> object:
    """A value of a type the annotation does not take."""
    base = typing.get_origin(strip(hint)) or strip(hint)
    return {bool: "maybe", int: "many", float: "much", str: [1, 2], list: 5, dict: 5}.get(base, 7)


def bad_values(hint) -> list:
    """Values of the right type that the annotation rejects (out of range, not a choice, ...)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        base, *extras = args
        own = [e.outside() for e in extras if isinstance(e, Range)] + [e.bad for e in extras if isinstance(e, Check)]
        return own + bad_values(base)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return bad_values(inner)
    if origin is typing.Literal:
        return ["not-a-choice"]
    if origin is list and args:
        return [[value] for value in [wrong_type(args[0]), *bad_values(args[0])]]
    if origin is dict and args:
        return [{"key": value} for value in [wrong_type(args[1]), *bad_values(args[1])]]
    return []


def walk_section(prefix: str, section_type: type, algorithm: str | None) -> list[tuple[str, object, str | None]]:
    """(dotted key, bad value, algorithm) for every field of a section dataclass."""
    cases = []
    for name, hint in hints(section_type).items():
        key = f"{prefix}.{name}"
        values = [wrong_type(hint), *bad_values(hint)]
        if key in SEMANTIC_BAD:
            values.append(SEMANTIC_BAD[key][0])
        cases += [(key, value, algorithm) for value in values]
    return cases


def all_keys() -> list[tuple[str, object]]:
    return [(f"{prefix}.{name}", hint) for prefix, t, _ in sections() for name, hint in hints(t).items()]


def yaml_text(value) -> str:
    """The override's text: JSON is YAML, except for the non-finite floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value)


CASES = [
    case for prefix, section_type, selected_by in sections() for case in walk_section(prefix, section_type, selected_by)
]


def dry_run(capsys, *overrides: str, config: str = CARTPOLE) -> tuple[int, str, str]:
    code = main(["train", config, *overrides, "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_rejected(capsys, key: str, *overrides: str, config: str = CARTPOLE) -> str:
    code, _, err = dry_run(capsys, *overrides, config=config)
    assert code == 2, f"{overrides}: exit {code}; stderr: {err}"
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"fleetrl: config error at '{key}"), err
    return err


@pytest.mark.parametrize(
    "key, value, selection", CASES, ids=[f"{a or 'ppo_cartpole'}: {k}={yaml_text(v)}" for k, v, a in CASES]
)
def test_every_key_rejects_a_bad_value(capsys, tmp_path, key, value, selection):
    err = assert_rejected(capsys, key, f"{key}={yaml_text(value)}", config=config_for(selection, tmp_path))
    assert "got " in err and "expected " in err


def test_every_key_has_a_bad_value():
    """Beyond the wrong type: a bool takes every value of its type; any other key without a bad
    value must be named above, with its reason."""
    missing = [
        key
        for key, hint in all_keys()
        if not bad_values(hint) and hint is not bool and key not in SEMANTIC_BAD and key not in ANY_VALUE
    ]
    assert not missing, f"keys without a bad value (annotate them, or list them with the reason): {missing}"
    named = {*SEMANTIC_BAD, *ANY_VALUE}
    stale = [key for key, hint in all_keys() if key in named and (bad_values(hint) or hint is bool)]
    stale += [key for key in named if key not in dict(all_keys())]
    assert not stale, f"named above but annotated (or gone): {stale}"


def test_defaults_satisfy_their_own_annotations():
    """The loader trusts defaults; here they are held to the same rules as a user's value."""
    for prefix, section_type, _ in sections():
        defaults = section_type()
        for name, hint in hints(section_type).items():
            value = getattr(defaults, name)
            assert coerce(f"{prefix}.{name}", value, hint) == value


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_passes_the_dry_run(capsys, request, tmp_path, config):
    """`fleetrl train`'s configs, and `fleetrl sft`'s (sft_*.yaml) with a LeRobot dataset standing
    in for the folder `fleetrl record` would write."""
    path = REPO / "configs" / config
    # a VLA config names a folder the user makes with fleetrl init-model: here, a tiny one
    overrides = [f"model.path={request.getfixturevalue('tiny_paligemma')}"] if "vla" in config else []
    if config.startswith("sft_"):
        overrides.append(f"algorithm.demonstrations={LEROBOT_DATASETS / 'v3.0' / 'dataset'}")
    code = main(["sft" if config.startswith("sft_") else "train", str(path), *overrides, "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "backend:" in captured.out


# --- rules that relate keys (validate.py, and the placement) ------------------------------------

TWO_ACTORS = ["cluster.devices_per_node=2", "cluster.component_placement.actor=0-1"]
# the rules run before runner.init_from's path is read
KL_FROM = ["algorithm.kl_coef=0.1", "runner.init_from=/nonexistent/fleetrl-run"]
LOGLINEAR = ["runner.asynchronous=true", "algorithm.proximal_logprob=loglinear"]
CROSS_FIELD = {
    # id: (key the error names, overrides)
    "heartbeat interval not below the timeout": (
        "watchdog.heartbeat_interval_s",
        ["watchdog.heartbeat_interval_s=5", "watchdog.heartbeat_timeout_s=5"],
    ),
    "min deadline above the max": (
        "watchdog.min_deadline_s",
        ["watchdog.min_deadline_s=60", "watchdog.max_deadline_s=30"],
    ),
    "pipeline stages not dividing the envs per env worker": (
        "rollout.pipeline_stage_num",
        ["rollout.pipeline_stage_num=3"],
    ),
    "simulated nodes unlike num_nodes": ("cluster.simulate_nodes", ["cluster.simulate_nodes=2"]),
    "standardised inputs with no statistics to read": (
        "model.standardize_inputs",
        ["model.id=transformer", "model.standardize_inputs=true"],
    ),
    "simulated nodes and a Ray address": (
        "cluster.simulate_nodes",
        ["cluster.num_nodes=2", "cluster.simulate_nodes=2", "cluster.ray_address=10.0.0.1:6379"],
    ),
    "isolation without simulated nodes": ("cluster.simulate_isolation", ["cluster.simulate_isolation=namespaces"]),
    "clock skew without isolation": (
        "cluster.simulate_clock_skew_s",
        ["cluster.num_nodes=2", "cluster.simulate_nodes=2", "cluster.simulate_clock_skew_s={1: 30}"],
    ),
    "per-node env var that is not a scalar": (
        "cluster.env_vars.1.NCCL_DEBUG",
        ["cluster.env_vars={1: {NCCL_DEBUG: [1]}}"],
    ),
    "fault rank beyond the component's world size": (
        "debug.fault.rank",
        ["debug.fault={kind: kill, component: actor, rank: 1}"],
    ),
    "fault rank beyond two actor ranks": (
        "debug.fault.rank",
        [*TWO_ACTORS, "debug.fault={kind: kill, component: actor, rank: 2}"],
    ),
    "fault component misspelt": ("debug.fault.component", ["debug.fault={kind: kill, component: actr}"]),
    "fault component not a name": ("debug.fault.component", ["debug.fault={kind: kill, component: [actor]}"]),
    "fault kind not a name": ("debug.fault.kind", ["debug.fault={kind: {a: 1}, component: actor}"]),
    "fault component of the fused process": ("debug.fault.component", ["debug.fault={kind: kill, component: fused}"]),
    "fault key misspelt": ("debug.fault.cal", ["debug.fault={kind: kill, component: actor, cal: 3}"]),
    "fault without a kind": ("debug.fault.kind", ["debug.fault={component: env}"]),
    "fault without a component": ("debug.fault.component", ["debug.fault={kind: hang}"]),
    "fault rank negative": ("debug.fault.rank", ["debug.fault={kind: kill, component: env, rank: -1}"]),
    "fault rank not an integer": ("debug.fault.rank", ["debug.fault={kind: kill, component: env, rank: '1'}"]),
    "fault call zero": ("debug.fault.call", ["debug.fault={kind: kill, component: env, call: 0}"]),
    "fault call a float": ("debug.fault.call", ["debug.fault={kind: kill, component: env, call: 1.5}"]),
    "fault method the worker lacks": (
        "debug.fault.method",
        ["debug.fault={kind: kill, component: env, method: stepp}"],
    ),
    "actor-only fault kind on env": ("debug.fault.component", ["debug.fault={kind: extra_collective, component: env}"]),
    "forward fault on the rollout": (
        "debug.fault.component",
        ["debug.fault={kind: hang_in_forward, component: rollout}"],
    ),
    "KL to the reference without runner.init_from": ("algorithm.kl_coef", ["algorithm.kl_coef=0.1"]),
    "KL to the reference in a sharded checkpoint": (
        "algorithm.kl_coef",
        [*KL_FROM, "actor.strategy=fsdp", "actor.checkpoint_format=sharded"],
    ),
    "KL to the reference over FSDP-sharded actor ranks": (
        "algorithm.kl_coef",
        [*KL_FROM, *TWO_ACTORS, "actor.strategy=fsdp"],
    ),
    "KL to the reference with PPG, whose actor keeps none": ("algorithm.kl_coef", [*KL_FROM, "algorithm.name=ppg"]),
    "interpolated proximal log-probs in synchronous training": (
        "algorithm.proximal_logprob",
        ["algorithm.proximal_logprob=loglinear", "algorithm.off_policy_correction=decoupled"],
    ),
    "interpolated proximal log-probs without the decoupled objective": (
        "algorithm.proximal_logprob",
        [*LOGLINEAR, "algorithm.off_policy_correction=none"],
    ),
    "interpolated proximal log-probs with V-trace, whose targets need the pass": (
        "algorithm.proximal_logprob",
        [*LOGLINEAR, "algorithm.adv_type=vtrace"],
    ),
}


@pytest.mark.parametrize("key, overrides", CROSS_FIELD.values(), ids=CROSS_FIELD.keys())
def test_rule_relating_keys(capsys, key, overrides):
    assert_rejected(capsys, key, *overrides)


def test_messages_say_what_is_valid(capsys):
    err = assert_rejected(capsys, "debug.fault.component", "debug.fault={kind: kill, component: actr}")
    assert "'actr'" in err and "['env', 'rollout', 'actor', 'eval']" in err and "did you mean 'actor'" in err
    err = assert_rejected(
        capsys, "debug.fault.rank", *TWO_ACTORS, "debug.fault={kind: kill, component: actor, rank: 2}"
    )
    assert "got 2" in err and "world size 2" in err
    err = assert_rejected(capsys, "watchdog.poll_interval_s", "watchdog.poll_interval_s=0")
    assert "got 0.0" in err and "> 0" in err
    err = assert_rejected(capsys, "algorithm.kl_coef", "algorithm.kl_coef=0.1")
    assert "got 0.1" in err and "expected 0.0 without runner.init_from" in err
    err = assert_rejected(capsys, "algorithm.kl_coef", *KL_FROM, *TWO_ACTORS, "actor.strategy=fsdp")
    assert "expected 0.0 with actor.strategy fsdp over 2 actor ranks (or actor.strategy ddp)" in err
    err = assert_rejected(capsys, "algorithm.proximal_logprob", *LOGLINEAR, "algorithm.off_policy_correction=none")
    assert "got 'loglinear'; expected 'forward' with algorithm.off_policy_correction 'none'" in err
    code, _, err = dry_run(capsys, *LOGLINEAR)  # the decoupled objective by default (auto)
    assert code == 0, err


@pytest.mark.parametrize(
    "fault",
    [
        "{kind: kill, component: actor, rank: 1, call: 3}",
        "{kind: hang, component: env, rank: 1, method: step, call: 40}",
        "{kind: extra_step, component: actor, rank: 0}",
        "{kind: exception, component: rollout, rank: 0, method: act}",
        "{kind: hang_in_forward, component: actor, rank: 1}",
        "{kind: skip_forward, component: actor, rank: 1, call: 3}",
    ],
)
def test_a_fault_that_can_fire_passes(capsys, fault):
    code, _, err = dry_run(capsys, *TWO_ACTORS, "cluster.component_placement.env=0-1", f"debug.fault={fault}")
    assert code == 0, err


@pytest.mark.parametrize("name", algorithm_names())
def test_each_component_s_main_method_is_one_its_workers_have(name):
    """A fault without `method` fires on the component's main method, which is not checked
    against the worker class at start-up (that would import torch into the supervisor)."""
    for component, method in DEFAULT_METHOD.items():
        assert method in worker_methods(component, name), (name, component)


def test_one_component_placed_keeps_the_others_defaults(capsys):
    """Issue 9: on a config without a placement, naming one component kept nothing else."""
    code, out, err = dry_run(capsys, *TWO_ACTORS)
    assert code == 0, err
    rows = [line.split()[:4] for line in out.splitlines() if line.split()[:1] in (["actor"], ["rollout"], ["env"])]
    assert rows == [
        ["actor", "0", "0", "0"],
        ["actor", "1", "0", "1"],
        ["rollout", "0", "0", "0"],
        ["env", "0", "0", "0"],
    ]


# --- a few as the user runs them: a fresh process, the real `python -m fleetrl` ------------------


@pytest.mark.parametrize(
    "override, key",
    [
        ("watchdog.poll_interval_s=0", "watchdog.poll_interval_s"),  # was a ZeroDivisionError
        ("rollout.pipeline_stage_num=0", "rollout.pipeline_stage_num"),  # was a ZeroDivisionError
        ("debug.fault={kind: kill, component: actr}", "debug.fault.component"),  # never fired, silently
    ],
)
def test_bad_key_in_a_fresh_process(tmp_path, override, key):
    result = train(CARTPOLE, override, runs=tmp_path / "runs", cwd=tmp_path, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 2, result.stderr
    assert result.stderr.startswith(f"fleetrl: config error at '{key}'"), result.stderr
    assert not (tmp_path / "runs").exists()


def test_isolated_nodes_without_root_is_a_config_error_saying_so(tmp_path):
    """Run as a user without root (a fresh user namespace maps none: the uid reads 65534 and no
    namespace of the machine can be made), the isolated simulation is refused before anything starts."""
    as_user = ["unshare", "--user"] if os.geteuid() == 0 else []
    done = subprocess.run(
        [*as_user, *FLEETRL, "train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}"]
        + ["cluster.backend=ray", "cluster.num_nodes=2", "cluster.simulate_nodes=2"]
        + ["cluster.simulate_isolation=namespaces"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "'cluster.simulate_isolation'" in done.stderr and "got 'namespaces'" in done.stderr, done.stderr
    assert "need root" in done.stderr and "runs as uid" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())

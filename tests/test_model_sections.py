"""The `model:` section is its kind's own (issue 42): `model.id` chooses the dataclass as
`algorithm.name` chooses the algorithm's, a key of another kind or a removed key is exit 2 saying
whose it is or what replaced it, and run directories written before the split — fleetrl wrote
every key of the flat section into their config.yaml — still evaluate and resume (fixtures written
at 36b9c39: tests/fixtures/saved_before_model_sections/README.md)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.config.model_sections import HfModelConfig, MlpModelConfig, TransformerModelConfig
from fleetrl.plan.load import load_config
from tests.support import REPO, fleetrl

SAVED = REPO / "tests" / "fixtures" / "saved_before_model_sections"
CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")


@pytest.mark.parametrize(
    "overrides, key, expected",
    [
        (["model.id=hf", "model.hidden_sizes=[64]"], "model.hidden_sizes", "a key of model.id mlp, not of hf"),
        (["model.id=mlp", "model.num_layers=3"], "model.num_layers", "a key of model.id transformer, not of mlp"),
        (["model.id=mlp", "model.lora={rank: 4}"], "model.lora", "a key of model.id hf, not of mlp"),
        (["model.kwargs={depth: 3}"], "model.kwargs", "a key of model.id module:attr, not of mlp"),
        (
            ["model.id=hf", "model.shared_trunk=true"],
            "model.shared_trunk",
            "of model.id mlp and transformer, not of hf",
        ),
        (["rollout.backend=hf"], "rollout.backend", "it was removed: nothing read it"),
        (["model.id=transformer", "model.embed_dimm=8"], "model.embed_dimm", "did you mean 'embed_dim'"),
    ],
)
def test_a_key_of_another_kind_or_a_removed_key_is_exit_2_saying_whose_it_is(
    capsys, tmp_path, overrides, key, expected
):
    (tmp_path / "empty.yaml").write_text("{}")
    assert main(["train", str(tmp_path / "empty.yaml"), *overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fleetrl: config error at '{key}'") and expected in err and "Traceback" not in err, err


def test_each_kind_is_its_own_dataclass_with_its_own_defaults():
    assert type(load_config(None).model) is MlpModelConfig and load_config(None).model.shared_trunk is False
    transformer = load_config(None, ["model.id=transformer"]).model
    assert type(transformer) is TransformerModelConfig and transformer.shared_trunk is True
    hf = load_config(None, ["model.id=hf", "model.path=/models/x"]).model
    assert type(hf) is HfModelConfig and hf.action_bins == 256 and not hasattr(hf, "hidden_sizes")


def test_a_vla_config_saved_before_the_split_loads_as_the_hf_section_it_meant():
    """Every flat key at its old default drops out; `action_bins` and LoRA stay; `rollout.backend`,
    which nothing read, goes."""
    config = load_config(SAVED / "hf_config.yaml")
    assert type(config.model) is HfModelConfig
    assert (config.model.path, config.model.action_bins, config.model.lora.rank) == ("/models/paligemma-tiny", 256, 32)


def test_a_saved_flat_section_that_set_another_kind_s_key_is_refused_naming_it(tmp_path):
    """The run set `hidden_sizes` on a VLA, which ignored it then: not silently dropped now."""
    raw = yaml.safe_load((SAVED / "hf_config.yaml").read_text())
    raw["model"]["hidden_sizes"] = [128]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    assert main(["eval", str(tmp_path)]) == 2


def test_a_run_saved_before_the_split_evaluates_and_resumes(tmp_path, capsys):
    run = tmp_path / "saved-mlp"
    shutil.copytree(SAVED / "mlp_run", run)
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert "return" in capsys.readouterr().out
    saved = load_latest(run)
    # resumed with its own saved config.yaml as the config: every flat key in it
    result = fleetrl(
        "train",
        str(run / "config.yaml"),
        f"runner.resume={run}",
        "runner.total_env_steps=1536",
        "--skip-doctor",
        runs=tmp_path,
    ).succeeded()
    assert f"resumed {run} at iteration {saved['iteration']}" in result.stderr
    assert load_latest(run)["global_step"] == 1536

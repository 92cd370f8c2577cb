"""Issue 23's end-to-end claim, as a user runs it: a tiny VLA folder of each family (written by
`init_model`, what `fleetrl init-model` runs) trains from configs/ppo_minigrid_vla.yaml with LoRA
on 2 FSDP actor ranks (Ray workers, Gloo), its rollout worker fed only the trainable tensors;
each iteration writes a DCP sharded checkpoint, both ranks' shards; the run resumes from it at
1 rank (inline, DCP resharding on load); and `fleetrl export` writes a folder transformers'
`from_pretrained` loads, which acts exactly as the last checkpoint does. Every step is a real
`fleetrl` process through the supervisor.

One run per family × algorithm, each doing the whole chain. CI runs PaliGemma with PPO and
SmolVLM with GRPO: every family and every advantage estimator on the whole path. The crossed
pairs are `slow`: a family changes only the model (the same adapter class, loading, LoRA and
export code) and the estimator only the advantages, each already covered in-process for both
(tests/test_vla.py), while each pair costs a Ray cluster and four model-loading processes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from fleetrl.checkpoint import load_latest
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.models.policy import Policy
from fleetrl.parallel import dcp
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.run_dir import CONFIG_FILE
from tests.support import ADVANTAGES, TWO_FSDP_RANKS_ON_RAY, fleetrl, train
from tests.vla_support import VLA_CONFIG, minigrid_batch

SHORT = [
    "model.lora.rank=4",
    "env.num_envs=4",
    "algorithm.num_steps=8",  # 32 env steps an iteration
    "algorithm.minibatch_size=16",
    "algorithm.update_epochs=1",
    "algorithm.lr=0.01",  # the adapters move visibly in a few iterations
    "actor.checkpoint_format=sharded",
    "runner.checkpoint_interval=1",
    "runner.tensorboard=false",
    "--skip-doctor",
]
FAMILY = {"paligemma": "PaliGemmaForConditionalGeneration", "smolvlm": "Idefics3ForConditionalGeneration"}
OTHER = {"paligemma": "smolvlm", "smolvlm": "paligemma"}


@pytest.mark.parametrize(
    "family, algorithm",
    [
        ("paligemma", "ppo"),
        ("smolvlm", "grpo"),
        pytest.param("paligemma", "grpo", marks=pytest.mark.slow),
        pytest.param("smolvlm", "ppo", marks=pytest.mark.slow),
    ],
)
@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_a_tiny_vla_trains_on_two_fsdp_ranks_resumes_at_one_and_exports_a_folder_that_acts_identically(
    request, tmp_path, family, algorithm
):
    folder = request.getfixturevalue(f"tiny_{family}")
    runs = tmp_path / "runs"
    job = [f"model.path={folder}", *SHORT, *ADVANTAGES[algorithm]]

    first = train(VLA_CONFIG, *job, *TWO_FSDP_RANKS_ON_RAY, "runner.total_env_steps=64", runs=runs).succeeded()
    assert [m["global_step"] for m in first.metrics] == [32, 64]
    assert [m["weight_syncs"] for m in first.metrics] == [1, 1]  # the rollout is a process of its own
    run_dir = first.run_dir
    assert sorted(load_latest(run_dir)["shards"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # 2 ranks wrote

    other = request.getfixturevalue(f"tiny_{OTHER[family]}")  # on another base: refused before any worker
    overrides = [o for o in job if not o.startswith("--")]
    elsewhere = load_config(VLA_CONFIG, [*overrides, f"model.path={other}", f"runner.resume={run_dir}"])
    with pytest.raises(ConfigError, match=f"model.path.*{other}.*the base model the adapters were trained on"):
        Trainer(resolve(elsewhere), live_progress=False)

    resumed = train(VLA_CONFIG, *job, f"runner.resume={run_dir}", "runner.total_env_steps=96", runs=runs)
    assert resumed.succeeded().run_dir == run_dir and "resumed " in resumed.stderr
    assert [m["global_step"] for m in resumed.metrics] == [32, 64, 96]
    latest = load_latest(run_dir)
    assert latest["iteration"] == 3 and sorted(latest["shards"]) == [".metadata", "__0_0.distcp"]  # 1 rank wrote

    out = tmp_path / "exported"
    assert fleetrl("export", str(run_dir), str(out)).code == 0
    model = AutoModelForImageTextToText.from_pretrained(out, local_files_only=True)
    assert type(model).__name__ == FAMILY[family]

    observation_space, action_space, obs = minigrid_batch()
    config = load_config(run_dir / CONFIG_FILE)
    run = Policy.from_config(config.model, observation_space, action_space)  # the base and the run's adapters
    trained = dcp.load_model_weights(Path(latest["shards_path"]), run)
    assert any(value.abs().sum() > 0 for key, value in trained.items() if "lora_B" in key)  # B starts at zero
    merged = dataclasses.replace(config.model, path=str(out), lora=None)  # the adapters are in its weights
    exported = Policy.from_config(merged, observation_space, action_space)
    untrained = Policy.from_config(dataclasses.replace(config.model, lora=None), observation_space, action_space)
    with torch.no_grad():
        (ours, our_values), (theirs, their_values) = run.distribution(obs), exported.distribution(obs)
        before, _ = untrained.distribution(obs)
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(our_values, their_values, atol=1e-5)
    assert not torch.allclose(ours, before, atol=1e-3)  # and the training shows in them

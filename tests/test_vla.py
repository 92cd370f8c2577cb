"""Hugging Face VLAs (issue 23, the model side): `fleetrl init-model` writes folders transformers
loads; an incomplete folder is exit 2 naming the file; actions are the last vocabulary ids,
binned as OpenVLA bins them; acting and the loss path agree (parallel and autoregressive
decoding, action chunks); LoRA trains only adapters and the value head, checkpoints them with the
base folder's hash, and export merges them into a folder that acts identically; the MiniGrid VLA
config trains with PPO and GRPO."""

from __future__ import annotations

import math
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.config.model_sections import HfModelConfig, LoraConfig
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.models.hf.actions import VocabActions, action_token_ids
from fleetrl.models.hf.init_model import build_model
from fleetrl.models.policy import Policy
from fleetrl.parallel import dcp
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.plan.rules import check_spaces
from fleetrl.tracking.jsonl import read_metrics
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.vla_support import VLA_CONFIG, minigrid_batch, vla

CONFIG = VLA_CONFIG


@pytest.fixture(scope="module")
def minigrid():
    return minigrid_batch()


def test_init_model_writes_a_folder_that_transformers_loads_with_the_action_tokens_last(tmp_path):
    paligemma = tmp_path / "paligemma-tiny"
    assert main(["init-model", "--family", "paligemma", "--size", "tiny", str(paligemma)]) == 0
    model = AutoModelForImageTextToText.from_pretrained(paligemma, local_files_only=True)
    processor = AutoProcessor.from_pretrained(paligemma, local_files_only=True)
    assert type(model).__name__ == "PaliGemmaForConditionalGeneration"
    assert type(processor).__name__ == "PaliGemmaProcessor"
    assert (paligemma / "model.safetensors").is_file()
    size = len(processor.tokenizer)
    assert model.config.text_config.vocab_size == size
    last = processor.tokenizer.convert_ids_to_tokens(list(range(size - 256, size)))
    assert last == [f"<act_{i}>" for i in range(256)]
    prompt = processor(text=["<image>go to the red door"], images=[np.zeros((8, 8, 3), np.uint8)])
    assert processor.tokenizer.unk_token_id not in prompt["input_ids"][0]  # MiniGrid's words are known


def test_the_realistic_sizes_are_half_a_billion_to_three_billion_parameters():
    with torch.device("meta"):  # the configs, without allocating their weights
        for family, size in (("paligemma", "3b"), ("smolvlm", "2b")):
            model, _ = build_model(family, size)
            assert 0.5e9 < sum(p.numel() for p in model.parameters()) < 3.5e9, (family, size)


@pytest.mark.parametrize(
    "family, size", [("paligemma", "3b"), ("smolvlm", "2b"), ("paligemma", "tiny"), ("smolvlm", "tiny")]
)
def test_every_size_s_vision_path_gives_as_many_image_features_as_its_processor_writes_image_tokens(family, size):
    """On the meta device (shapes only): the projector's (PaliGemma) or the pixel-shuffle
    connector's (SmolVLM) image features are exactly the image tokens the processor puts in the
    prompt. SmolVLM's 2 B model has 27×27 patches: a scale factor of 2 cannot merge them (its
    first act on an H200 failed so, 2026-11-28); the real model's 3 gives 81 tokens."""
    with torch.device("meta"):
        model, processor = build_model(family, size)
        vision = model.config.vision_config
        edge = vision.image_size
        if family == "paligemma":
            features = model.model.get_image_features(pixel_values=torch.zeros(1, 3, edge, edge))
            features = features if isinstance(features, torch.Tensor) else features.pooler_output
            tokens = processor.image_seq_length
        else:  # the connector on the vision tower's patch sequence (its tower needs real masks)
            patches = torch.zeros(1, (edge // vision.patch_size) ** 2, vision.hidden_size)
            features = model.model.connector(patches)
            tokens = processor.image_seq_len
    assert features.shape == (1, tokens, model.config.text_config.hidden_size)


@pytest.mark.parametrize(
    "remove, named",
    [
        ("config.json", "config.json"),
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
        ("processor_config.json", "processor_config.json"),
    ],
)
def test_an_incomplete_folder_is_exit_2_naming_the_folder_and_the_file(tiny_paligemma, tmp_path, capsys, remove, named):
    folder = tmp_path / "model"
    shutil.copytree(tiny_paligemma, folder)
    (folder / remove).unlink()
    assert main(["train", str(CONFIG), f"model.path={folder}", "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "model.path" in error and str(folder) in error and f"missing: {named}" in error


def test_what_the_env_must_show_and_its_actions_are_checked_before_any_model_loads(tiny_paligemma, minigrid):
    observation_space, action_space, _ = minigrid
    config = load_config(CONFIG, [f"model.path={tiny_paligemma}"])
    check_spaces(config, observation_space, action_space)
    with pytest.raises(ConfigError, match="'model.id'.*exactly one image observation"):
        check_spaces(config, gym.spaces.Box(-1, 1, (4,)), action_space)
    with pytest.raises(ConfigError, match="'model.prompt_template'.*without {instruction}"):
        check_spaces(config, gym.spaces.Dict({"image": observation_space["image"]}), action_space)
    with pytest.raises(ConfigError, match="'model.action_stats'.*infinite bounds"):
        check_spaces(config, observation_space, gym.spaces.Box(-np.inf, np.inf, (2,)))


def test_continuous_actions_are_binned_on_the_last_ids_as_openvla_bins_them():
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    actions = VocabActions(space, 5, action_token_ids(100, 5, set()))
    assert actions.ids.tolist() == [99, 98, 97, 96]  # bin i is id V-1-i; id 95 (V-bins) is never sampled
    # edges linspace(-1, 1, 5) = [-1, -.5, 0, .5, 1]: midpoints [-.75, -.25, .25, .75], mapped to the bounds
    every = torch.arange(4).repeat(2, 1).T
    assert torch.allclose(actions.decode(every)[:, 0], torch.tensor([-1.5, -0.5, 0.5, 1.5]))
    assert torch.allclose(actions.decode(every)[:, 1], torch.tensor([0.125, 0.375, 0.625, 0.875]))
    assert torch.equal(actions.encode(actions.decode(every)), every)
    # out of range clips; the upper bound falls in the last bin (OpenVLA's digitize, then clip)
    assert actions.encode(torch.tensor([[-9.0, 1.0], [2.0, 0.0]])).tolist() == [[0, 3], [3, 0]]
    stats = VocabActions(space, 5, action_token_ids(100, 5, set()), stats={"q01": [-1.0, 0.0], "q99": [1.0, 0.5]})
    assert torch.allclose(stats.decode(torch.tensor([[3, 3]])), torch.tensor([[0.75, 0.4375]]))
    chunked = VocabActions(space, 5, action_token_ids(100, 5, set()), chunk=3)
    assert chunked.count == 6 and chunked.decode(torch.zeros(7, 6, dtype=torch.long)).shape == (7, 3, 2)
    discrete = VocabActions(gym.spaces.Discrete(3), 5, action_token_ids(100, 5, set()))
    assert discrete.ids.tolist() == [99, 98, 97] and discrete.encode(torch.tensor([2, 0])).tolist() == [[2], [0]]
    with pytest.raises(ConfigError, match="model.action_stats"):
        VocabActions(space, 5, action_token_ids(100, 5, set()), stats={"q01": [0.0]})
    with pytest.raises(ConfigError, match="model.action_bins"):
        VocabActions(gym.spaces.Discrete(7), 4, action_token_ids(100, 4, set()))


@pytest.mark.parametrize("decode", ["parallel", "autoregressive"])
def test_acting_samples_only_action_ids_and_the_loss_path_gives_the_same_log_probs(tiny_paligemma, minigrid, decode):
    observation_space, action_space, obs = minigrid
    policy = vla(tiny_paligemma, observation_space, action_space, decode=decode)
    actions, logprobs, values = policy.act(obs)
    assert actions.shape == (4,) and logprobs.shape == (4,) and values.shape == (4,)
    assert ((actions >= 0) & (actions < 7)).all()  # MiniGrid's 7 actions are the first 7 bins
    new_logprobs, entropy, new_values, _ = policy(obs, actions)
    # autoregressive: sampled with the KV cache, recomputed teacher-forced in one pass
    assert torch.allclose(new_logprobs, logprobs, atol=1e-5) and torch.allclose(new_values, values, atol=1e-5)
    # by hand: the log-softmax over the action ids' logits of the full vocabulary
    hidden, prompt, _ = policy.run(obs, torch.full((4, 1), policy.placeholder, dtype=torch.long))
    at = prompt if decode == "parallel" else prompt - 1
    logits = policy.network.hf.lm_head(hidden[:, at])[:, policy.actions.ids]
    expected = torch.log_softmax(logits, -1)
    assert torch.allclose(logprobs.flatten(), expected.gather(1, actions[:, None]).squeeze(1), atol=1e-5)
    assert torch.allclose(entropy.flatten(), -(expected.exp() * expected).sum(-1), atol=1e-5)


def test_a_chunk_of_box_actions_is_decoded_in_one_pass_per_token_of_each_action(tiny_paligemma, minigrid):
    observation_space, _, obs = minigrid
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    one = vla(tiny_paligemma, observation_space, box)
    actions, logprobs, _ = one.act(obs)
    assert actions.shape == (4, 3) and logprobs.shape == (4, 3) and one.logprob_shape == (3,)
    policy = vla(tiny_paligemma, observation_space, box, action_chunk=2)
    actions, logprobs, _ = policy.act(obs)
    assert actions.shape == (4, 2, 3) and logprobs.shape == (4, 2, 3) and policy.logprob_shape == (2, 3)
    assert policy.action_chunk == 2
    new_logprobs, entropy, _, _ = policy(obs, actions)
    assert torch.allclose(new_logprobs, logprobs, atol=1e-5) and entropy.shape == (4, 2, 3)
    # the 6 action positions are read from one pass: 6 distinct token distributions
    log_p, _ = policy.distribution(obs)
    assert log_p.shape == (4, 6, 255) and not torch.allclose(log_p[:, 0], log_p[:, 1])


def test_lora_trains_only_adapters_and_the_value_head_and_checkpoints_them_with_the_base_hash(
    tiny_paligemma, minigrid, tmp_path
):
    observation_space, action_space, obs = minigrid
    config = load_config(CONFIG, [f"model.path={tiny_paligemma}", "model.lora.rank=4"])
    actor = ActorWorker(config, observation_space, action_space)
    trainable = {name for name, p in actor.policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("network.value_head.") for name in trainable)
    assert any(".vision_tower." in name for name in trainable) and any(".language_model." in name for name in trainable)
    held = {id(p) for group in actor.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in actor.policy.parameters() if p.requires_grad}  # the optimizer holds only them
    state = actor.policy.state_dict()
    assert set(state) == trainable | {"network.base_hash"}
    fresh = ActorWorker(config, observation_space, action_space)
    fresh.policy.load_state_dict(state)  # the base comes from model.path: missing base tensors are fine
    other = tmp_path / "other"
    assert main(["init-model", str(other), "--seed", "1"]) == 0
    elsewhere = Policy.from_config(
        HfModelConfig(path=str(other), lora=LoraConfig(rank=4)), observation_space, action_space
    )
    with pytest.raises(ConfigError, match=f"model.path.*{other}.*the base model the adapters were trained on"):
        elsewhere.load_state_dict(state)
    # from DCP shards too, which write the saved fingerprint into the policy's own buffer first
    dcp.save(tmp_path / "shards", actor.policy, None)
    assert dcp.model_tensors(tmp_path / "shards", "base_hash")["network.base_hash"].equal(state["network.base_hash"])
    with pytest.raises(ConfigError, match=f"model.path.*{other}.*the base model the adapters were trained on"):
        dcp.load_model_weights(tmp_path / "shards", elsewhere)


@pytest.mark.usefixtures("quiet_fleetrl_logging")
@pytest.mark.parametrize("advantages", ["gae", "grpo"])
def test_the_minigrid_vla_config_trains_with_lora_and_exports_a_folder_that_acts_identically(
    tiny_paligemma, minigrid, tmp_path, advantages
):
    observation_space, action_space, obs = minigrid
    overrides = [
        f"model.path={tiny_paligemma}",
        "model.lora.rank=4",
        f"algorithm.adv_type={advantages}",
        f"algorithm.norm_adv={advantages == 'gae'}",  # GRPO's advantages are normalised per group
        "env.num_envs=4",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=16",
        "algorithm.lr=0.01",  # visible changes in two iterations
        "runner.total_env_steps=64",
        "runner.tensorboard=false",
        f"runner.run_dir={tmp_path / 'runs'}",
    ]
    config = load_config(CONFIG, overrides)
    summary = Trainer(resolve(config), live_progress=False).train()
    records = read_metrics(summary["run_dir"])
    assert len(records) == 2 and all(math.isfinite(r[key]) for r in records for key in ("policy_loss", "value_loss"))
    before = vla(tiny_paligemma, observation_space, action_space)
    trained = load_latest(summary["run_dir"])["actor"]["policy"]
    lora = [key for key in trained if "lora_B" in key]
    assert lora and any(trained[key].abs().sum() > 0 for key in lora)  # B starts at zero: the adapters moved
    assert not any("lora" not in key and "value_head" not in key and key != "network.base_hash" for key in trained)
    base = {key: value.clone() for key, value in before.state_dict().items()}
    assert main(["export", str(summary["run_dir"]), str(tmp_path / "exported")]) == 0
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert type(reloaded).__name__ == "PaliGemmaForConditionalGeneration"
    exported = vla(tmp_path / "exported", observation_space, action_space)
    run = vla(tiny_paligemma, observation_space, action_space, lora=LoraConfig(rank=4))
    run.load_state_dict(trained)
    with torch.no_grad():
        ours, value = run.distribution(obs)
        theirs, exported_value = exported.distribution(obs)
        untrained, _ = before.distribution(obs)
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(value, exported_value, atol=1e-5)
    assert not torch.allclose(ours, untrained, atol=1e-3)  # and the training shows in them
    assert all(torch.equal(base[key], value) for key, value in vla(tiny_paligemma, *minigrid[:2]).state_dict().items())
    if advantages == "gae":  # resuming these adapters on another base folder: a config error before any worker
        other = tmp_path / "other"
        assert main(["init-model", str(other), "--seed", "1"]) == 0
        resume = load_config(CONFIG, [*overrides, f"model.path={other}", f"runner.resume={summary['run_dir']}"])
        with pytest.raises(ConfigError, match=f"model.path.*{other}.*the base model the adapters were trained on"):
            Trainer(resolve(resume), live_progress=False)


def test_the_second_family_smolvlm_loads_and_acts_through_the_same_adapter(minigrid, tmp_path):
    observation_space, action_space, obs = minigrid
    folder = tmp_path / "smolvlm-tiny"
    assert main(["init-model", "--family", "smolvlm", "--size", "tiny", str(folder)]) == 0
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    for decode in ("parallel", "autoregressive"):
        policy = vla(folder, observation_space, action_space, decode=decode, lora=LoraConfig(rank=4))
        actions, logprobs, values = policy.act(obs)
        assert ((actions >= 0) & (actions < 7)).all() and logprobs.shape == (4,)
        new_logprobs, _, new_values, _ = policy(obs, actions)
        assert torch.allclose(new_logprobs, logprobs, atol=1e-5) and torch.allclose(new_values, values, atol=1e-5)


def test_a_bfloat16_rollout_acts_under_autocast_with_float32_weights(tiny_paligemma, minigrid):
    observation_space, action_space, obs = minigrid
    policy = vla(tiny_paligemma, observation_space, action_space)
    rollout = RolloutWorker(policy, dtype=torch.bfloat16)
    actions, logprobs, values = rollout.infer({key: value.numpy() for key, value in obs.items()}, deterministic=True)
    assert next(policy.parameters()).dtype == torch.float32  # what the actor trains is untouched
    assert logprobs.dtype == values.dtype == torch.float32
    _, exact_logprobs, _ = policy.act(obs, deterministic=True)
    assert ((actions >= 0) & (actions < 7)).all()
    assert torch.allclose(logprobs, exact_logprobs, atol=0.05)  # bfloat16's 8 bits of mantissa

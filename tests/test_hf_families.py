"""The families fleetrl drives (issue 42), each from a folder transformers built from the family's
published configuration (tests/hf_families.py: real processors, image splitting on for SmolVLM,
real special tokens and vocabulary sizes; small widths, random weights): the pixels fleetrl makes
in torch are the processor's own to within a grey level, the prompt holds the processor's image
tokens for an image of the observation's size, acting and the loss path agree, the action tokens
avoid every marker, and PPO with LoRA trains each through the same path. Folders fleetrl cannot
drive are refused before any weight is read, with exit 2 and no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from PIL import Image

from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.config.model_sections import LoraConfig
from fleetrl.controller.loop import Trainer
from fleetrl.models.hf.folder import check_folder, load_processor
from fleetrl.models.hf.prompts import Prompts
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from tests.support import REPO, fleetrl, subprocess_env
from tests.vla_support import VLA_CONFIG, minigrid_batch, vla

FAMILIES = ["paligemma", "paligemma2", "smolvlm", "smolvlm2", "qwen2_vl", "qwen2_5_vl"]
LAYOUTS = {"paligemma": "flat", "smolvlm2": "tiles", "qwen2_5_vl": "patches"}  # one folder per pixel layout


@pytest.fixture(scope="module")
def minigrid():
    observation_space, action_space, obs = minigrid_batch()
    return observation_space, action_space, {key: value[:2] for key, value in obs.items()}  # 2 envs: cheap


def smooth_image(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    channels = [128 + 100 * np.sin(x / 9.0), 128 + 100 * np.cos(y / 11.0), (2 * x + 2 * y) % 256]
    return np.stack(channels, -1).astype(np.uint8)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_pixels_made_in_torch_are_the_processor_s_own_to_within_a_grey_level(published, name):
    """A 64×48 camera image: SmolVLM2's processor resizes it to 2048 px and splits it into 3×4
    tiles and the global image (13 images of 512 px), Qwen2.5-VL's into a 4×4 grid of 14 px
    patches: fleetrl's torch path makes the same tensors, each value within 0.02 (a grey level is
    0.008 after normalising by 0.5) — the resampling kernel is the only difference."""
    folder, family = check_folder(str(published(name)))
    processor = load_processor(folder)
    prompts = Prompts(processor, family, gym.spaces.Box(0, 255, (64, 48, 3), np.uint8), "Out:")
    image = smooth_image(64, 48)
    ours = prompts.pixels(torch.from_numpy(image[None]), torch.device("cpu"), torch.float32)
    pil = [[Image.fromarray(image)]] if family.pixels == "tiles" else [Image.fromarray(image)]
    theirs = processor.image_processor(images=pil, return_tensors="pt")
    assert family.pixels == LAYOUTS[name] and set(ours) <= set(theirs)
    for key, value in ours.items():
        assert value.shape == theirs[key].shape, key
        assert (value.float() - theirs[key].float()).abs().max() < 0.02, key
    if name == "smolvlm2":
        assert ours["pixel_values"].shape[1] == 13  # the real SmolVLM2's splitting, not one image
        tokens = prompts.instruction_ids("").count(processor.image_token_id)
        assert tokens == 13 * 64  # image_seq_len 64 per tile: as many tokens as the model makes features


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_acts_and_its_loss_path_agrees_from_a_folder_built_from_its_published_config(
    published, minigrid, name
):
    observation_space, action_space, obs = minigrid
    policy = vla(published(name), observation_space, action_space)
    actions, log_probs, values = policy.act(obs)
    outputs = policy(obs, actions)
    assert torch.allclose(outputs.logprobs, log_probs, atol=1e-4) and torch.allclose(outputs.value, values, atol=1e-4)
    ids = set(policy.actions.ids.tolist())
    tokenizer = policy.prompts.processor.tokenizer
    markers = {tokenizer.convert_tokens_to_ids(token) for token in tokenizer.all_special_tokens}
    assert not ids & (markers | policy.prompts.reserved_ids()), "no action token is a marker or a prompt's token"
    assert max(ids) < len(tokenizer)


def test_the_action_tokens_are_the_last_ordinary_ids_of_each_vocabulary(published, tiny_paligemma, minigrid):
    """OpenVLA's layout where the vocabulary ends in ordinary tokens (fleetrl's init-model folders:
    exactly V - 1 - i); SmolVLM's image markers and end-of-utterance token and Qwen's chat and
    vision markers, at the end of theirs, are skipped."""
    observation_space, action_space, _ = minigrid
    own = vla(tiny_paligemma, observation_space, action_space)
    size = len(own.prompts.processor.tokenizer)
    assert own.actions.ids.tolist() == [size - 1 - i for i in range(7)]
    smolvlm = vla(published("smolvlm"), observation_space, action_space).actions.ids.tolist()
    assert smolvlm == [49278 - i for i in range(7)]  # below <end_of_utterance>: the reserved tokens
    qwen = vla(published("qwen2_vl"), observation_space, action_space).actions.ids.tolist()
    assert qwen[:3] == [151654, 151651, 151650]  # <|vision_pad|>, <|quad_end|>, ...: not the image's markers


@pytest.mark.parametrize("name", ["paligemma2", "smolvlm", "qwen2_vl"])
def test_ppo_with_lora_trains_each_family_through_the_same_path(published, tmp_path, name):
    overrides = [
        f"model.path={published(name)}",
        "model.lora.rank=2",
        "env.num_envs=2",
        "algorithm.num_steps=2",
        "algorithm.minibatch_size=4",
        "algorithm.update_epochs=1",
        "runner.total_env_steps=4",
        "runner.loggers=[jsonl]",
        f"runner.run_dir={tmp_path}",
    ]
    summary = Trainer(resolve(load_config(VLA_CONFIG, overrides)), live_progress=False).train()
    assert summary["global_step"] == 4
    trained = load_latest(Path(summary["run_dir"]))
    lora = [key for key in trained["actor"]["policy"] if "lora_B" in key]
    assert lora and any(trained["actor"]["policy"][key].abs().sum() > 0 for key in lora)  # the adapters moved
    exported = tmp_path / "exported"  # merged, with the folder's own processor files: loads as any folder
    assert main(["export", str(summary["run_dir"]), str(exported)]) == 0
    assert check_folder(str(exported))[1].name == check_folder(str(published(name)))[1].name


# ------------------------------------------------------------------- refused before loading


def llava(folder):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = LlavaConfig(
        vision_config={"model_type": "clip_vision_model", **small},
        text_config={"model_type": "llama", **small, "num_key_value_heads": 1},
    )
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    return folder


def remote_code(source, folder, model_type: str = "paligemma"):
    """`source` with modelling code of its own (a PaliGemma subclass) named by auto_map."""
    shutil.copytree(source, folder)
    (folder / "configuration_mine.py").write_text(
        "from transformers import PaliGemmaConfig\n\n\nclass MineConfig(PaliGemmaConfig):\n"
        f"    model_type = {model_type!r}\n"
    )
    (folder / "modeling_mine.py").write_text(
        "from transformers import PaliGemmaForConditionalGeneration\n\nfrom .configuration_mine import MineConfig\n\n\n"
        "class MineForConditionalGeneration(PaliGemmaForConditionalGeneration):\n    config_class = MineConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "configuration_mine.MineConfig",
        "AutoModelForImageTextToText": "modeling_mine.MineForConditionalGeneration",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def truncated(source, folder):
    shutil.copytree(source, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a download cut off
    return folder


def without_processor(source, folder):
    shutil.copytree(source, folder)
    for name in ("processor_config.json", "preprocessor_config.json"):
        (folder / name).unlink(missing_ok=True)
    return folder


REFUSALS = {  # folder: (how to make it, the key named, what the message says)
    "llava": (lambda source, folder: llava(folder), "model.path", "its model_type is 'llava'"),
    "remote code": (remote_code, "model.trust_remote_code", "true to run the modelling code"),
    "remote code of no family": (
        lambda source, folder: remote_code(source, folder, "openvla"),
        "model.path",
        "its model_type is 'openvla'",
    ),
    "no processor": (without_processor, "model.path", "missing: processor_config.json or preprocessor_config.json"),
    "truncated weights": (truncated, "model.path", "model.safetensors: it is truncated"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_the_dry_run_refuses_a_folder_it_cannot_drive_before_any_weight_loads(tiny_paligemma, tmp_path, case):
    """A real `fleetrl train --dry-run`: exit 2, one line naming the key, the folder (and for an
    unsupported type the supported list), no traceback — and no model class was even imported."""
    make, key, says = REFUSALS[case]
    folder = make(tiny_paligemma, tmp_path / "folder")
    extra = ["model.trust_remote_code=true"] if case == "remote code of no family" else []
    probe = (
        "import sys\nfrom fleetrl.cli import main\n"
        f"code = main(['train', {str(VLA_CONFIG)!r}, 'model.path={folder}', *{extra!r}, '--dry-run'])\n"
        "print('model classes imported:', 'transformers.modeling_utils' in sys.modules)\nsys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"fleetrl: config error at '{key}'") and result.stderr.count("\n") == 1
    assert says in result.stderr and str(folder) in result.stderr and "Traceback" not in result.stderr
    if key == "model.path" and "model_type" in says:
        assert "'paligemma', 'qwen2_5_vl', 'qwen2_vl', 'smolvlm'" in result.stderr  # the supported list
    assert "model classes imported: False" in result.stdout


def test_the_doctor_reads_the_folder_as_the_dry_run_does(tiny_paligemma, tmp_path, capsys):
    folder = truncated(tiny_paligemma, tmp_path / "folder")
    code = main(["doctor", str(VLA_CONFIG), f"model.path={folder}", "--only", "model_folder"])
    out = capsys.readouterr().out
    assert code == 3 and "model_folder" in out and "it is truncated" in out
    assert main(["doctor", str(VLA_CONFIG), f"model.path={tiny_paligemma}", "--only", "model_folder"]) == 0


def test_a_remote_code_folder_trains_with_trust_remote_code_end_to_end(tiny_paligemma, tmp_path):
    """model.trust_remote_code: the folder's own class is built (its code run), driven as the
    family its model_type names, trained with PPO and LoRA in a real `fleetrl train`."""
    folder = remote_code(tiny_paligemma, tmp_path / "remote")
    result = fleetrl(
        "train",
        str(VLA_CONFIG),
        f"model.path={folder}",
        "model.trust_remote_code=true",
        "model.lora.rank=2",
        "env.num_envs=2",
        "algorithm.num_steps=2",
        "algorithm.minibatch_size=4",
        "algorithm.update_epochs=1",
        "runner.total_env_steps=4",
        "runner.loggers=[jsonl]",
        "runner.weight_sync=full",
        f"runner.run_dir={tmp_path / 'runs'}",
        "--skip-doctor",
        runs=tmp_path / "runs",
        env={"HF_MODULES_CACHE": str(tmp_path / "modules")},  # the folder's code is copied there
        timeout=300,
    ).succeeded()
    assert result.summary["global_step"] == 4
    assert list((tmp_path / "modules").rglob("modeling_mine.py")), "transformers ran the folder's own code"


def test_init_model_from_a_config_writes_random_weights_in_its_exact_shapes(published, tmp_path):
    """`fleetrl init-model --config FILE`: a published Qwen2.5-VL config.json (its processor and
    tokenizer beside it) → a folder whose every tensor has the source's shape, which acts."""
    from safetensors import safe_open

    source = published("qwen2_5_vl")
    out = tmp_path / "twin"
    assert main(["init-model", "--config", str(source / "config.json"), str(out), "--seed", "1"]) == 0
    with safe_open(source / "model.safetensors", "pt") as theirs, safe_open(out / "model.safetensors", "pt") as ours:
        shapes = {key: theirs.get_slice(key).get_shape() for key in theirs.keys()}
        assert shapes == {key: ours.get_slice(key).get_shape() for key in ours.keys()}
        key = next(iter(shapes))
        assert not torch.equal(theirs.get_tensor(key), ours.get_tensor(key))  # random, not copied
    assert (out / "tokenizer.json").is_file() and (out / "preprocessor_config.json").is_file()
    assert main(["train", str(VLA_CONFIG), f"model.path={out}", "--dry-run"]) == 0
    assert main(["init-model", "--config", str(tmp_path / "none.json"), str(tmp_path / "x")]) == 2


def test_lora_defaults_to_the_family_s_targets(published, minigrid):
    observation_space, action_space, _ = minigrid
    policy = vla(published("qwen2_vl"), observation_space, action_space, lora=LoraConfig(rank=2))
    adapted = {name.split(".lora_A")[0] for name, _ in policy.named_parameters() if ".lora_A" in name}
    assert any(".visual." in name for name in adapted) and any("language_model" in name for name in adapted)
    assert not any(name.endswith("lm_head") for name in adapted)

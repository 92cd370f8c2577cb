"""The Hugging Face model families fleetrl drives: the one place a family is described.

A family is the config.json `model_type`s that one way of driving serves. Its entry says:

- `pixels`: how observation images reach the model (pixels.py): `flat` (one image at the
  processor's fixed size), `tiles` (the processor's image splitting: rows × cols tiles and the
  global image), `patches` (native-resolution patches and their grid);
- `image_splitting`: `none` (the family's processors never split an image) or `processor` (the
  folder's own `do_image_splitting` is followed, as the real checkpoints ship it: on for SmolVLM);
- `prefix_lm`: the prompt attends both ways and the action positions causally (PaliGemma's
  `token_type_ids`), or everything is causal;
- `positions`: `linear` position ids (counting the real tokens of a left-padded row) or `mrope`
  (Qwen2-VL's three rotary axes, the image's from its patch grid: the model's own `get_rope_index`);
- `image_prompt`: the text that stands for the image in the prompt before the processor expands
  it (`{image}`: the processor's image token);
- `lora_targets`: the default `model.lora.target_modules` (peft's `all-linear`: every linear layer
  but the output head);
- `builder` and `sizes`: what `fleetrl init-model --family NAME --size SIZE` builds (builders.py);
  no builder: the family is trained from a folder of one's own only (`init-model --config` writes
  random weights in any config's shapes).

Adding a family is one entry here and a test that builds a folder of it from its published
configuration (tests/hf_families.py, tests/test_hf_families.py); docs/guides/vla.md lists the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from fleetrl.errors import ConfigError
from fleetrl.models.hf.builders import PALIGEMMA_SIZES, SMOLVLM_SIZES, Dims, paligemma, smolvlm


@dataclass(frozen=True)
class Family:
    """How fleetrl drives one family of Hugging Face VLMs (module docstring)."""

    name: str
    model_types: tuple[str, ...]
    pixels: Literal["flat", "tiles", "patches"]
    image_splitting: Literal["none", "processor"]
    prefix_lm: bool
    positions: Literal["linear", "mrope"]
    image_prompt: str = "{image}"
    lora_targets: str | tuple[str, ...] = "all-linear"
    builder: Callable[[Dims, int], tuple[torch.nn.Module, object]] | None = None
    sizes: Mapping[str, Dims] = field(default_factory=dict)


FAMILIES = (
    Family(
        "paligemma",
        ("paligemma",),  # PaliGemma (Gemma) and PaliGemma 2 (Gemma 2): one model_type
        pixels="flat",
        image_splitting="none",
        prefix_lm=True,
        positions="linear",
        builder=paligemma,
        sizes=PALIGEMMA_SIZES,
    ),
    Family(
        "smolvlm",
        ("idefics3", "smolvlm"),  # Idefics3 and SmolVLM (idefics3), SmolVLM2 (smolvlm)
        pixels="tiles",
        image_splitting="processor",
        prefix_lm=False,
        positions="linear",
        builder=smolvlm,
        sizes=SMOLVLM_SIZES,
    ),
    Family(
        "qwen2-vl",
        ("qwen2_vl", "qwen2_5_vl"),  # Qwen2-VL and Qwen2.5-VL
        pixels="patches",
        image_splitting="none",
        prefix_lm=False,
        positions="mrope",
        image_prompt="<|vision_start|>{image}<|vision_end|>",
    ),
)
SUPPORTED_TYPES = sorted(model_type for family in FAMILIES for model_type in family.model_types)


def family_for(model_type: str, folder: str) -> Family:
    """The family of a folder's `model_type`; exit 2 naming the folder, the type and the list."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise ConfigError(
        "model.path",
        folder,
        f"a folder of one of the model types {SUPPORTED_TYPES} (config.json's model_type)",
        f"its model_type is {model_type!r}, which no family fleetrl drives (docs: guides/vla.md, Families)",
    )


def family_named(name: str) -> Family:
    """The family `fleetrl init-model --family NAME` builds."""
    buildable = [family.name for family in FAMILIES if family.builder is not None]
    for family in FAMILIES:
        if family.name == name and family.builder is not None:
            return family
    raise ConfigError("--family", name, f"one of {buildable} (or --config FILE: any config.json's shapes)")


def prompt_positions(family: Family, model: torch.nn.Module, ids, mask, pixels: dict) -> tuple:
    """(position ids of the whole sequence, the per-row offset later cached steps add to their
    linear position): (B, L) and 0 for `linear`, (3, B, L) and the model's rope deltas for `mrope`."""
    linear = (mask.cumsum(-1) - 1).clamp_(min=0)
    if family.positions == "linear":
        return linear, torch.zeros_like(linear[:, :1])
    image_types = (ids == model.config.image_token_id).int()
    return model.get_rope_index(ids, image_types, image_grid_thw=pixels["image_grid_thw"], attention_mask=mask)


def step_positions(family: Family, mask: torch.Tensor, offset: torch.Tensor, count: int) -> torch.Tensor:
    """Position ids of the last `count` tokens of a cached step, `mask` covering every token so far."""
    linear = (mask.cumsum(-1) - 1).clamp_(min=0)[:, -count:] + offset
    return linear if family.positions == "linear" else linear.unsqueeze(0).expand(3, -1, -1)

"""Observations → what a Hugging Face VLM reads: the prompt's token ids and the image's pixels.

The instruction is the env's text observation (MiniGrid's mission, decoded from the ids
`envs.text` made of it with the vocabulary the space carries), put into `model.prompt_template`
(OpenVLA's "In: What action should the robot take to {instruction}?\\nOut:" by default). The
prompt's ids come from the folder's own processor — the image placeholder tokens and BOS where
the family puts them — once per distinct instruction (a task has few), then batched with LEFT
padding, so that every sample's last prompt token, and the action tokens after it, sit in the same
columns; position ids count only the real tokens, so a sample's outputs do not depend on how much
padding its batch needed.

The prompt's image part is the processor's for an image of the observation's size: the family's
`image_prompt` (the image token, Qwen's vision markers around it), expanded by the processor into
as many image tokens — and tiles, rows, columns — as it makes of such an image.

Pixels are made in torch, batched, on the model's device (pixels.py): the image key's values scaled
to [0, 1] (by 1/255 for camera images; small grids such as MiniGrid's encoded view keep their
values, as every fleetrl image encoder does: `pixel_scale`), then laid out as the family's image
processor lays them out. Other observation keys (a one-hot direction, a state vector) are not
shown to the VLM.
"""

from __future__ import annotations

import gymnasium as gym
import torch

from fleetrl.errors import ConfigError
from fleetrl.models.encoders import channels_first, pixel_scale
from fleetrl.models.hf.families import Family
from fleetrl.models.hf.pixels import LAYOUTS, blank
from fleetrl.observations import image_layout, is_image


def observation_keys(observation_space: gym.Space, template: str) -> tuple:
    """(the image key, the text key or None) the model reads; a ConfigError when the env shows
    no single image, or no text while the template wants an {instruction}."""
    leaves = (
        dict(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else {None: observation_space}
    )
    images = [key for key, leaf in leaves.items() if is_image(leaf)]
    if len(images) != 1:
        raise ConfigError(
            "model.id", "hf", "an env with exactly one image observation (a uint8 HWC or CHW Box)", f"found {images}"
        )
    texts = [key for key, leaf in leaves.items() if getattr(leaf, "vocabulary", None) is not None]
    if not texts and "{instruction}" in template:
        raise ConfigError(
            "model.prompt_template",
            template,
            "a template without {instruction} for an env without a text observation",
            f"the observation keys are {sorted(str(k) for k in leaves)}",
        )
    return images[0], texts[0] if texts else None


class Prompts:
    """Builds (input_ids, attention_mask) and the pixel inputs for a batch of observations, as the
    folder's processor and the model's family (families.py) lay them out."""

    def __init__(self, processor, family: Family, observation_space: gym.Space, template: str):
        self.processor, self.family, self.template = processor, family, template
        self.image_key, self.text_key = observation_keys(observation_space, template)
        leaves = (
            observation_space.spaces if isinstance(observation_space, gym.spaces.Dict) else {None: observation_space}
        )
        space = leaves[self.image_key]
        _, self.height, self.width, self.channels_last = image_layout(space)
        self.scale = pixel_scale(space)
        self.vocabulary = leaves[self.text_key].vocabulary if self.text_key is not None else None
        self.pixel_maker = LAYOUTS[family.pixels](processor.image_processor, self.height, self.width)
        self.image_text = family.image_prompt.format(image=processor.image_token)
        self.cache: dict[str, list[int]] = {}
        self.pad_id = processor.tokenizer.pad_token_id

    def instruction_ids(self, instruction: str) -> list[int]:
        """The prompt's ids for one instruction, as the folder's processor makes them for an image
        of the observation's size (cached)."""
        if instruction not in self.cache:
            text = self.image_text + self.template.format(instruction=instruction)
            images = (
                [[blank(self.height, self.width)]]
                if self.family.pixels == "tiles"
                else [blank(self.height, self.width)]
            )
            self.cache[instruction] = list(self.processor(text=[text], images=images)["input_ids"][0])
        return self.cache[instruction]

    def reserved_ids(self) -> set[int]:
        """Every id of a prompt with an empty instruction — the image's tokens and markers, BOS,
        the template's words — and the tokenizer's special tokens: no action token may be one."""
        return set(self.instruction_ids("")) | set(self.processor.tokenizer.all_special_ids)

    def instructions(self, obs) -> list[str]:
        if self.text_key is None:
            return [""] * len(obs[self.image_key] if isinstance(obs, dict) else obs)
        return [self.vocabulary.decode(ids) for ids in obs[self.text_key].cpu().numpy()]

    def tokens(self, obs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) (B, L), left-padded."""
        rows = [self.instruction_ids(text) for text in self.instructions(obs)]
        length = max(map(len, rows))
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, length - len(row) :] = torch.tensor(row)
            mask[i, length - len(row) :] = 1
        return ids.to(device), mask.to(device)

    def pixels(self, obs, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        images = obs[self.image_key] if isinstance(obs, dict) else obs
        x = channels_first(images.to(device), self.channels_last, self.scale)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.pixel_maker(x, dtype)

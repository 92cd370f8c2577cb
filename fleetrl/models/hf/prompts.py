"""Observations → what a Hugging Face VLM reads: the prompt's token ids and the image's pixels.

The instruction is the env's text observation (MiniGrid's mission, decoded from the ids
`envs.text` made of it with the vocabulary the space carries), put into `model.prompt_template`
(OpenVLA's "In: What action should the robot take to {instruction}?\\nOut:" by default). The
prompt's ids come from the folder's own processor — the image placeholder tokens and BOS where
the family puts them — once per distinct instruction (a task has few), then batched with LEFT
padding, so that every sample's last prompt token, and the action tokens after it, sit in the same
columns; position ids count only the real tokens, so a sample's outputs do not depend on how much
padding its batch needed.

Pixels are made in torch, batched, on the model's device: the image key's values scaled to [0, 1]
(by 1/255 for camera images; small grids such as MiniGrid's encoded view keep their values, as
every fleetrl image encoder does: `pixel_scale`), resized bilinearly to the image processor's size and normalised with its mean and std.
Other observation keys (a one-hot direction, a state vector) are not shown to the VLM.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from fleetrl.errors import ConfigError
from fleetrl.models.encoders import channels_first, pixel_scale
from fleetrl.observations import image_layout, is_image

# model_type → how pixels are handed to the model: one image per sample as (B, 3, H, W), or as
# (B, images, 3, H, W) with a pixel mask (Idefics3 and SmolVLM)
PIXEL_LAYOUTS = {"paligemma": "flat", "idefics3": "stacked", "smolvlm": "stacked"}


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
    """Builds (input_ids, attention_mask, position_ids, pixel inputs) for a batch of observations."""

    def __init__(self, processor, model_type: str, observation_space: gym.Space, template: str):
        if model_type not in PIXEL_LAYOUTS:
            raise ConfigError(
                "model.path",
                model_type,
                f"a folder of one of the model types {sorted(PIXEL_LAYOUTS)} (config.json's model_type)",
            )
        self.processor, self.layout, self.template = processor, PIXEL_LAYOUTS[model_type], template
        self.image_key, self.text_key = observation_keys(observation_space, template)
        leaves = (
            observation_space.spaces if isinstance(observation_space, gym.spaces.Dict) else {None: observation_space}
        )
        space = leaves[self.image_key]
        self.channels_last = image_layout(space)[3]
        self.scale = pixel_scale(space)
        self.vocabulary = leaves[self.text_key].vocabulary if self.text_key is not None else None
        image_processor = processor.image_processor
        size = image_processor.size
        side = size.get("longest_edge")
        self.size = (side, side) if side else (size["height"], size["width"])
        self.mean = torch.tensor(image_processor.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(image_processor.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        self.cache: dict[str, list[int]] = {}
        self.pad_id = processor.tokenizer.pad_token_id

    def instruction_ids(self, instruction: str) -> list[int]:
        """The prompt's ids for one instruction, as the folder's processor makes them (cached)."""
        if instruction not in self.cache:
            text = self.processor.image_token + self.template.format(instruction=instruction)
            blank = Image.fromarray(np.zeros((self.size[0], self.size[1], 3), np.uint8))
            self.cache[instruction] = list(self.processor(text=[text], images=[[blank]])["input_ids"][0])
        return self.cache[instruction]

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
        x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        x = ((x - self.mean.to(device)) / self.std.to(device)).to(dtype)
        if self.layout == "flat":
            return {"pixel_values": x}
        mask = torch.ones((x.shape[0], 1, *self.size), dtype=torch.bool, device=device)
        return {"pixel_values": x.unsqueeze(1), "pixel_attention_mask": mask}


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only (0 for the left padding)."""
    return (attention_mask.cumsum(-1) - 1).clamp_(min=0)

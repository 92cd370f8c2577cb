"""A Hugging Face vision-language model as a fleetrl network, for the tests of what fleetrl does
with *any* HF model — FSDP2 units from `_no_split_modules`, sharded (DCP) checkpoints, weight
sync of the trainable tensors, watched phases — without a checkpoint on disk: a PaliGemma
(SigLIP vision tower + Gemma decoder) built from a config with random weights, 2 layers each.

`PaliGemmaNet(observation_space, num_action_params, width=16, layers=2, lora=False)` follows fleetrl's network
interface (`model.id: tests.hf_models:PaliGemmaNet`): the observation's image becomes the image
tokens, its mission the text tokens, and heads on the mean of the last hidden states give the
action parameters and the value. With `lora` the model is frozen and only a low-rank adapter on
each attention projection (peft) and the heads train: what a LoRA fine-tune syncs.
`GemmaNet` is a Gemma decoder over a vector observation (CartPole), for whole runs.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

VOCABULARY = 64  # the text vocabulary; the last id is the image token
IMAGE_TOKEN = VOCABULARY - 1


def paligemma(width: int = 16, layers: int = 2, image_size: int = 7, patch_size: int = 7) -> nn.Module:
    """A randomly initialised PaliGemmaForConditionalGeneration (~20k parameters at width 16)."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    config = PaliGemmaConfig(
        vision_config={
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": patch_size,
            "vision_use_head": False,  # PaliGemma reads the patch states, never the pooled one
        },
        text_config={
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": width // 2,
            "vocab_size": VOCABULARY,
        },
        image_token_index=IMAGE_TOKEN,
        projection_dim=width,
    )
    return PaliGemmaForConditionalGeneration(config)


class PaliGemmaNet(nn.Module):
    def __init__(
        self,
        observation_space: gym.spaces.Dict,
        num_action_params: int,
        width: int = 16,
        layers: int = 2,
        lora: bool = False,
    ):
        super().__init__()
        image = observation_space["image"]
        self.vlm = paligemma(width, layers, image_size=image.shape[0], patch_size=image.shape[0])
        self.image_tokens = 1  # one patch: the whole (square) image
        if lora:
            from peft import LoraConfig, get_peft_model

            self.vlm = get_peft_model(self.vlm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        extra = int(observation_space["direction"].shape[0])
        self.action_head = nn.Linear(width + extra, num_action_params)
        self.value_head = nn.Linear(width + extra, 1)

    def forward(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        mission = obs["mission"].long()
        batch = mission.shape[0]
        image_ids = torch.full((batch, self.image_tokens), IMAGE_TOKEN, device=mission.device)
        input_ids = torch.cat([image_ids, mission], dim=1)
        mask = input_ids != 0
        pixels = obs["image"].permute(0, 3, 1, 2).float() / 255.0
        model = self.vlm.get_base_model() if hasattr(self.vlm, "get_base_model") else self.vlm
        hidden = model.model(
            input_ids=input_ids,
            pixel_values=pixels.to(self.action_head.weight.dtype),
            attention_mask=mask.long(),
            token_type_ids=torch.zeros_like(input_ids),
            use_cache=False,
        ).last_hidden_state
        pooled = (hidden.float() * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        features = torch.cat([pooled, obs["direction"].float()], dim=-1).to(self.action_head.weight.dtype)
        return self.action_head(features).float(), self.value_head(features).squeeze(-1).float()


class GemmaNet(nn.Module):
    """A 2-layer Hugging Face Gemma over a vector observation (CartPole's): the observation is
    projected to two input embeddings, heads read the last hidden state. The token embeddings
    are frozen (the inputs are embeddings already), as a frozen base would be."""

    def __init__(self, observation_space: gym.spaces.Box, num_action_params: int, width: int = 16):
        super().__init__()
        from transformers import GemmaConfig, GemmaModel

        config = GemmaConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=width // 2,
            vocab_size=VOCABULARY,
        )
        self.gemma = GemmaModel(config)
        self.gemma.embed_tokens.requires_grad_(False)
        self.width = width
        self.embed = nn.Linear(int(observation_space.shape[0]), 2 * width)
        self.action_head = nn.Linear(width, num_action_params)
        self.value_head = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed(obs.float()).unflatten(-1, (2, self.width))
        hidden = self.gemma(inputs_embeds=embeds, use_cache=False).last_hidden_state[:, -1]
        return self.action_head(hidden).float(), self.value_head(hidden).squeeze(-1).float()

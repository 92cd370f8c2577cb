"""What every `model.id: hf` policy shares, whatever its action head (`model.action_head`): the
Hugging Face model and the value head (`VLANetwork`, with the action head's own module beside
them when it has one), loading them from the folder (`load_network`), and one pass of the model
over the prompt and a suffix of positions after it (`VLABackbone.run`).

The prompt (image tokens, instruction; `prompts.py`) is left-padded, so that every sample's last
prompt token sits in the same column; positions count the real tokens only (families.py). The
suffix holds the head's positions: action tokens (the tokens head), placeholders whose input
embedding is zero (OpenVLA-OFT's parallel decoding; the L1 head's action positions), or nothing
(the flow head reads the prompt alone). A head may put an embedding of its own into one suffix
column (`injecting`: the L1 head's state token) — a hook on the model's input embeddings writes
it, so that every family embeds its inputs as it always does.

The value head, an MLP hidden → 512 → 128 → 1 with GELU (RLinf's), reads the last hidden state
of the last prompt token, the one before the suffix: the critic sees the VLM's prefix only. With
`model.value_gradient: head` it reads that state detached, so its loss trains the head alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.hf.families import prompt_positions, step_positions
from fleetrl.models.hf.folder import VALUE_HEAD_FILE, load_folder
from fleetrl.models.hf.lora import apply_lora
from fleetrl.models.hf.prompts import Prompts

MARKERS = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def marker_ids(config) -> set[int]:
    """The ids the model's config gives its image and video markers: never action tokens."""
    return {value for name in MARKERS if isinstance(value := getattr(config, name, None), int)}


def actions_both_ways(mask: torch.Tensor, prompt: int, prefix_lm: bool) -> torch.Tensor:
    """A (B, 1, L, L) boolean attention mask: causal (the prompt both ways where the family is
    prefix-LM), but every action position (from `prompt` on) sees every other; padding unseen."""
    index = torch.arange(mask.shape[1], device=mask.device)
    allowed = index[None, :] <= index[:, None]
    if prefix_lm:
        allowed = allowed | ((index[None, :] < prompt) & (index[:, None] < prompt))
    actions = index >= prompt
    allowed = allowed | (actions[:, None] & actions[None, :])
    return (allowed[None] & mask.bool()[:, None, :])[:, None]


@dataclass
class Decoding:
    """What a cached decoding step continues from: the attention mask of every token so far, the
    model's KV cache, and the per-row position offset (families.prompt_positions)."""

    mask: torch.Tensor
    cache: object
    offset: torch.Tensor


class VLANetwork(nn.Module):
    """The Hugging Face model (LoRA-wrapped or not), the value head and the action head's own module
    (`head`: the flow expert, the L1 regression head; None for tokens): what trains."""

    def __init__(self, model: nn.Module, hidden_size: int, value_trains_model: bool = True):
        super().__init__()
        self.model = model
        self.value_trains_model = value_trains_model  # `model.value_gradient: model`
        self.value_head = nn.Sequential(
            nn.Linear(hidden_size, 512), nn.GELU(), nn.Linear(512, 128), nn.GELU(), nn.Linear(128, 1)
        )
        self.head: nn.Module | None = None

    @property
    def hf(self) -> nn.Module:
        """The transformers model itself (inside peft's wrapper, with the adapters in its layers)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def hidden_size(self) -> int:
        return self.value_head[0].in_features

    def wrap_units(self) -> list[nn.Module]:
        """The model's repeated blocks (`_no_split_modules`, as accelerate shards it), and the action
        head's module as one unit of its own (the flow expert is all-gathered once for its steps)."""
        names = set(self.hf._no_split_modules or ())
        units = [module for module in self.hf.modules() if type(module).__name__ in names]
        return units + ([self.head] if self.head is not None else [])


def load_network(config: HfModelConfig, observation_space: gym.Space) -> tuple[VLANetwork, Prompts]:
    """The folder's model and processor as a `VLANetwork` and its `Prompts`: the value head from a
    folder fleetrl exported, LoRA adapters on the model where `model.lora` asks (the head, attached
    by the policy afterwards, stays trainable in full)."""
    dtype = getattr(torch, config.dtype)
    attention = None if config.attn_implementation == "auto" else config.attn_implementation
    model, processor, family = load_folder(config.path, config.trust_remote_code, dtype, attention)
    prompts = Prompts(processor, family, observation_space, config.prompt_template)
    network = VLANetwork(model, model.config.get_text_config().hidden_size, config.value_gradient == "model")
    head = Path(config.path).expanduser() / VALUE_HEAD_FILE
    if head.is_file():  # a folder fleetrl exported: its critic too
        from safetensors.torch import load_file

        network.value_head.load_state_dict(load_file(head))
    if config.lora is not None:
        network.model = apply_lora(network, config.lora, config.path, family.lora_targets)
    return network, prompts


class VLABackbone(nn.Module):
    """The passes every head makes (module docstring); a head's policy subclasses it."""

    network: VLANetwork
    prompts: Prompts

    def __init__(self, network: VLANetwork, prompts: Prompts, action_attention: str = "causal"):
        super().__init__()
        self.network, self.prompts, self.action_attention = network, prompts, action_attention
        self.family = prompts.family
        self.placeholder = prompts.pad_id
        self.injected: tuple[int, torch.Tensor] | None = None  # (columns from the end, (B, H)): `injecting`

    def use_placeholders(self) -> None:
        """Zero the placeholder's input embedding (and write `injecting`'s): for heads whose suffix
        holds placeholders."""
        self.network.hf.get_input_embeddings().register_forward_hook(self.fill_placeholders)

    def fill_placeholders(self, module, inputs, output: torch.Tensor) -> torch.Tensor:
        """Input-embedding hook: the placeholder's embedding is zero (OFT's empty action inputs), and
        the column `injecting` names holds its embedding."""
        output = output.masked_fill((inputs[0] == self.placeholder).unsqueeze(-1), 0.0)
        if self.injected is not None:
            from_end, embedding = self.injected
            column = output.shape[1] - from_end
            output = torch.cat(
                [output[:, :column], embedding.unsqueeze(1).to(output.dtype), output[:, column + 1 :]], 1
            )
        return output

    @contextlib.contextmanager
    def injecting(self, from_end: int, embedding: torch.Tensor):
        """Within: the model's input at the column `from_end` columns before the sequence's end is
        `embedding` (B, H) (the suffix's own column, whatever the prompt's length)."""
        self.injected = (from_end, embedding)
        try:
            yield
        finally:
            self.injected = None

    def placeholders(self, obs, count: int) -> torch.Tensor:
        """(B, count) placeholder ids: a suffix of empty positions."""
        return torch.full((self.batch(obs), count), self.placeholder, dtype=torch.long, device=self.device)

    def run(self, obs, suffix: torch.Tensor, state: Decoding | None = None, keep_cache: bool = False):
        """One pass of the base model over the prompt followed by `suffix` (B, S) ids, or over
        `suffix` alone after the prompt of a kept `state`. Returns (last hidden states, prompt
        length, the state a next step continues from)."""
        device = self.device
        kwargs = {}
        if state is None:
            ids, mask = self.prompts.tokens(obs, device)
            prompt = ids.shape[1]
            ids = torch.cat([ids, suffix], dim=1)
            mask = torch.cat([mask, torch.ones_like(suffix)], dim=1)
            kwargs.update(self.prompts.pixels(obs, device, self.network.hf.dtype))
            position_ids, offset = prompt_positions(self.family, self.network.hf.base_model, ids, mask, kwargs)
            if self.family.prefix_lm:
                kwargs["token_type_ids"] = (torch.arange(ids.shape[1], device=device) >= prompt).long().expand_as(ids)
            cache = None
            attention = mask
            if self.action_attention == "bidirectional" and suffix.shape[1]:
                attention = actions_both_ways(mask, prompt, self.family.prefix_lm)
        else:
            ids, prompt, cache, offset = suffix, 0, state.cache, state.offset
            mask = torch.cat([state.mask, torch.ones_like(suffix)], dim=1)
            position_ids = step_positions(self.family, mask, offset, ids.shape[1])
            if self.family.prefix_lm:
                kwargs["token_type_ids"] = torch.ones_like(suffix)
            attention = mask
        out = self.network.hf.base_model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=position_ids,
            cache=cache,
            use_cache=keep_cache,
            **kwargs,
        )
        return out.last_hidden_state, prompt, Decoding(mask, out.cache if keep_cache else None, offset)

    def prefix(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(the prompt's last hidden states (B, L, H), its mask (B, L)): one pass over the prompt alone."""
        empty = torch.empty((self.batch(obs), 0), dtype=torch.long, device=self.device)
        hidden, _, decoding = self.run(obs, empty)
        return hidden, decoding.mask

    def value_of(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.network.value_trains_model:
            hidden = hidden.detach()
        return self.network.value_head(hidden.float()).squeeze(-1).float()

    def batch(self, obs) -> int:
        return len(obs[self.prompts.image_key] if isinstance(obs, dict) else obs)

    @property
    def device(self) -> torch.device:
        return self.network.value_head[0].weight.device

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor:
        hidden, _ = self.prefix(obs)
        return self.value_of(hidden[:, -1])

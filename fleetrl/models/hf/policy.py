"""`model.id: hf` — a Hugging Face vision-language model acting through its vocabulary.

One sample's sequence is the prompt (image tokens, instruction; `prompts.py`) followed by N = K·D
action positions (K = `model.action_chunk` actions of D tokens; `actions.py` maps tokens to env
actions). Two ways to decode them (`model.decode`):

- `parallel` (OpenVLA-OFT): ONE forward pass. The action positions' inputs are a fixed
  placeholder — the pad token with its embedding zeroed — and the output at action position j is
  action token j's logits. Acting and the loss path run the same pass.
- `autoregressive` (OpenVLA): token j is predicted at the position before it. Acting samples the
  N tokens one at a time with the KV cache (N + 1 forward passes, the prompt's once); the loss
  path feeds the sampled tokens back in one teacher-forced pass.

Logits are read only at the action ids: sampling is masked to them, and each token's log-prob
and entropy are those of a categorical over the action bins (float32) — divided by
`model.temperature` and cut to the `model.top_k` most likely bins where set, in acting and in the
loss path alike. The value head, an MLP
hidden → 512 → 128 → 1 with GELU (RLinf's), reads the last hidden state of the last prompt token,
the one before the first action token.

The policy follows fleetrl's policy interface (`models/policy.py`): `forward(obs, actions)` →
(log-probs, entropies, value), `act`, `value`; log-probs and entropies are per token, shaped
`logprob_shape` as every fleetrl token policy's: (D,) for one Box action of D tokens, (K, D) for a
chunk of K, () and (K,) for Discrete actions (one token each), so that a loss may combine them
per token, per action or per chunk over the executed actions (e.g. `algorithm.logprob_type`). With
K > 1 (`action_chunk`) `act` returns a chunk per decision: (B, K, D) Box actions, (B, K) Discrete.

With `model.lora`, `lora.py` makes only the adapters and the value head trainable and the
policy's state only those tensors, plus the base folder's fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.distributions import Categorical
from fleetrl.models.hf.actions import VocabActions, action_token_ids
from fleetrl.models.hf.families import prompt_positions, step_positions
from fleetrl.models.hf.folder import VALUE_HEAD_FILE, load_folder
from fleetrl.models.hf.lora import apply_lora, keep_trainable_state
from fleetrl.models.hf.prompts import Prompts
from fleetrl.models.loss_outputs import LossOutputs
from fleetrl.probe.flight_recorder import phase

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
    """The Hugging Face model (LoRA-wrapped or not) and the value head: what trains."""

    def __init__(self, model: nn.Module, hidden_size: int):
        super().__init__()
        self.model = model
        self.value_head = nn.Sequential(
            nn.Linear(hidden_size, 512), nn.GELU(), nn.Linear(512, 128), nn.GELU(), nn.Linear(128, 1)
        )

    @property
    def hf(self) -> nn.Module:
        """The transformers model itself (inside peft's wrapper, with the adapters in its layers)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def wrap_units(self) -> list[nn.Module]:
        """The model's repeated blocks (`_no_split_modules`, as accelerate shards it)."""
        names = set(self.hf._no_split_modules or ())
        return [module for module in self.hf.modules() if type(module).__name__ in names]


class VLAPolicy(nn.Module):
    network: VLANetwork
    actions: VocabActions
    prompts: Prompts

    def __init__(
        self,
        network: VLANetwork,
        prompts: Prompts,
        actions: VocabActions,
        decode: str,
        temperature: float = 1.0,
        top_k: int | None = None,
        action_attention: str = "causal",
    ):
        super().__init__()
        self.network, self.prompts, self.actions, self.decode = network, prompts, actions, decode
        self.temperature, self.top_k, self.action_attention = temperature, top_k, action_attention
        self.action_chunk = actions.chunk  # the rollout worker's trajectories hold (K, *one action) per decision
        one_action = () if actions.discrete else (actions.dim,)  # a Discrete action is one token
        self.logprob_shape = ((actions.chunk,) if actions.chunk > 1 else ()) + one_action
        hf = network.hf
        self.placeholder = prompts.pad_id
        self.family = prompts.family
        self.softcap = getattr(hf.config.get_text_config(), "final_logit_softcapping", None)
        if decode == "parallel":
            hf.get_input_embeddings().register_forward_hook(self.zero_placeholders)

    @classmethod
    def from_config(cls, config: HfModelConfig, observation_space: gym.Space, action_space: gym.Space) -> VLAPolicy:
        dtype = getattr(torch, config.dtype)
        attention = None if config.attn_implementation == "auto" else config.attn_implementation
        model, processor, family = load_folder(config.path, config.trust_remote_code, dtype, attention)
        prompts = Prompts(processor, family, observation_space, config.prompt_template)
        reserved = prompts.reserved_ids() | marker_ids(model.config)
        token_ids = action_token_ids(len(processor.tokenizer), config.action_bins, reserved)
        actions = VocabActions(action_space, config.action_bins, token_ids, config.action_chunk, config.action_stats)
        network = VLANetwork(model, model.config.get_text_config().hidden_size)
        head = Path(config.path).expanduser() / VALUE_HEAD_FILE
        if head.is_file():  # a folder fleetrl exported: its critic too
            from safetensors.torch import load_file

            network.value_head.load_state_dict(load_file(head))
        if config.lora is not None:
            network.model = apply_lora(network, config.lora, config.path, family.lora_targets)
        policy = cls(
            network, prompts, actions, config.decode, config.temperature, config.top_k, config.action_attention
        )
        if config.lora is not None:
            keep_trainable_state(policy)
        return policy

    def zero_placeholders(self, module, inputs, output: torch.Tensor) -> torch.Tensor:
        """Input-embedding hook: the placeholder's embedding is zero (OFT's empty action inputs)."""
        return output.masked_fill((inputs[0] == self.placeholder).unsqueeze(-1), 0.0)

    # ------------------------------------------------------------------------------ passes

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

    def bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, N, H) → the action bins' log-probabilities (B, N, choices), float32."""
        logits = self.actions.logits(self.network.hf.get_output_embeddings()(hidden))
        if self.softcap:  # Gemma 2's final logit soft-capping, which the model's own head applies
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:  # the rest: probability 0, entropy finite
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
        return Categorical.normalize(logits)

    def value_of(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.network.value_head(hidden.float()).squeeze(-1).float()

    def distribution(self, obs, bins: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token log-probabilities (B, N, choices), value (B,)) in one pass: parallel
        decoding, or autoregressive teacher-forced on `bins` (the sampled tokens)."""
        count = self.actions.count
        if self.decode == "parallel":
            placeholders = torch.full((self.batch(obs), count), self.placeholder, dtype=torch.long)
            hidden, prompt, _ = self.run(obs, placeholders.to(self.device))
            return self.bin_logits(hidden[:, prompt:]), self.value_of(hidden[:, prompt - 1])
        hidden, prompt, _ = self.run(obs, self.actions.token_ids(bins))
        return self.bin_logits(hidden[:, prompt - 1 : prompt - 1 + count]), self.value_of(hidden[:, prompt - 1])

    def batch(self, obs) -> int:
        return len(obs[self.prompts.image_key] if isinstance(obs, dict) else obs)

    @property
    def device(self) -> torch.device:
        return self.network.value_head[0].weight.device

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """(B, K·D) per token → (B, *logprob_shape)."""
        return values.reshape(values.shape[0], *self.logprob_shape)

    # ---------------------------------------------------------------------- the interface

    def forward(self, obs, actions: torch.Tensor) -> LossOutputs:
        """Loss path: log-probs of `actions`' tokens (B, *logprob_shape), their entropies, value (B,)."""
        bins = self.actions.encode(actions)
        log_p, value = self.distribution(obs, bins)
        return LossOutputs(
            self.per_token(Categorical.log_prob(log_p, bins)), self.per_token(Categorical.entropy(log_p)), value, None
        )

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False):
        """(env actions, their tokens' log-probs (B, *logprob_shape), values (B,))."""
        pick = Categorical.mode if deterministic else Categorical.sample
        with phase("generate"):
            if self.decode == "parallel":
                log_p, value = self.distribution(obs)
                bins = pick(log_p)
                chosen = Categorical.log_prob(log_p, bins)
            else:
                bins, chosen, value = self.generate(obs, pick)
        return self.actions.decode(bins), self.per_token(chosen), value

    def generate(self, obs, pick) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Autoregressive sampling with the KV cache: (bins (B, N), their log-probs, value)."""
        empty = torch.empty((self.batch(obs), 0), dtype=torch.long, device=self.device)
        hidden, _, state = self.run(obs, empty, keep_cache=True)
        value = self.value_of(hidden[:, -1])
        bins, chosen = [], []
        for j in range(self.actions.count):
            log_p = self.bin_logits(hidden[:, -1:]).squeeze(1)
            bins.append(pick(log_p))
            chosen.append(Categorical.log_prob(log_p, bins[-1]))
            if j + 1 < self.actions.count:
                token = self.actions.token_ids(bins[-1]).unsqueeze(1)
                hidden, _, state = self.run(obs, token, state, keep_cache=True)
        return torch.stack(bins, 1), torch.stack(chosen, 1), value

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor:
        empty = torch.empty((self.batch(obs), 0), dtype=torch.long, device=self.device)
        hidden, _, _ = self.run(obs, empty)
        return self.value_of(hidden[:, -1])

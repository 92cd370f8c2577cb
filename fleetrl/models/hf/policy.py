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

The prompt and the pass over it are every head's (`backbone.py`). Logits are read only at the action ids: sampling is masked to them, and each token's log-prob
and entropy are those of a categorical over the action bins (float32) — divided by
`model.temperature` and cut to the `model.top_k` most likely bins where set, in acting and in the
loss path alike. The value head reads the last prompt token's hidden state (backbone.py).

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

import gymnasium as gym
import torch

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.distributions import Categorical
from fleetrl.models.hf.actions import VocabActions, action_token_ids
from fleetrl.models.hf.backbone import VLABackbone, VLANetwork, load_network, marker_ids
from fleetrl.models.hf.lora import keep_trainable_state
from fleetrl.models.hf.prompts import Prompts
from fleetrl.models.loss_outputs import LossOutputs
from fleetrl.probe.flight_recorder import phase


class VLAPolicy(VLABackbone):
    """`model.action_head: tokens` (module docstring)."""

    actions: VocabActions

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
        super().__init__(network, prompts, action_attention)
        self.actions, self.decode = actions, decode
        self.temperature, self.top_k = temperature, top_k
        self.action_chunk = actions.chunk  # the rollout worker's trajectories hold (K, *one action) per decision
        one_action = () if actions.discrete else (actions.dim,)  # a Discrete action is one token
        self.logprob_shape = ((actions.chunk,) if actions.chunk > 1 else ()) + one_action
        self.softcap = getattr(network.hf.config.get_text_config(), "final_logit_softcapping", None)
        if decode == "parallel":
            self.use_placeholders()

    @classmethod
    def from_config(cls, config: HfModelConfig, observation_space: gym.Space, action_space: gym.Space) -> VLAPolicy:
        network, prompts = load_network(config, observation_space)
        reserved = prompts.reserved_ids() | marker_ids(network.hf.config)
        token_ids = action_token_ids(len(prompts.processor.tokenizer), config.action_bins, reserved)
        actions = VocabActions(action_space, config.action_bins, token_ids, config.action_chunk, config.action_stats)
        policy = cls(
            network, prompts, actions, config.decode, config.temperature, config.top_k, config.action_attention
        )
        if config.lora is not None:
            keep_trainable_state(policy)
        return policy

    # ------------------------------------------------------------------------------ passes

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

    def distribution(self, obs, bins: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token log-probabilities (B, N, choices), value (B,)) in one pass: parallel
        decoding, or autoregressive teacher-forced on `bins` (the sampled tokens)."""
        count = self.actions.count
        if self.decode == "parallel":
            hidden, prompt, _ = self.run(obs, self.placeholders(obs, count))
            return self.bin_logits(hidden[:, prompt:]), self.value_of(hidden[:, prompt - 1])
        hidden, prompt, _ = self.run(obs, self.actions.token_ids(bins))
        return self.bin_logits(hidden[:, prompt - 1 : prompt - 1 + count]), self.value_of(hidden[:, prompt - 1])

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

    def to_env(self, records: torch.Tensor) -> torch.Tensor:
        """The env's actions for `act`'s: the same (the tokens' action values are the actions)."""
        return records

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

"""`model.action_head: l1` — a Hugging Face VLM with OpenVLA-OFT's L1 regression head.

The VLM reads the prompt, then — where the env gives proprioception (`model.state_key`) — one
position holding the state's projection into the model's embedding space (OFT's proprio token),
then K·D action positions whose input embedding is zero (OFT's parallel decoding:
`model.action_attention` says whether they attend to one another both ways). The head
(l1_head.py) regresses the chunk from the action positions' last hidden states; the value head
reads the prompt's last token, as with every head (backbone.py).

- **Acting** (phase `generate`, one forward pass): a sample of the Gaussian around the regressed
  chunk, N(mean, exp(log_std)²) per normalised dimension (deterministic: the mean); the record is
  that normalised sample (B, K, D), its log-probability the diagonal Gaussian's per chunk action.
- **The loss path**: the same pass, the record's Gaussian log-probability and entropy under the
  current mean and log-std.
- **Imitation** (`fleetrl sft`): the L1 distance of the mean to the demonstrated chunk (OFT's). The
  log-std takes no part in it (it enters the graph with weight 0, so that every parameter has a
  gradient for DDP and for fleetrl's gradient check).
"""

from __future__ import annotations

import contextlib

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.distributions import DiagonalGaussian
from fleetrl.models.hf.backbone import VLANetwork, load_network
from fleetrl.models.hf.continuous import ContinuousActions, ContinuousVLA, proprioception
from fleetrl.models.hf.l1_head import L1Head, l1_error
from fleetrl.models.hf.lora import keep_trainable_state
from fleetrl.models.hf.prompts import Prompts
from fleetrl.models.loss_outputs import LossOutputs
from fleetrl.probe.flight_recorder import phase


class L1VLAPolicy(ContinuousVLA):
    """`model.action_head: l1` (module docstring)."""

    imitation_loss = "l1"

    def __init__(
        self,
        network: VLANetwork,
        prompts: Prompts,
        actions: ContinuousActions,
        state: tuple[str, int] | None,
        action_attention: str = "causal",
    ):
        super().__init__(network, prompts, actions, state, action_attention)
        self.record_shape = (actions.chunk, actions.dim)
        self.count = actions.chunk * actions.dim  # action positions
        self.use_placeholders()

    @classmethod
    def from_config(cls, config: HfModelConfig, observation_space: gym.Space, action_space: gym.Space):
        network, prompts = load_network(config, observation_space)
        actions = ContinuousActions(action_space, config.action_chunk, config.action_stats, "l1")
        head = config.l1_head
        network.head = L1Head(network.hidden_size, actions.dim, actions.chunk, head.width, head.init_log_std)
        state = proprioception(observation_space, config.state_key)
        if state:  # the state's projection into the model's embedding space: one input position
            network.state_in = nn.Linear(state[1], network.hidden_size)
        policy = cls(network, prompts, actions, state, config.action_attention)
        policy.load_head(config)
        if config.lora is not None:
            keep_trainable_state(policy)
        return policy

    def head_modules(self) -> dict[str, nn.Module]:
        state_in = getattr(self.network, "state_in", None)
        return {"head": self.network.head, **({"state_in": state_in} if state_in is not None else {})}

    def export_meaning(self, config: HfModelConfig) -> dict:
        return {
            "l1": {"width": config.l1_head.width},
            "positions": "prompt, [state], K·D zero-embedded action positions",
        }

    def to_env(self, records: torch.Tensor) -> torch.Tensor:
        return self.actions.to_env(records)

    def gaussian(self, obs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the regressed chunk (B, K, D), its log-std broadcast to it, value (B,)) in one pass."""
        state = self.state(obs)
        extra = 0 if state is None else 1
        suffix = self.placeholders(obs, extra + self.count)
        injecting = contextlib.nullcontext()
        if state is not None:
            injecting = self.injecting(
                self.count + 1, self.network.state_in(state.to(self.network.state_in.weight.dtype))
            )
        with injecting:
            hidden, prompt, _ = self.run(obs, suffix)
        mean, log_std = self.network.head(hidden[:, prompt + extra :])
        return mean, log_std, self.value_of(hidden[:, prompt - 1])

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False):
        """(normalised samples (B, K, D), their log-probabilities (B, *logprob_shape), values (B,))."""
        with phase("generate"):
            mean, log_std, value = self.gaussian(obs)
        sample = mean if deterministic else DiagonalGaussian.sample(mean, log_std)
        return sample, self.per_action(DiagonalGaussian.log_prob(mean, log_std, sample)), value

    def scored(self, obs, records: torch.Tensor) -> LossOutputs:
        mean, log_std, value = self.gaussian(obs)
        logprob = DiagonalGaussian.log_prob(mean, log_std, records)
        entropy = DiagonalGaussian.entropy(mean, log_std)
        return LossOutputs(self.per_action(logprob), self.per_action(entropy), value, None)

    def imitation(self, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std, value = self.gaussian(obs)
        unused = log_std.sum() * 0.0  # in the graph, with no weight (module docstring)
        return l1_error(mean, actions) + unused, value

"""What the continuous action heads (`model.action_head: l1 | flow`) share.

- **Actions**: a 1-D Box, normalised per dimension to [-1, 1] as the tokens head normalises it (the
  bounds, or `model.action_stats`' q01/q99: `actions.action_bounds`), K = `model.action_chunk`
  actions a decision. A normalised value outside [-1, 1] is clipped on its way to the env.
- **The record**: what `act` returns first and the rollout stores as the decision's action is what
  the loss path needs to recompute its log-probability — the L1 head's normalised sample (K, D),
  the flow head's whole chain (S + 1, K, D) — and `to_env(record)` is the env's action: (B, D),
  or (B, K, D) with chunks. `record_shape` sizes the rollout's buffer.
- **Log-probabilities** per chunk action, (B, K) ((B,) without chunks): summed over the action's D
  dimensions (and, for flow, the chain's steps), so that an RL update keeps only the actions an episode
  executed and `algorithm.logprob_type` chooses one ratio per decision (`chunk_level`) or per
  action (`action_level`); there are no tokens (`token_level` is refused).
- **Imitation** (`fleetrl sft`): `forward(obs, env_actions, imitation=True)` returns the head's own
  supervised loss per chunk action (`ImitationOutputs`: the flow-matching or the L1 error) and
  the value, instead of a likelihood.
- **Proprioception**: the observation key `model.state_key`, where the env has it (a 1-D Box), is
  one token — π0's state token.
- **The export's head**: `action_head.safetensors` (the head's trained tensors) and
  `action_head.json` (what they mean) beside the VLM folder, loaded again from `model.path` when its
  kind is the config's.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.errors import ConfigError
from fleetrl.models.hf.actions import action_bounds
from fleetrl.models.hf.backbone import VLABackbone, VLANetwork
from fleetrl.models.hf.prompts import Prompts
from fleetrl.models.loss_outputs import ImitationOutputs, LossOutputs

HEAD_WEIGHTS = "action_head.safetensors"
HEAD_CONFIG = "action_head.json"


def proprioception(observation_space: gym.Space, key: str | None) -> tuple[str, int] | None:
    """(`key`, its width) where the env's Dict observation has `key`, else None."""
    leaf = observation_space.spaces.get(key) if isinstance(observation_space, gym.spaces.Dict) and key else None
    if leaf is None:
        return None
    if not (isinstance(leaf, gym.spaces.Box) and len(leaf.shape) == 1):
        raise ConfigError("model.state_key", key, "an observation key holding a 1-D Box (proprioception)", str(leaf))
    return key, int(leaf.shape[0])


class ContinuousActions(nn.Module):
    """Env actions ↔ normalised chunks (B, K, D) in [-1, 1] (module docstring). Buffers only."""

    def __init__(self, action_space: gym.Space, chunk: int, stats: dict | None, head: str):
        super().__init__()
        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ConfigError(
                "model.action_head", head, "tokens for an env whose actions are not a 1-D Box", str(action_space)
            )
        self.chunk, self.dim = int(chunk), int(action_space.shape[0])
        low, high = action_bounds(action_space, stats)
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("high", high, persistent=False)

    def normalise(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (B, D) or (B, K, D) → (B, K, D) in the heads' units."""
        chunk = actions.float().reshape(actions.shape[0], self.chunk, self.dim)
        return 2 * (chunk - self.low) / (self.high - self.low) - 1

    def to_env(self, normalised: torch.Tensor) -> torch.Tensor:
        """(B, K, D) normalised → env actions, clipped into the bounds: (B, D), or (B, K, D) with chunks."""
        actions = (normalised.clamp(-1, 1) + 1) / 2 * (self.high - self.low) + self.low
        return actions[:, 0] if self.chunk == 1 else actions


class ContinuousVLA(VLABackbone):
    """A continuous head's policy (module docstring); `FlowVLAPolicy` and `L1VLAPolicy` are its two."""

    imitation_loss: str  # what `fleetrl sft` minimises: "flow_matching" | "l1"
    record_shape: tuple  # one decision's record (module docstring)

    def __init__(
        self,
        network: VLANetwork,
        prompts: Prompts,
        actions: ContinuousActions,
        state: tuple[str, int] | None,
        action_attention: str = "causal",
    ):
        """`state`: (the proprioception's key, its width), or None when the policy reads none."""
        super().__init__(network, prompts, action_attention)
        self.actions = actions
        self.state_key, self.state_width = state or (None, None)
        self.action_chunk = actions.chunk
        self.logprob_shape = (actions.chunk,) if actions.chunk > 1 else ()

    def state(self, obs) -> torch.Tensor | None:
        """(B, S) proprioception, float32, or None when the policy reads none."""
        if self.state_key is None:
            return None
        return obs[self.state_key].float().to(self.device)

    def per_action(self, values: torch.Tensor) -> torch.Tensor:
        """(B, K) per chunk action → (B, *logprob_shape)."""
        return values.reshape(values.shape[0], *self.logprob_shape)

    def forward(self, obs, actions: torch.Tensor, imitation: bool = False) -> LossOutputs | ImitationOutputs:
        """Loss path. RL: `actions` are records (`act`'s first output) → `LossOutputs`. Imitation:
        `actions` are env actions (demonstrations) → `ImitationOutputs`."""
        if imitation:
            error, value = self.imitation(obs, self.actions.normalise(actions))
            return ImitationOutputs(self.per_action(error), value)
        return self.scored(obs, actions)

    def imitation(self, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, K) the head's supervised error on normalised `actions`, value (B,))."""
        raise NotImplementedError

    def scored(self, obs, records: torch.Tensor) -> LossOutputs:
        """The records' log-probabilities, entropies (B, *logprob_shape) and the value (B,)."""
        raise NotImplementedError

    def to_env(self, records: torch.Tensor) -> torch.Tensor:
        """Records → the env's actions."""
        raise NotImplementedError

    def head_modules(self) -> dict[str, nn.Module]:
        """The head's trained modules beyond the VLM and the value head, by name (the export's)."""
        return {"head": self.network.head}

    def export_meaning(self, config: HfModelConfig) -> dict:
        """What action_head.json says of this head beside what every continuous head's says."""
        raise NotImplementedError

    def save_head(self, folder: Path, config: HfModelConfig) -> None:
        """`action_head.safetensors` and `action_head.json` into an exported folder."""
        from safetensors.torch import save_file

        tensors = {
            f"{name}.{key}": value.detach().contiguous()
            for name, module in self.head_modules().items()
            for key, value in module.state_dict().items()
        }
        save_file(tensors, folder / HEAD_WEIGHTS)
        described = {
            "action_head": config.action_head,
            "action_chunk": self.actions.chunk,
            "action_dim": self.actions.dim,
            "action_low": self.actions.low.tolist(),
            "action_high": self.actions.high.tolist(),
            "state_key": self.state_key,
            "state_dim": self.state_width,
            **self.export_meaning(config),
        }
        (folder / HEAD_CONFIG).write_text(json.dumps(described, indent=2) + "\n")

    def load_head(self, config: HfModelConfig) -> None:
        """The head's tensors from a folder fleetrl exported with this head (module docstring)."""
        folder = Path(config.path).expanduser()
        if not (folder / HEAD_CONFIG).is_file():
            return
        if json.loads((folder / HEAD_CONFIG).read_text()).get("action_head") != config.action_head:
            return
        from safetensors.torch import load_file

        saved = load_file(folder / HEAD_WEIGHTS)
        for name, module in self.head_modules().items():
            own = {key[len(name) + 1 :]: value for key, value in saved.items() if key.startswith(f"{name}.")}
            try:
                module.load_state_dict(own)
            except RuntimeError as error:
                raise ConfigError(
                    "model.path",
                    config.path,
                    f"a folder whose {HEAD_WEIGHTS} fits the config's action head",
                    str(error).splitlines()[0],
                ) from None

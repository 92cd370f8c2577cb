"""PPG's auxiliary value head: a value head on the *policy* network's features, trained only in the
auxiliary phase, where the value is distilled into the policy trunk.

PPG adds it to the network of the policy its actor builds (`add_aux_value_head`), right after the
policy is made, so every other layer draws the same initial weights as PPO's. It lives at
`network.aux_value_head` (so it is checked, clipped and checkpointed with the policy), but only
the actor ever has it: what the rollout and eval workers load (`policy_weights`), what a
checkpoint's `policy` holds and what `runner.init_from` reads are the plain policy's tensors
(`without_aux_head`); the head's own travel in the checkpoint's `ppg` entry.

The network must expose its policy features: `forward_features(obs) -> (action_params, value,
policy_features)` and `policy_features_size`, as the built-in MLP does (docs: guides/model.md).
"""

from __future__ import annotations

import torch
from torch import nn

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError

HEAD = "aux_value_head"
PREFIX = f"network.{HEAD}."  # the head's tensors in the policy's state_dict


def add_aux_value_head(policy: nn.Module, config: Config) -> None:
    """Give `policy.network` PPG's auxiliary value head (orthogonally initialised with gain 1, as
    the value head, with `model.ortho_init`)."""
    network = policy.network
    if not (callable(getattr(network, "forward_features", None)) and hasattr(network, "policy_features_size")):
        raise ConfigError(
            "model.id",
            config.model.id,
            "'mlp', or a network of your own that defines forward_features(obs) -> "
            "(action_params, value, policy_features) and policy_features_size",
            "PPG's auxiliary value head reads the policy features",
        )
    head = nn.Linear(network.policy_features_size, 1)
    if config.model.ortho_init:
        nn.init.orthogonal_(head.weight, 1.0)
        nn.init.zeros_(head.bias)
    network.add_module(HEAD, head.to(next(network.parameters()).device))


def forward_aux(policy: nn.Module, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The auxiliary phase's loss path: (distribution inputs, value, auxiliary value), one trunk pass."""
    params, value, features = policy.network.forward_features(obs)
    aux_value = getattr(policy.network, HEAD)(features).squeeze(-1)
    return policy.distribution_inputs(params), value, aux_value


def policy_forward(policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor):
    """The policy phase's loss path: `Policy.forward`."""
    return policy.forward(obs, actions)


def without_aux_head(state: dict) -> tuple[dict, dict]:
    """(the policy's tensors, the head's) of a policy state_dict."""
    head = {key: value for key, value in state.items() if key.startswith(PREFIX)}
    return {key: value for key, value in state.items() if key not in head}, head

"""`Policy`: a network plus the action distribution its action space calls for.

The network is the built-in MLP (`model.id: mlp`) or the user's own (`model.id: module:attr`). A
user network is built as `Net(observation_space, num_action_params, **model.kwargs)` and its
`forward(obs)` returns `(action_params, value)`: action_params of shape (B, num_action_params) —
logits for Discrete actions, Gaussian means for Box actions — and value of shape (B,). fleetrl owns
the Gaussian's state-independent log std. README.md, "Your own network", has an example.

`forward(obs, actions)` is the loss path (what DDP wraps); `act` is inference only.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.schema import ModelConfig
from fleetrl.entry_points import resolve_entry_point
from fleetrl.models.distributions import Categorical, DiagonalGaussian, num_action_params
from fleetrl.models.mlp import ActorCriticMLP


def build_network(config: ModelConfig, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    params = num_action_params(action_space)
    if config.id == "mlp":
        return ActorCriticMLP(observation_space, params, config.hidden_sizes, config.activation,
                              config.shared_trunk, config.ortho_init)
    return resolve_entry_point("model.id", config.id)(observation_space, params, **config.kwargs)


class Policy(nn.Module):
    def __init__(self, network: nn.Module, action_space: gym.Space, init_log_std: float = 0.0):
        super().__init__()
        self.network = network
        self.continuous = isinstance(action_space, gym.spaces.Box)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full(action_space.shape, float(init_log_std)))

    @classmethod
    def from_config(cls, config: ModelConfig, observation_space, action_space) -> "Policy":
        return cls(build_network(config, observation_space, action_space), action_space,
                   config.init_log_std)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor):
        """Loss path: (log-prob of `actions`, entropy, value), all (B,)."""
        params, value = self.network(obs)
        if self.continuous:
            return (DiagonalGaussian.log_prob(params, self.log_std, actions),
                    DiagonalGaussian.entropy(params, self.log_std), value)
        log_p = Categorical.normalize(params)
        return Categorical.log_prob(log_p, actions), Categorical.entropy(log_p), value

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """Inference: (actions, their log-probs, values)."""
        params, value = self.network(obs)
        if self.continuous:
            actions = params if deterministic else DiagonalGaussian.sample(params, self.log_std)
            return actions, DiagonalGaussian.log_prob(params, self.log_std, actions), value
        log_p = Categorical.normalize(params)
        actions = Categorical.mode(log_p) if deterministic else Categorical.sample(log_p)
        return actions, Categorical.log_prob(log_p, actions), value

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs)[1]

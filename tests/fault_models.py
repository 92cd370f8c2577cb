"""A user network with a head that never gets a gradient (`tests.fault_models:UnusedHeadNet`)."""

from __future__ import annotations

import torch
from torch import nn


class UnusedHeadNet(nn.Module):
    def __init__(self, observation_space, num_action_params):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.forgotten_head = nn.Linear(32, 5)  # built, never used in forward

    def forward(self, obs: torch.Tensor):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)

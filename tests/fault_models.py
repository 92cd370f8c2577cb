"""User networks that leave parameters without a gradient: a head never used on any rank
(`tests.fault_models:UnusedHeadNet`), and one dropped by one actor rank mid-training
(`tests.fault_models:HeadDroppingNet`)."""

from __future__ import annotations

import os

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


class HeadDroppingNet(nn.Module):
    """Seed 2's trap: an actor-critic whose actor rank `on_rank` stops using its value head from
    its `drop_at`-th training forward (a branch on local data), computing values from the body."""

    def __init__(self, observation_space, num_action_params, drop_at: int = 20, on_rank: int = 1):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.drop_at, self.calls = drop_at, 0
        self.drops = (os.environ.get("FLEETRL_COMPONENT"), os.environ.get("FLEETRL_RANK")) == ("actor", str(on_rank))

    def forward(self, obs: torch.Tensor):
        h = self.body(obs)
        if self.drops and torch.is_grad_enabled():
            self.calls += 1
            if self.calls >= self.drop_at:
                return self.pi(h), h.mean(-1)  # the value head is left out
        return self.pi(h), self.v(h).squeeze(-1)

"""The rollout component: a copy of the policy, inference only, fed NumPy observations.

When rollout and actor share a process (the inline backend) the rollout worker holds the actor's
own `Policy` object, so there is nothing to sync.
"""

from __future__ import annotations

import numpy as np
import torch

from fleetrl.models.policy import Policy


class RolloutWorker:
    def __init__(self, policy: Policy):
        self.policy = policy

    def infer(self, obs: np.ndarray, deterministic: bool = False):
        """(actions, log-probs, values) tensors for a batch of observations."""
        return self.policy.act(torch.from_numpy(obs), deterministic)

    def values(self, obs: np.ndarray) -> torch.Tensor:
        return self.policy.value(torch.from_numpy(obs))

"""What every algorithm's actor worker is to the controller: the methods it calls on the actor group.

The controller (runner, runtime, fused ranks) names these methods through this class
(`actor.call_all(ActorBase.verify_replicas)`), never by string, so a reader and an IDE follow a
call to its definition, and an algorithm's actor is checked against this interface when its
group is built. Shared behaviour of all actors lives here too, once.

Collective methods with several ranks — every rank must call them, in the same order:
`init_distributed`, `train`, `verify_replicas`, and for sharded actors `policy_weights`,
`state_dict`, `load_state_dict`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from fleetrl.trajectory import Trajectory


class ActorBase(ABC):
    """One rank of an algorithm's actor: constructed as
    `Actor(config, observation_space, action_space, rank, world_size)`."""

    policy: torch.nn.Module  # what a rollout worker in the same process acts with

    @abstractmethod
    def init_distributed(self, master_addr: str, master_port: int) -> None:
        """Join the actor ranks' process group (all ranks together, right after construction)."""

    @abstractmethod
    def train(self, trajectory: Trajectory, progress: float) -> dict:
        """Train on this rank's shard of one iteration's trajectory; metrics reduced over ranks."""

    @abstractmethod
    def verify_replicas(self) -> None:
        """Raise `ReplicaDivergenceError` when the ranks' replicated tensors differ."""

    @abstractmethod
    def policy_weights(self):
        """What the rollout workers load (`RolloutWorker.load_weights`)."""

    @abstractmethod
    def state_dict(self) -> dict:
        """The full actor state in the single-process layout (complete on rank 0)."""

    @abstractmethod
    def load_state_dict(self, saved: dict) -> None:
        """Load a state written by `state_dict` (any strategy and rank count)."""

    @abstractmethod
    def close(self) -> None:
        """Leave the process group if this worker created it."""

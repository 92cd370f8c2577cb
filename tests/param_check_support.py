"""Code for tests/test_param_check.py that spawned ranks (`tests.ranks.spawn_ranks`) and Ray
workers import: a rank that perturbs its own weights, and a network that drifts on actor rank 1
in the middle of training."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from fleetrl.algos.registry import algorithm_spec
from fleetrl.parallel.param_check import ReplicaDivergenceError
from fleetrl.plan.load import load_config
from tests.dist_support import BASE, synthetic_spaces, synthetic_trajectory
from tests.ppg_support import build_worker


def outcome(worker) -> str:
    try:
        worker.verify_replicas()
        return "agree"
    except ReplicaDivergenceError as error:
        return f"ReplicaDivergenceError: {error}"


def perturbing_rank(rank: int, world: int) -> dict:
    """PPG workers (policy with its auxiliary head): check, perturb one tensor on rank 1, check."""
    _, worker = build_worker("ppg", rank, world)
    worker.init_distributed("127.0.0.1", 0)
    results = {"initial": outcome(worker)}
    if rank == 1:  # one flipped ulp in one parameter of rank 1
        with torch.no_grad():
            bias = worker.policy.network.aux_value_head.bias
            bias.copy_(torch.nextafter(bias, torch.full_like(bias, 1.0)))
    started = time.perf_counter()
    results["perturbed"] = outcome(worker)
    results["divergence"] = worker.replica_divergence()
    results["seconds"] = time.perf_counter() - started
    return results


class DriftingNet(nn.Module):
    """An actor-critic whose policy bias moves on actor rank 1 outside the loss path (as a bug
    would) at its `drift_at`-th training forward; every other process leaves it alone."""

    def __init__(self, observation_space, num_action_params, drift_at: int = 12):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.drift_at, self.calls = drift_at, 0
        self.drifts = (os.environ.get("FLEETRL_COMPONENT"), os.environ.get("FLEETRL_RANK")) == ("actor", "1")

    def forward(self, obs):
        if self.drifts and torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.drift_at:
                with torch.no_grad():
                    self.pi.bias.add_(1e-3)
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def head_dropping_rank(rank: int, world: int, drop_at: int) -> dict:
    """PPO on 2 DDP ranks with `HeadDroppingNet`: actor rank 1 drops its value head from its
    `drop_at`-th training forward. Trains until an update raises; what each rank raised."""
    os.environ["FLEETRL_COMPONENT"], os.environ["FLEETRL_RANK"] = "actor", str(rank)
    config = load_config(
        None, [*BASE, "model.id=tests.fault_models:HeadDroppingNet", f"model.kwargs={{drop_at: {drop_at}}}"]
    )
    spaces = synthetic_spaces(False)
    worker = algorithm_spec("ppo").actor_class()(config, *spaces, rank, world)
    worker.init_distributed("127.0.0.1", 0)
    for iteration in range(3):
        try:
            worker.train(synthetic_trajectory(config, spaces, iteration, 0.1, 0.05).shard(rank, world), 0.0)
        except Exception as error:
            return {"iteration": iteration, "error": f"{type(error).__name__}: {error}"}
    return {"iteration": None, "error": None}

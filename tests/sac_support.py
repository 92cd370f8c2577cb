"""Support for tests/test_sac.py's multi-process checks: deterministic SAC data and the code each
rank runs under `tests.ranks.spawn_ranks` (importable by the spawned processes, unlike a test
module's locals).

The equivalence data is a list of global batches (minibatch_size rows each, noise included);
rank r of W trains on rows [r·M/W, (r+1)·M/W) of every batch, the single process on all of them,
so a W-rank update must equal the single-process one.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch

from fleetrl.algos.sac.actor import SACActorWorker
from fleetrl.algos.sac.learner import SACBatch
from fleetrl.config.schema import Config
from fleetrl.plan.load import load_config
from fleetrl.trajectory import Trajectory

STEPS, ENVS = 4, 4  # trajectory shape of the train() path
UPDATES = 6  # gradient steps of the equivalence check
# Adam's eps well above the gradients' scale and clipping that some steps reach: the update then
# depends on the gradient's size, so a wrong averaging over ranks shows.
BASE = [
    "algorithm.name=sac",
    "env.id=Pendulum-v1",
    f"env.num_envs={ENVS}",
    f"algorithm.num_steps={STEPS}",
    "algorithm.minibatch_size=16",
    "model.hidden_sizes=[32, 32]",
    "model.activation=relu",
    "algorithm.learning_starts=8",
    "algorithm.buffer_size=400",
    "algorithm.lr=0.003",
    "actor.adam_eps=0.001",
    "algorithm.anneal_lr=false",
    "algorithm.max_grad_norm=0",
    "runner.seed=5",
    "actor.dist_timeout_s=30",
    "algorithm.checkpoint_replay_buffer=true",
]
SCENARIOS = {
    "plain": [],
    # actor and alpha every 2nd step, targets every 2nd, clipped gradients
    "delayed_clipped": [
        "algorithm.policy_frequency=2",
        "algorithm.target_network_frequency=2",
        "algorithm.max_grad_norm=0.5",
        "algorithm.tau=0.05",
    ],
    # a fixed entropy coefficient (log alpha is not trained: no gradient, no optimizer group)
    "fixed_alpha": ["algorithm.autotune=false", "algorithm.alpha=0.3", "algorithm.update_to_data=0.5"],
}


def config_for(name: str) -> Config:
    return load_config(None, BASE + SCENARIOS[name])


def spaces() -> tuple[gym.Space, gym.Space]:
    return (
        gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        gym.spaces.Box(np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32)),
    )


def make_batches(config: Config, count: int = UPDATES) -> list[SACBatch]:
    generator = torch.Generator().manual_seed(99)
    size, gamma = config.algorithm.minibatch_size, config.algorithm.gamma
    batches = []
    for _ in range(count):
        batches.append(
            SACBatch(
                obs=torch.randn(size, 3, generator=generator),
                actions=torch.rand(size, 2, generator=generator) * 2 - 1,
                rewards=torch.randn(size, generator=generator),
                discount=gamma * (torch.rand(size, generator=generator) > 0.2).float(),
                next_obs=torch.randn(size, 3, generator=generator),
                noise=torch.randn(2, size, 2, generator=generator),
            )
        )
    return batches


def rank_part(batch: SACBatch, rank: int, world: int) -> SACBatch:
    per_rank = batch.obs.shape[0] // world
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    return SACBatch(
        batch.obs[rows],
        batch.actions[rows],
        batch.rewards[rows],
        batch.discount[rows],
        batch.next_obs[rows],
        batch.noise[:, rows],
    )


def make_trajectory(iteration: int) -> Trajectory:
    """A collect-shaped trajectory with episode ends and true next observations."""
    generator = torch.Generator().manual_seed(500 + iteration)
    obs = torch.randn(STEPS, ENVS, 3, generator=generator)
    next_obs = torch.cat([obs[1:], torch.randn(1, ENVS, 3, generator=generator)])
    terminated = torch.rand(STEPS, ENVS, generator=generator) < 0.1
    truncated = (torch.rand(STEPS, ENVS, generator=generator) < 0.1) & ~terminated
    next_obs[truncated] = torch.randn(int(truncated.sum()), 3, generator=generator)  # final obs
    zeros = torch.zeros(STEPS, ENVS)
    return Trajectory(
        obs,
        torch.rand(STEPS, ENVS, 2, generator=generator) * 2 - 1,
        zeros,
        zeros,
        torch.randn(STEPS, ENVS, generator=generator),
        terminated,
        terminated | truncated,
        zeros,
        next_obs,
    )


def full_state(worker: SACActorWorker) -> dict:
    """Modules and optimizer states, copied."""
    saved = worker.state_dict()
    return copy.deepcopy(
        {
            k: saved[k]
            for k in (
                "policy",
                "critic",
                "critic_target",
                "entropy",
                "critic_optimizer",
                "policy_optimizer",
                "grad_steps",
            )
        }
    )


def train_reference(name: str) -> dict:
    """One process, the whole batches: the result the ranks must reproduce."""
    worker = SACActorWorker(config_for(name), *spaces())
    for batch in make_batches(worker.config):
        worker.learner.update(batch)
    return full_state(worker)


def train_rank(name: str, rank: int, world: int) -> dict:
    config = config_for(name)
    worker = SACActorWorker(config, *spaces(), rank=rank, world_size=world)
    if rank > 0:  # init_distributed must make every module rank 0's
        with torch.no_grad():
            for module in worker.replicated_modules().values():
                for parameter in module.parameters():
                    parameter.add_(0.25)
    worker.init_distributed("127.0.0.1", 0)  # the group exists already: joined, not re-created
    ddp_buffers = sum(1 for path in (worker.learner.critic_path, worker.learner.policy_path) for _ in path.buffers())
    for batch in make_batches(config):
        worker.learner.update(rank_part(batch, rank, world))
    result = {
        "state": full_state(worker),
        "replicas_after_updates": worker.replica_divergence(),
        "ddp_wrapped": type(worker.learner.critic_path).__name__,
        "ddp_buffers": ddp_buffers,
    }
    # the whole train() path: replay shards, sampling per rank, warm-up, UTD, reduced metrics
    metrics = [worker.train(make_trajectory(i).shard(rank, world), 0.0) for i in range(3)]
    worker.verify_replicas()  # raises if any tensor (targets included) differs
    result.update(
        metrics=metrics,
        replicas_after_train=worker.replica_divergence(),
        replay_size=len(worker.replay),
        checkpoint=worker.state_dict(),
    )
    return result

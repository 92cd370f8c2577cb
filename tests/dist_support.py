"""Support for the multi-process actor tests: scenarios, a deterministic trajectory, and the code
each rank runs under `tests.ranks.spawn_ranks` (importable by the spawned processes, unlike a
test module's locals).

A scenario is a config plus a space kind. Every process builds the same trajectories from seeds,
so rank r trains on `trajectory.shard(r, W)` of exactly what the single-process reference trains on.
"""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import numpy as np
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.config.schema import Config
from fleetrl.models.policy import Policy
from fleetrl.net import free_port
from fleetrl.observations import leaf_spaces, map_obs
from fleetrl.plan.load import load_config
from fleetrl.trajectory import Trajectory

STEPS, ENVS = 16, 8  # B = 128 samples per iteration
# adam_eps well above the per-element gradients and a clip norm that only some steps reach: the
# update then depends on the gradient scale (Adam alone is almost scale-invariant), so a wrong
# loss scaling across ranks shows.
BASE = [
    f"env.num_envs={ENVS}",
    f"algorithm.num_steps={STEPS}",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=3",
    "algorithm.lr=0.003",
    "algorithm.max_grad_norm=2.0",
    "actor.adam_eps=0.01",
    "runner.seed=3",
    "actor.dist_timeout_s=30",
]
MLP = ["model.hidden_sizes=[32, 32]"]  # the MLP's own key: another kind of model (model.id) has none
PROGRESS = (0.0, 0.25)  # two iterations: the lr anneals, the generator and Adam carry over

SCENARIOS = {
    # 4 minibatches × 3 epochs, normalised advantages, clipped value loss, entropy bonus
    "ddp": ["algorithm.clip_vloss=true", "algorithm.ent_coef=0.01"],
    # the KL passes target_kl after the first epochs: every rank must stop at the same epoch
    "ddp_target_kl": ["algorithm.lr=0.005", "algorithm.update_epochs=8", "algorithm.target_kl=0.004"],
    # 16 samples per rank and minibatch on average, micro-batches of 4 (some ranks pad)
    "ddp_accumulation": ["actor.micro_batch_size=4"],
    # Gaussian policy (log std parameter), one full-batch minibatch
    "ddp_continuous": ["algorithm.minibatch_size=128", "algorithm.update_epochs=2"],
    "ddp_checkpointing": [
        "actor.gradient_checkpointing=true",
        "actor.micro_batch_size=8",
        "actor.global_batch_size=64",
    ],
    # started from other weights (runner.init_from), held near them by the KL to the reference:
    # each rank runs the reference over its own shard, once an update, in micro-batches
    "ddp_kl_to_reference": [
        "algorithm.kl_coef=0.5",
        "runner.init_from=/nonexistent/fleetrl-run",  # the weights are given by hand (init_from_weights)
        "actor.micro_batch_size=4",
        "algorithm.lr=0.01",
    ],
    "fsdp": ["actor.strategy=fsdp"],
    "fsdp_target_kl_accumulation": [
        "actor.strategy=fsdp",
        "actor.fsdp_sharding_strategy=shard_grad_op",
        "actor.micro_batch_size=4",
        "algorithm.lr=0.005",
        "algorithm.update_epochs=8",
        "algorithm.target_kl=0.004",
    ],
    "fsdp_no_shard": ["actor.strategy=fsdp", "actor.fsdp_sharding_strategy=no_shard"],
    "fsdp_hybrid_shard": ["actor.strategy=fsdp", "actor.fsdp_sharding_strategy=hybrid_shard"],
    "fsdp_continuous_resume": ["actor.strategy=fsdp", "algorithm.ent_coef=0.01"],
    "fsdp_bf16": ["actor.strategy=fsdp", "actor.fsdp_param_dtype=bfloat16", "actor.fsdp_reduce_dtype=float32"],
    "fsdp_bf16_reduce": ["actor.strategy=fsdp", "actor.fsdp_param_dtype=bfloat16", "actor.fsdp_reduce_dtype=bfloat16"],
    "fsdp_cpu_offload": ["actor.strategy=fsdp", "actor.fsdp_cpu_offload=true"],
    "fsdp_checkpointing": ["actor.strategy=fsdp", "actor.gradient_checkpointing=true"],
}
CONTINUOUS = {"ddp_continuous", "fsdp_continuous_resume"}
RESUME = {"fsdp_continuous_resume"}  # rank state loaded from the reference after iteration 1
INIT_FROM = {"ddp_kl_to_reference"}  # load_policy_weights after construction, as runner.init_from
PERTURB = {"ddp"}  # rank > 0 starts from other weights: init_distributed must make them rank 0's


def config_for(name: str) -> Config:
    return load_config(None, BASE + MLP + SCENARIOS[name])


def synthetic_spaces(continuous: bool) -> tuple[gym.Space, gym.Space]:
    """(observation, action) spaces of the synthetic trajectories: 5-D obs and 2-D Box actions,
    or CartPole's shapes."""
    if continuous:
        return (gym.spaces.Box(-np.inf, np.inf, (5,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    return gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)


def spaces(name: str) -> tuple[gym.Space, gym.Space]:
    return synthetic_spaces(name in CONTINUOUS)


def make_trajectory(config: Config, name: str, iteration: int) -> Trajectory:
    return synthetic_trajectory(config, spaces(name), iteration, terminate_p=0.04, truncate_p=0.03)


def synthetic_trajectory(
    config: Config, env_spaces: tuple[gym.Space, gym.Space], iteration: int, terminate_p: float, truncate_p: float
) -> Trajectory:
    """Synthetic but shaped like a collect: actions, log-probs (per token for token policies) and
    values come from the initial policy on the observations, rewards and episode ends are random.
    Identical in every process."""
    observation_space, action_space = env_spaces
    torch.manual_seed(config.runner.seed)
    policy = Policy.from_config(config.model, observation_space, action_space)
    generator = torch.Generator().manual_seed(1000 + iteration)
    steps, envs = config.algorithm.num_steps, config.env.num_envs
    obs = random_obs(observation_space, (steps, envs), generator)
    torch.manual_seed(2000 + iteration)
    actions, logprobs, values = policy.act(map_obs(lambda x: x.flatten(0, 1), obs))
    actions = actions.reshape(steps, envs, *actions.shape[1:])
    logprobs, values = logprobs.reshape(steps, envs, *logprobs.shape[1:]), values.reshape(steps, envs)
    rewards = 1.0 + 0.5 * torch.randn(steps, envs, generator=generator)
    terminated = torch.rand(steps, envs, generator=generator) < terminate_p
    dones = terminated | (torch.rand(steps, envs, generator=generator) < truncate_p)
    last = policy.value(random_obs(observation_space, (envs,), generator))
    next_values = torch.cat([values[1:], last[None]])
    return Trajectory(obs, actions, logprobs, values, rewards, terminated, dones, next_values)


def random_obs(space: gym.Space, leading: tuple, generator: torch.Generator):
    """Observations of `space` with leading axes `leading`, per key for a Dict: standard normal
    floats, uint8 pixels in 0..10 (a MiniGrid view's range), token ids (0 the padding)."""

    def leaf(box: gym.spaces.Box) -> torch.Tensor:
        shape = (*leading, *box.shape)
        if box.dtype == np.uint8:
            return torch.randint(0, 11, shape, generator=generator, dtype=torch.uint8)
        if np.dtype(box.dtype).kind in "iu":
            return torch.randint(0, int(box.high.max()) + 1, shape, generator=generator)
        return torch.randn(shape, generator=generator)

    return map_obs(leaf, leaf_spaces(space))


def init_from_weights(name: str) -> dict:
    """Weights of the scenario's policy other than the seeded ones: what runner.init_from would load."""
    torch.manual_seed(11)
    return Policy.from_config(config_for(name).model, *spaces(name)).state_dict()


def train_reference(name: str, iterations: int = len(PROGRESS)) -> dict:
    """One process, the whole trajectory: the result the ranks must reproduce."""
    config = config_for(name)
    worker = ActorWorker(config, *spaces(name))
    if name in INIT_FROM:
        worker.load_policy_weights(init_from_weights(name))
    initial = worker.policy_weights()
    metrics, states = [], []
    for iteration in range(iterations):
        metrics.append(worker.train(make_trajectory(config, name, iteration), PROGRESS[iteration]))
        states.append(copy.deepcopy(worker.state_dict()))
    return {
        "initial": initial,
        "metrics": metrics,
        "state": states[-1],
        "states": states,
        "weights": worker.policy_weights(),
    }


def train_rank(name: str, rank: int, world: int) -> dict:
    config = config_for(name)
    worker = ActorWorker(config, *spaces(name), rank=rank, world_size=world)
    if name in PERTURB and rank > 0:
        with torch.no_grad():
            for parameter in worker.policy.parameters():
                parameter.add_(0.1)
    worker.init_distributed("127.0.0.1", 0)  # the group exists already: joined, not re-created
    if name in INIT_FROM:  # after joining, as the controller loads runner.init_from
        worker.load_policy_weights(init_from_weights(name))
    initial = worker.policy_weights()  # collective under FSDP
    first = 0
    metrics = []
    if name in RESUME:
        worker.load_state_dict(train_reference(name, 1)["state"])  # every rank gets the full state
        first = 1
    for iteration in range(first, len(PROGRESS)):
        metrics.append(worker.train(make_trajectory(config, name, iteration).shard(rank, world), PROGRESS[iteration]))
    return {
        "initial": initial,
        "metrics": metrics,
        "state": worker.state_dict(),
        "weights": worker.policy_weights(),
        "replicas": worker.replica_divergence(),
        "local": {k: v.detach().clone() for k, v in worker.policy.state_dict().items()}
        if worker.loss_path.strategy == "ddp"
        else None,
    }


def lonely_rank(rank: int, world: int, timeout_s: float) -> dict:
    """Rank 0 of 2, but rank 1 never comes: joining must fail after ~timeout_s, not hang."""
    config = load_config(None, BASE + MLP + [f"actor.dist_timeout_s={timeout_s}"])
    worker = ActorWorker(config, *spaces("ddp"), rank=0, world_size=2)
    started = time.perf_counter()
    try:
        worker.init_distributed("127.0.0.1", free_port())
        outcome = "joined"
    except Exception as error:  # noqa: BLE001 - the test inspects what was raised
        outcome = f"{type(error).__name__}: {error}"
    elapsed = time.perf_counter() - started
    worker.close()
    return {"outcome": outcome, "seconds": elapsed}

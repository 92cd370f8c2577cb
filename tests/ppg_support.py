"""Code the spawned ranks of tests/test_ppg.py and tests/test_token_policy.py run under
`tests.ranks.spawn_ranks` (importable by spawned processes): PPG, token-policy and GRPO scenarios
on synthetic trajectories and the single-process reference.

Like tests/dist_support.py, every process builds the same trajectories from seeds, so rank r
trains on `trajectory.shard(r, W)` of exactly what the single-process reference trains on.
"""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import torch
from torch import nn

from fleetrl.algos.registry import algorithm_spec
from fleetrl.config.schema import Config
from fleetrl.plan.load import load_config
from fleetrl.trajectory import Trajectory
from tests.dist_support import BASE, MLP, synthetic_spaces, synthetic_trajectory

PPG = [
    "algorithm.name=ppg",
    "algorithm.n_pi=2",
    "algorithm.aux_epochs=2",
    "algorithm.aux_minibatch_size=64",
    "algorithm.ent_coef=0.01",
]
SCENARIOS = {
    # policy phase (4 minibatches × 3 epochs) then the auxiliary phase (2 epochs × 4 minibatches
    # of 64 over 2 iterations' data), twice
    "ppg": PPG,
    # Gaussian policy (the KL term involves log_std), gradient accumulation in both phases
    "ppg_continuous_accumulation": PPG + ["actor.micro_batch_size=8", "algorithm.aux_minibatch_size=32"],
    # token policy: per-token ratios in the policy phase, the tokens' joint KL in the aux phase
    "ppg_tokens": PPG + ["model.action_bins=5", "algorithm.logprob_type=token_level"],
    # ranks resume mid-phase from the single-process checkpoint of iteration 1 (stored data inside)
    "ppg_resume": PPG,
    "ppo_tokens_token_level": [
        "model.action_bins=7",
        "algorithm.logprob_type=token_level",
        "algorithm.entropy_type=token_level",
        "algorithm.ent_coef=0.01",
    ],
    "ppo_tokens_action_level": ["model.action_bins=7", "algorithm.ent_coef=0.01"],
    "ppo_grpo": ["algorithm.adv_type=grpo", "algorithm.group_size=2", "algorithm.norm_adv=false"],
    "fsdp_tokens_token_level": [
        "actor.strategy=fsdp",
        "model.action_bins=7",
        "algorithm.logprob_type=token_level",
        "algorithm.entropy_type=token_level",
        "algorithm.ent_coef=0.01",
    ],
    # many iterations: 36 policy iterations, 12 auxiliary phases, accumulation — must not stall
    "ppg_many": PPG
    + ["algorithm.n_pi=3", "actor.micro_batch_size=8", "algorithm.update_epochs=2", "algorithm.aux_epochs=1"],
}
CONTINUOUS = {
    "ppg_continuous_accumulation",
    "ppg_tokens",
    "ppo_tokens_token_level",
    "ppo_tokens_action_level",
    "fsdp_tokens_token_level",
}
RESUME = {"ppg_resume"}
PROGRESS = (0.0, 0.1, 0.2, 0.3)  # 4 iterations: two full PPG cycles with n_pi = 2
MANY = 36


def config_for(name: str, extra: list[str] = (), model: list[str] = MLP) -> Config:
    """Scenario `name`'s config; `model`: the model section's keys (the MLP of dist_support's)."""
    return load_config(None, BASE + model + SCENARIOS[name] + list(extra))


def progress_for(name: str) -> tuple:
    return tuple(i / (MANY + 1) for i in range(MANY)) if name == "ppg_many" else PROGRESS


def spaces(name: str) -> tuple[gym.Space, gym.Space]:
    return synthetic_spaces(name in CONTINUOUS)


def make_trajectory(config: Config, name: str, iteration: int) -> Trajectory:
    return synthetic_trajectory(config, spaces(name), iteration, terminate_p=0.1, truncate_p=0.05)


def build_worker(name: str, rank: int = 0, world: int = 1, extra: list[str] = (), model: list[str] = MLP):
    config = config_for(name, extra, model)
    return config, algorithm_spec(config.algorithm.name).actor_class()(config, *spaces(name), rank, world)


def train_reference(name: str, iterations: int | None = None) -> dict:
    """One process, the whole trajectory: what the ranks must reproduce."""
    config, worker = build_worker(name)
    progress = progress_for(name)
    metrics, states = [], []
    for iteration in range(iterations or len(progress)):
        metrics.append(worker.train(make_trajectory(config, name, iteration), progress[iteration]))
        states.append(copy.deepcopy(worker.state_dict()))
    return {"metrics": metrics, "states": states, "weights": worker.policy_weights()}


def train_rank(name: str, rank: int, world: int) -> dict:
    config, worker = build_worker(name, rank, world)
    worker.init_distributed("127.0.0.1", 0)  # the group exists already: joined
    progress = progress_for(name)
    first, metrics, states = 0, [], []
    if name in RESUME:
        worker.load_state_dict(train_reference(name, 1)["states"][0])
        first = 1
    for iteration in range(first, len(progress)):
        metrics.append(worker.train(make_trajectory(config, name, iteration).shard(rank, world), progress[iteration]))
        if iteration < 3:
            states.append(copy.deepcopy(worker.state_dict()))  # collective for PPG: gathers the stored data
    result = {
        "metrics": metrics,
        "states": states,
        "weights": worker.policy_weights(),
        "divergence": worker.replica_divergence(),
    }
    if config.algorithm.name == "ppg":
        policy_ddp, aux_ddp = worker.loss_path.module, worker.aux_path.module
        result["wrapped"] = {
            "policy": sorted(
                n for n, p in policy_ddp.module.named_parameters() if any(p is q for q in policy_ddp._module_parameters)
            ),
            "aux": sorted(
                n for n, p in aux_ddp.module.named_parameters() if any(p is q for q in aux_ddp._module_parameters)
            ),
            "unused": worker.unused,
        }
    return result


class NetWithDeadParameter(nn.Module):
    """An actor-critic exposing its policy features (PPG adds its auxiliary head on them), with
    one parameter no loss ever uses."""

    policy_features_size = 16

    def __init__(self, observation_space, num_action_params):
        super().__init__()
        self.body = nn.Linear(observation_space.shape[0], 16)
        self.pi, self.v = nn.Linear(16, num_action_params), nn.Linear(16, 1)
        self.dead = nn.Parameter(torch.zeros(3))

    def forward(self, obs):
        return self.forward_features(obs)[:2]

    def forward_features(self, obs):
        h = torch.tanh(self.body(obs))
        return self.pi(h), self.v(h).squeeze(-1), h


def dead_parameter_rank(rank: int, world: int) -> dict:
    """Build a PPG worker whose network has a parameter neither phase uses: it must be named."""
    started = time.perf_counter()
    try:
        _, worker = build_worker("ppg", rank, world, model=["model.id=tests.ppg_support:NetWithDeadParameter"])
        worker.init_distributed("127.0.0.1", 0)
        outcome = "built"
    except Exception as error:  # noqa: BLE001 - the test inspects it
        outcome = f"{type(error).__name__}: {error}"
    return {"outcome": outcome, "seconds": time.perf_counter() - started}


def train_scenario(name: str, rank: int, world: int) -> dict:
    """One rank's part of a named scenario (`tests.ranks.each_scenario` runs them in turn)."""
    return dead_parameter_rank(rank, world) if name == "dead_parameter" else train_rank(name, rank, world)

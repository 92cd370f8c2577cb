"""Support for tests/test_fsdp_transformer.py: the built-in transformer policy on MiniGrid-shaped
Dict observations (a 7×7×3 uint8 view, one token per cell; 5 instruction tokens; a direction
vector), trained by `ActorWorker`s with `actor.strategy: fsdp` in the ranks that
`tests.ranks.spawn_ranks` starts, and by one process as the reference.

The trajectories and hyperparameters are those of `tests.dist_support` (the MLP's equivalence
tests), so the claims are the same ones: rank r trains on its env columns of exactly what the
single process trains on. For CI's budget the model is small (width 16, 2 blocks) and an
iteration is one epoch of 4 minibatches (4 optimizer steps); every block parameter's first
dimension is even, so 2 ranks hold exactly half of each. Scenario `dict_blocks` trains a user
network (`DictBlocksNet`) instead, whose blocks sit in ModuleDicts, and `mlp_bf16` the built-in
MLP over the same observations (its encoders: a CNN, a GRU) in bfloat16.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.config.schema import Config
from fleetrl.observations import map_obs
from fleetrl.plan.load import load_config
from fleetrl.probe import flight_recorder
from tests.dist_support import BASE, MLP, PROGRESS, synthetic_trajectory

VOCABULARY = 9  # mission token ids 1..9, 0 the padding
SPACES = (
    gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
        mission=gym.spaces.Box(0, VOCABULARY, (5,), np.int64),
        direction=gym.spaces.Box(0.0, 1.0, (4,), np.float32),
    ),
    gym.spaces.Discrete(3),
)
TRANSFORMER = ["model.id=transformer", "model.embed_dim=16", "model.num_heads=2", "model.num_layers=2"]
UPDATES = ["algorithm.update_epochs=1"]  # 4 minibatches (optimizer steps) per iteration
# compute in bfloat16, reduce gradients in float32
BFLOAT16 = ["actor.strategy=fsdp", "actor.fsdp_param_dtype=bfloat16", "actor.fsdp_reduce_dtype=float32"]
SCENARIOS = {
    "f32": ["actor.strategy=fsdp"],
    "checkpointing_offload": [
        "actor.strategy=fsdp",
        "actor.gradient_checkpointing=true",
        "actor.fsdp_cpu_offload=true",
    ],
    "bf16": BFLOAT16,
    "dict_blocks": ["actor.strategy=fsdp"],
    "mlp_bf16": BFLOAT16,
}
# iterations per scenario (f32: a checkpoint between the two)
ITERATIONS = {
    "f32": 2,
    "checkpointing_offload": 1,
    "bf16": 1,
    "dict_blocks": 1,
    "mlp_bf16": 1,
}
MODELS = {  # the others: TRANSFORMER
    "dict_blocks": ["model.id=tests.fsdp_transformer_ranks:DictBlocksNet"],
    "mlp_bf16": ["model.id=mlp", *MLP],  # the grid CNN on the image, a GRU on the mission, then the MLP
}
# The units each scenario's network is sharded into, by their names in it (the Policy is the root).
UNITS = {
    "dict_blocks": ("blocks.embed", "blocks.hidden", "heads.pi", "heads.v"),
    "mlp_bf16": ("encoder", "trunk.0", "trunk.1", "policy_head", "value_head"),
    **{name: ("blocks.0", "blocks.1") for name in ("f32", "checkpointing_offload", "bf16")},
}


class DictBlocksNet(nn.Module):
    """A user network (`model.id: module:attr`) whose blocks and heads sit in ModuleDicts (which
    have no forward of their own: the network calls `self.blocks["embed"]`), with a
    ParameterDict beside them."""

    def __init__(self, observation_space: gym.spaces.Dict, num_action_params: int):
        super().__init__()
        inputs = int(np.prod(observation_space["image"].shape)) + observation_space["direction"].shape[0]
        self.blocks = nn.ModuleDict({"embed": nn.Linear(inputs, 16), "hidden": nn.Linear(16, 16)})
        self.heads = nn.ModuleDict({"pi": nn.Linear(16, num_action_params), "v": nn.Linear(16, 1)})
        self.scales = nn.ParameterDict({"hidden": nn.Parameter(torch.ones(16))})

    def forward(self, obs: dict):
        x = torch.cat([obs["image"].flatten(1).float() / 255, obs["direction"]], dim=1)
        x = torch.tanh(self.blocks["hidden"](torch.tanh(self.blocks["embed"](x))) * self.scales["hidden"])
        return self.heads["pi"](x), self.heads["v"](x).squeeze(-1)


def config_for(name: str) -> Config:
    """The scenario's config (one process ignores the fsdp_* keys: nothing to shard)."""
    return load_config(None, BASE + MODELS.get(name, TRANSFORMER) + UPDATES + SCENARIOS[name])


def trajectory(config: Config, iteration: int):
    return synthetic_trajectory(config, SPACES, iteration, terminate_p=0.04, truncate_p=0.03)


def train(worker: ActorWorker, config: Config, iterations: range, rank: int = 0, world: int = 1) -> list[dict]:
    return [worker.train(trajectory(config, i).shard(rank, world), PROGRESS[i]) for i in iterations]


def train_reference(name: str, iterations: int) -> dict:
    """One process, the whole trajectories: its state after each iteration, and the metrics."""
    config = config_for(name)
    worker = ActorWorker(config, *SPACES)
    states, metrics = [], []
    for iteration in range(iterations):
        metrics += train(worker, config, range(iteration, iteration + 1))
        states.append(copy.deepcopy(worker.state_dict()))
    return {"states": states, "metrics": metrics}


def sharded_worker(name: str, rank: int, world: int) -> ActorWorker:
    worker = ActorWorker(config_for(name), *SPACES, rank=rank, world_size=world)
    worker.init_distributed("127.0.0.1", 0)  # the group exists already: joined, not re-created
    return worker


def shard_shapes(worker: ActorWorker, name: str) -> dict:
    """Per unit (each of the scenario's `UNITS`, then the root's own parameters): whether it is
    an FSDP module, and each parameter's (shape on this rank, full shape)."""
    from torch.distributed.fsdp import FSDPModule

    policy = worker.policy
    units = {unit: policy.network.get_submodule(unit) for unit in UNITS[name]}
    in_blocks = {id(p) for block in units.values() for p in block.parameters()}
    shapes = {
        unit: {
            "fsdp": isinstance(block, FSDPModule),
            "params": {n: (tuple(p.to_local().shape), tuple(p.shape)) for n, p in block.named_parameters()},
        }
        for unit, block in units.items()
    }
    shapes["root"] = {
        "fsdp": isinstance(policy, FSDPModule),
        "params": {
            n: (tuple(p.to_local().shape), tuple(p.shape))
            for n, p in policy.named_parameters()
            if id(p) not in in_blocks
        },
    }
    return shapes


def probe_step(worker: ActorWorker, config: Config) -> dict:
    """One forward and backward through the loss path under a real flight recorder: the dtypes
    each FSDP all-gather and reduce-scatter carried, and the dtype block 0's first linear layer
    computed in (its weight and its input, while it ran)."""
    recorder = flight_recorder.Recorder("actor", worker.rank, 0)
    compute = {}

    def record_compute(module, args):
        compute.update(weight=str(module.weight.dtype), input=str(args[0].dtype))

    hook = worker.policy.network.blocks[0].linear1.register_forward_pre_hook(record_compute)
    batch = trajectory(config, 0).shard(worker.rank, worker.world_size)
    obs = map_obs(lambda x: x[0], batch.obs)  # the first step's envs
    flight_recorder.install(recorder)
    try:
        logprob, entropy, value, _ = worker.loss_path.module(obs, batch.actions[0])
        (logprob.sum() + entropy.sum() + value.sum()).backward()
    finally:
        flight_recorder.install(None)
        hook.remove()
    worker.optimizer.zero_grad()
    fsdp = [e for e in recorder.collectives.record()["collectives"]["recent"] if "(fsdp)" in e["op"]]
    return {"collectives": [(e["op"], e["dtypes"]) for e in fsdp], "compute": compute}


def train_rank(name: str, rank: int, world: int) -> dict:
    """The scenario's ITERATIONS on this rank's shards, and the sharding of each unit; for `f32`
    the checkpoint between its iterations and the runs resumed from it (`resume`); for `f32` and
    `bf16` one probed step."""
    config = config_for(name)
    worker = sharded_worker(name, rank, world)
    result = {"shapes": shard_shapes(worker, name), "metrics": train(worker, config, range(1), rank, world)}
    if ITERATIONS[name] == 2:
        result["checkpoint"] = worker.state_dict()
        result["metrics"] += train(worker, config, range(1, 2), rank, world)
    result.update(state=worker.state_dict(), weights=worker.policy_weights())
    if name in ("f32", "bf16"):
        result["probe"] = probe_step(worker, config)
    if name == "f32":
        result.update(resume(result["checkpoint"], rank, world))
    return result


def broadcast(value, rank: int):
    """Rank 0's `value` on every rank (a full state, which only rank 0 holds after gathering)."""
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def resume(checkpoint: dict, rank: int, world: int) -> dict:
    """Iteration 1 again, by fresh workers of these ranks: `resumed` from the ranks' own
    checkpoint of iteration 0, `from_one` from one process's."""
    config = config_for("f32")
    result = {}
    for key, saved in (("resumed", broadcast(checkpoint, rank)), ("from_one", train_reference("f32", 1)["states"][0])):
        worker = sharded_worker("f32", rank, world)
        worker.load_state_dict(saved)  # every rank is given the full state
        metrics = train(worker, config, range(1, 2), rank, world)
        result[key] = {"metrics": metrics, "state": worker.state_dict()}
    return result

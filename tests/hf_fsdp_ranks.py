"""Support for tests/test_hf_fsdp.py: a Hugging Face PaliGemma (`tests.hf_models`) trained by
`ActorWorker`s with `actor.strategy: fsdp` in the ranks `tests.ranks.spawn_ranks` starts, on
the MiniGrid-shaped observations and synthetic trajectories of `tests.fsdp_transformer_ranks`,
and by one process as the reference; sharded (DCP) checkpoints written and read across world
sizes through a folder the test gives every rank.

Scenarios:
  hf_f32   float32: the units, one iteration; a DCP checkpoint after it (`two_ranks.dcp`), read
           back by fresh workers of these ranks and trained on; the checkpoint the test wrote
           from one process (`one_rank.dcp`) read by these ranks and trained on
  hf_bf16  bfloat16 compute, float32 reduction, activation checkpointing per layer, CPU offload
"""

from __future__ import annotations

import copy
from pathlib import Path

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.config.schema import Config
from fleetrl.plan.load import load_config
from tests.dist_support import BASE, PROGRESS
from tests.fsdp_transformer_ranks import SPACES, trajectory

HF = ["model.id=tests.hf_models:PaliGemmaNet", "algorithm.update_epochs=1"]
SCENARIOS = {
    "hf_f32": ["actor.strategy=fsdp"],
    "hf_bf16": [
        "actor.strategy=fsdp",
        "actor.fsdp_param_dtype=bfloat16",
        "actor.fsdp_reduce_dtype=float32",
        "actor.gradient_checkpointing=true",
        "actor.fsdp_cpu_offload=true",
    ],
}
# PaliGemma's _no_split_modules, as they sit in the network: SigLIP's embeddings and encoder
# layers, the projector, Gemma's decoder layers
UNITS = (
    "vlm.model.vision_tower.embeddings",
    "vlm.model.vision_tower.encoder.layers.0",
    "vlm.model.vision_tower.encoder.layers.1",
    "vlm.model.multi_modal_projector",
    "vlm.model.language_model.layers.0",
    "vlm.model.language_model.layers.1",
)


def config_for(name: str) -> Config:
    return load_config(None, BASE + HF + SCENARIOS[name])


def train(worker: ActorWorker, config: Config, iteration: int, rank: int = 0, world: int = 1) -> dict:
    return worker.train(trajectory(config, iteration).shard(rank, world), PROGRESS[iteration])


def train_reference(name: str, folder: Path | None = None) -> dict:
    """One process: iterations 0 and 1, the state after each; with `folder`, the DCP checkpoint
    after iteration 0 written there (`one_rank.dcp`)."""
    config = config_for(name)
    worker = ActorWorker(config, *SPACES)
    states, metrics = [], []
    for iteration in range(2):
        metrics.append(train(worker, config, iteration))
        states.append(copy.deepcopy(worker.state_dict()))
        if iteration == 0 and folder is not None:
            worker.save_sharded(str(folder / "one_rank.dcp"))
    return {"states": states, "metrics": metrics}


def sharded_worker(name: str, rank: int, world: int) -> ActorWorker:
    worker = ActorWorker(config_for(name), *SPACES, rank=rank, world_size=world)
    worker.init_distributed("127.0.0.1", 0)
    return worker


def units(worker: ActorWorker) -> dict:
    """Each FSDP unit below the root, by its name in the network: its parameters' (local, full) shapes."""
    from torch.distributed.fsdp import FSDPModule

    network = worker.policy.network
    return {
        name: {n: (tuple(p.to_local().shape), tuple(p.shape)) for n, p in module.named_parameters()}
        for name, module in network.named_modules()
        if isinstance(module, FSDPModule)
    }


def compute_dtypes(worker: ActorWorker, config: Config) -> dict:
    """The dtype Gemma's first decoder layer computed in (its q_proj's weight and input)."""
    seen = {}
    layer = worker.policy.network.vlm.model.language_model.layers[0].self_attn.q_proj
    hook = layer.register_forward_pre_hook(
        lambda module, args: seen.update(weight=str(module.weight.dtype), input=str(args[0].dtype))
    )
    batch = trajectory(config, 0).shard(worker.rank, worker.world_size)
    try:
        worker.loss_path.module({k: v[0] for k, v in batch.obs.items()}, batch.actions[0])
    finally:
        hook.remove()
    return seen


def train_rank(name: str, rank: int, world: int, folder: str) -> dict:
    config = config_for(name)
    worker = sharded_worker(name, rank, world)
    result = {"units": units(worker), "metrics": [train(worker, config, 0, rank, world)]}
    if name == "hf_bf16":
        result.update(state=worker.state_dict(), compute=compute_dtypes(worker, config))
        return result
    folder = Path(folder)
    # the rest of the state (the minibatch generator's) is the same on every rank and in one process
    rest = worker.save_sharded(str(folder / "two_ranks.dcp"))
    result["metrics"].append(train(worker, config, 1, rank, world))
    result["state"] = worker.state_dict()
    result["patch"] = worker.trainable_weights()  # gathered like the full weights, trainable ones only
    for key, checkpoint in (("resumed", "two_ranks.dcp"), ("from_one", "one_rank.dcp")):
        fresh = sharded_worker(name, rank, world)
        fresh.load_state_dict({**rest, "shards_path": str(folder / checkpoint)})
        result[key] = {"metrics": [train(fresh, config, 1, rank, world)], "state": fresh.state_dict()}
    return result

"""Parameters + optimizer state per actor rank: one rank against 2 FSDP ranks (`actor.strategy:
fsdp`, full_shard), for the transformer of configs/ppo_minigrid_transformer.yaml and for wider,
deeper variants of it where sharding matters, and for a Hugging Face PaliGemma on the same
observations (`tests.hf_models`: tiny, and wider), sharded into its `_no_split_modules`.

Each rank is a spawned process that joins a Gloo group on 127.0.0.1 exactly as fleetrl's actor
ranks do (`ActorWorker.init_distributed`), takes one optimizer step (Adam's moments exist only
after it), and counts the bytes of the tensors it holds: its parameters (its shards, under FSDP)
and its optimizer state (likewise). The ratio 2 ranks / 1 rank is the largest rank's bytes over
the single process's: 0.5 is a perfect split; rows whose first dimensions do not halve exactly
(torch.chunk's split) or that hold a few unsharded scalars (Adam's step) sit slightly above.
Bytes, not RSS: the allocator and torch's own footprint are the same for every row and would
hide the model.

    python benchmarks/costs/fsdp_memory.py            # ~1 min on 2 loaded cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import queue as queue_module
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, log, results_dir  # noqa: E402

sys.path.insert(0, str(ROOT))  # this checkout's fleetrl, whichever one is installed (spawned ranks inherit it)

CONFIG = ROOT / "configs" / "ppo_minigrid_transformer.yaml"
MODELS = {  # row → model overrides of the config
    "config (embed 64, 2 blocks)": [],
    "embed 256, 4 blocks": ["model.embed_dim=256", "model.num_layers=4", "model.num_heads=8"],
    "embed 512, 8 blocks": ["model.embed_dim=512", "model.num_layers=8", "model.num_heads=8"],
    # a Hugging Face PaliGemma (SigLIP + Gemma, random weights; units: its _no_split_modules)
    # (the whole model section: the transformer's keys in the config are no keys of a custom network)
    "PaliGemma tiny (width 16, 2+2 layers)": ["model={id: tests.hf_models:PaliGemmaNet}"],
    "PaliGemma width 256, 4+4 layers": ["model={id: tests.hf_models:PaliGemmaNet, kwargs: {width: 256, layers: 4}}"],
}
BATCH = 32  # samples in the one optimizer step


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds for `tensor`: its local shard for a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def measure(overrides: list[str], rank: int, world: int, port: int) -> dict:
    """One rank's parameter and optimizer-state bytes after one optimizer step."""
    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.envs.make import env_factory
    from fleetrl.observations import stack_obs
    from fleetrl.plan.load import load_config

    torch.set_num_threads(1)
    config = load_config(str(CONFIG), ["actor.strategy=fsdp", *overrides])
    env = env_factory(config.env)()
    spaces = (env.observation_space, env.action_space)
    env.observation_space.seed(rank)
    obs = {k: torch.as_tensor(v) for k, v in stack_obs(env.observation_space.sample() for _ in range(BATCH)).items()}
    actions = torch.as_tensor([env.action_space.sample() for _ in range(BATCH)])
    env.close()
    worker = ActorWorker(config, *spaces, rank=rank, world_size=world)
    worker.init_distributed("127.0.0.1", port)  # one rank: nothing to join, nothing to shard
    logprob, entropy, value = worker.loss_path.module(obs, actions)
    (logprob.mean() + entropy.mean() + value.pow(2).mean()).backward()
    worker.optimizer.step()
    parameters = sum(tensor_bytes(p) for p in worker.policy.parameters())
    optimizer = sum(
        tensor_bytes(value)
        for moments in worker.optimizer.state.values()
        for value in moments.values()
        if isinstance(value, torch.Tensor)
    )
    result = {"parameters": parameters, "optimizer": optimizer, "sharded": worker.sharded}
    worker.close()
    return result


def rank_main(overrides: list[str], rank: int, world: int, port: int, queue) -> None:
    queue.put((rank, measure(overrides, rank, world, port)))


def run_ranks(overrides: list[str], world: int, timeout_s: float = 300) -> list[dict]:
    """`measure` in `world` spawned processes. Bounded: a rank that dies or stalls fails the run
    (after every rank is killed) instead of leaving it waiting."""
    from fleetrl.net import free_port

    context = multiprocessing.get_context("spawn")
    queue, port = context.Queue(), free_port()
    processes = [context.Process(target=rank_main, args=(overrides, r, world, port, queue)) for r in range(world)]
    for process in processes:
        process.start()
    results, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(results) < world:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in processes):
                codes = [p.exitcode for p in processes]
                raise RuntimeError(f"{overrides}, {world} ranks: exit codes {codes} (None: still running)")
            with contextlib.suppress(queue_module.Empty):
                rank, result = queue.get(timeout=1)
                results[rank] = result
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    return [results[rank] for rank in range(world)]


def megabytes(rank: dict) -> str:
    return f"{rank['parameters'] / 2**20:.3f} + {rank['optimizer'] / 2**20:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="rows whose name contains this (default: all)")
    args = parser.parse_args()
    rows = []
    for name, overrides in MODELS.items():
        if args.only not in name:
            continue
        log(f"{name}: 1 rank, then 2 FSDP ranks")
        (one,) = run_ranks(overrides, 1)
        two = run_ranks(overrides, 2)
        assert not one["sharded"] and all(rank["sharded"] for rank in two)
        total = [r["parameters"] + r["optimizer"] for r in (one, *two)]
        rows.append({"model": name, "one": one, "two": two, "ratio": max(total[1:]) / total[0]})
    print("| model | 1 rank: params + optimizer MB | 2 FSDP ranks: rank 0, rank 1 MB | ratio (largest rank / 1 rank) |")
    print("|---|---|---|---|")
    for row in rows:
        one, (rank0, rank1) = row["one"], row["two"]
        print(f"| {row['model']} | {megabytes(one)} | {megabytes(rank0)}; {megabytes(rank1)} | {row['ratio']:.3f} |")
    (results_dir("fsdp_memory") / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Data-parallel scaling: PPO on HalfCheetah-v5, 2 actor ranks (each with its own rollout and env
worker, Ray backend, 1 node x 2 slots) against 1 rank (inline), at the same global batch
(configs/ppo_halfcheetah.yaml: 4 envs x 512 steps = 2048 samples, minibatch 64 over all ranks).
The 2 ranks run as 6 Ray actors (one per component and rank), or fused (cluster.fuse_collocated:
one process per rank); 1 fused rank on Ray separates the cost of hosting from the cost of DDP.

Throughput = env steps / training seconds (metrics.jsonl `global_step` over `wall_s`) after the
first --warmup iterations; per-phase medians per iteration (`time_collect_s`, `time_update_s`,
`time_weight_sync_s`). The variants alternate order each repetition. Beside it, the latency of a
Gloo all-reduce between 2 local processes: 10k and 1M float32 after a barrier (the floor), and the
policy's gradient size back to back, as DDP issues it once per minibatch.

    .venv/bin/python benchmarks/scaling/data_parallel.py [--reps 2] [--steps 40960] [--warmup 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_halfcheetah.yaml"
COMMON = ["runner.checkpoint_interval=100000", "runner.log_interval=1000"]
VARIANTS = {
    "1 rank, inline": ["cluster.backend=inline"],
    "2 ranks, Ray (1 node x 2 slots)": [
        "cluster.backend=ray",
        "cluster.num_nodes=1",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
    ],
    "2 ranks, Ray fused": [
        "cluster.backend=ray",
        "cluster.num_nodes=1",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
        "cluster.fuse_collocated=true",
    ],
    "1 rank, Ray fused": [
        "cluster.backend=ray",
        "cluster.num_nodes=1",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, env: 0, rollout: 0}",
        "cluster.fuse_collocated=true",
    ],
}


# ---------------------------------------------------------------- Gloo all-reduce latency


def _allreduce_worker(rank: int, port: int, sizes: list[int], loop_size: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # this child only: 127.0.0.1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for size in sizes:
        tensor = torch.ones(size)
        repeats = 400 if size <= 100_000 else 40
        for _ in range(10):
            dist.all_reduce(tensor)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - t0)
        out[size] = statistics.median(times)
    tensor = torch.ones(loop_size)
    started = time.perf_counter()
    for _ in range(400):  # no barrier: ranks arrive as they come, as in a training loop
        dist.all_reduce(tensor)
    out["back_to_back"] = (time.perf_counter() - started) / 400
    dist.destroy_process_group()
    if rank == 0:
        queue.put(out)


def gloo_allreduce(loop_size: int, sizes=(10_000, 1_000_000)) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, port, list(sizes), loop_size, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return result


def model_floats() -> int:
    """Parameters of the config's policy (what DDP all-reduces every minibatch)."""
    import gymnasium as gym

    from fleetrl.models.policy import Policy
    from fleetrl.plan.load import load_config

    cfg = load_config(kit.ROOT / CONFIG)
    env = gym.make("HalfCheetah-v5")
    policy = Policy.from_config(cfg.model, env.observation_space, env.action_space)
    env.close()
    return sum(p.numel() for p in policy.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40960)
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the throughput")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("scaling_halfcheetah")
    overrides = {name: [*COMMON, f"runner.total_env_steps={args.steps}", *extra] for name, extra in VARIANTS.items()}
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    floats = model_floats()
    gloo = [gloo_allreduce(floats)]
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for rep in range(args.reps):  # one repetition at a time, a Gloo measurement between them
        for name, rs in kit.run_interleaved(
            CONFIG,
            {n: overrides[n] for n in (list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS)))},
            1,
            out / f"rep{rep}",
            args.warmup,
        ).items():
            runs[name].extend(rs)
        gloo.append(gloo_allreduce(floats))
    kit.write_json(
        out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "gloo": gloo, "runs": runs}
    )
    print_tables(info, args, runs, gloo, threads, floats, out)


def print_tables(info, args, runs, gloo, threads, floats, out) -> None:
    base_name = next(iter(VARIANTS))
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/data_parallel.py --reps {args.reps} --steps {args.steps} "
        f"--warmup {args.warmup}`; runs `fleetrl train {CONFIG} {' '.join(COMMON)} "
        f"runner.total_env_steps={args.steps} runner.tensorboard=false <variant> --skip-doctor`; raw: "
        f"`{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    print(kit.throughput_table(runs, threads, base_name))
    print()
    print(
        f"Gloo all-reduce, 2 spawned local processes on 127.0.0.1 (1 torch thread each), {len(gloo)} "
        f"measurements interleaved with the runs; the policy has {floats:,} parameters (one DDP bucket "
        f"per minibatch step):\n"
    )
    print("| floats | how | latency (median of measurements) | range |")
    print("|---|---|---|---|")
    for size, how in (
        (10_000, "after a barrier, median op"),
        (1_000_000, "after a barrier, median op"),
        ("back_to_back", "back to back, mean op"),
    ):
        values = [g[size] * 1e3 for g in gloo]
        label = f"{floats:,}" if size == "back_to_back" else f"{size:,}"
        print(f"| {label} | {how} | {kit.median(values):.3f} ms | {kit.spread(values)} ms |")


if __name__ == "__main__":
    main()

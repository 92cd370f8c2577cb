"""PPG vs PPO on CartPole-v1, and what PPG's auxiliary phase costs under 2-rank DDP.

(A) Sample efficiency: `fleetrl train configs/ppo_cartpole.yaml` and `configs/ppg_cartpole.yaml`
    (the same policy phase; PPG adds an auxiliary phase every n_pi = 32 iterations) for each seed,
    both inline, each stopping once the mean return of its last 100 episodes reaches --target
    (475) or at the configs' 200k-step budget. Reported: env steps to the target (and to 195),
    training seconds.

(B) Auxiliary-phase cost with 2 DDP ranks (spawned processes, Gloo on 127.0.0.1, one torch
    thread each): fleetrl's wrapping (one DDP wrapper per phase, the policy phase's ignoring the
    auxiliary head) vs ONE wrapper with find_unused_parameters=True for both phases. Both train
    PPGActorWorker with configs/ppg_cartpole.yaml's settings but n_pi = 8 (to time more phases)
    on the same synthetic CartPole-shaped trajectories (32 steps × 8 envs per iteration; 6
    auxiliary epochs of 256-sample minibatches: 48 optimizer steps per auxiliary phase; 10 in a
    policy phase) for --phases auxiliary phases after one warm-up phase; the two wrappings
    alternate run by run. Reported: median seconds per auxiliary phase and per policy phase.

    .venv/bin/python benchmarks/compare/ppg_ppo.py [--seeds 3] [--phases 4] [--repeats 3] [--skip-a]

Raw results: benchmarks/results/ppg_vs_ppo-<time>.json; the markdown summary goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import RESULTS, ROOT, ForeignLoad, first_at_target, log, train_to_target, wait_for_quiet  # noqa: E402

sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------ (A) sample efficiency


def train_once(algo: str, seed: int, target: float, workdir: Path) -> dict:
    overrides = [f"runner.seed={seed}", "runner.tensorboard=false"]
    wait_for_quiet(0.5, 15)
    with ForeignLoad() as load:
        job = train_to_target(
            ROOT / "configs" / f"{algo}_cartpole.yaml", overrides, workdir, f"{algo}-s{seed}", target, 1200
        )
    if "error" in job:
        raise RuntimeError(f"{algo} seed {seed} failed: {job['error']}")
    records = job["records"]
    aux = [r["aux_s"] for r in records if "aux_s" in r]
    reached_195 = first_at_target(records, 195)
    return {
        "algo": algo,
        "seed": seed,
        "steps_to_target": job["steps_to_target"],
        "steps_to_195": reached_195 and reached_195["global_step"],
        "train_s": job["train_s_total"],
        "global_step": job["global_step"],
        "final_last100": job["last100_final"],
        "aux_phases": len(aux),
        "aux_s_total": sum(aux),
        "foreign_cores": load.cores,
        "run_dir": job["run_dir"],
    }


# ------------------------------------------------------------- (B) auxiliary-phase cost


def find_unused_worker() -> type:
    """`PPGActorWorker` with ONE DDP wrapper for both phases and find_unused_parameters=True: what
    fleetrl's one wrapper per phase (`fleetrl.parallel.phases`) is measured against."""
    from torch import nn

    from fleetrl.algos.ppg.actor import PPGActorWorker
    from fleetrl.algos.ppg.aux_head import forward_aux, policy_forward
    from fleetrl.parallel.wrap import LossPath, ddp

    phases = {"policy": policy_forward, "aux": forward_aux}

    class PhasedPolicy(nn.Module):
        """Both phases in one module, `forward(*args, phase=...)`: what a single wrapper needs."""

        def __init__(self, policy: nn.Module):
            super().__init__()
            self.policy = policy

        def forward(self, *args, phase: str):
            return phases[phase](self.policy, *args)

    class FindUnusedWorker(PPGActorWorker):
        def wrap_loss_path(self) -> LossPath:
            wrapped = ddp(PhasedPolicy(self.policy), self.device, find_unused_parameters=True)
            # no gradient check: DDP itself accounts for whatever a phase leaves unused
            everything = frozenset(name for name, _ in self.policy.named_parameters())

            def path(phase: str) -> LossPath:
                return LossPath(
                    lambda *args: wrapped(*args, phase=phase), self.policy, "ddp", wrapped.no_sync, everything
                )

            self.aux_path = path("aux")
            return path("policy")

    return FindUnusedWorker


def rank_main(rank: int, world: int, port: int, wrapping: str, hidden: list, phases: int, out_dir: str) -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    from fleetrl.algos.ppg.actor import PPGActorWorker
    from fleetrl.models.policy import Policy
    from fleetrl.parallel import process_group
    from fleetrl.plan.load import load_config
    from fleetrl.trajectory import Trajectory

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    config = load_config(
        str(ROOT / "configs" / "ppg_cartpole.yaml"),
        [f"model.hidden_sizes={hidden}", "actor.dist_timeout_s=120", "algorithm.n_pi=8"],
    )
    spaces = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)
    process_group.init_process_group(rank, world, "127.0.0.1", port, timeout_s=120)
    try:
        worker_class = find_unused_worker() if wrapping == "find_unused" else PPGActorWorker
        worker = worker_class(config, *spaces, rank, world)
        worker.init_distributed("127.0.0.1", 0)
        torch.manual_seed(0)
        behaviour = Policy.from_config(config.model, *spaces)
        steps, envs = config.algorithm.num_steps, config.env.num_envs
        generator = torch.Generator().manual_seed(0)
        policy_s, aux_s, aux_cpu_s = [], [], []
        for iteration in range((phases + 1) * config.algorithm.n_pi):
            obs = torch.randn(steps, envs, 4, generator=generator)
            actions, logprobs, values = behaviour.act(obs.flatten(0, 1))
            trajectory = Trajectory(
                obs,
                actions.view(steps, envs),
                logprobs.view(steps, envs),
                values.view(steps, envs),
                torch.ones(steps, envs),
                torch.rand(steps, envs, generator=generator) < 0.05,
                torch.rand(steps, envs, generator=generator) < 0.05,
                values.view(steps, envs),
            )
            started, cpu = time.perf_counter(), time.process_time()
            aux_phase = (iteration + 1) % config.algorithm.n_pi == 0
            metrics = worker.train(trajectory.shard(rank, world), 0.0)
            took, cpu_took = time.perf_counter() - started, time.process_time() - cpu
            if iteration >= config.algorithm.n_pi:  # after the warm-up phase
                policy_s.append(took - metrics.get("aux_s", 0.0))
                if aux_phase:
                    aux_s.append(metrics["aux_s"])
                    aux_cpu_s.append(cpu_took)  # this rank's CPU seconds in the call (policy + aux phase)
        divergence = worker.replica_divergence()
        del worker  # DDP wrappers alive when the group is destroyed can abort the exit (Gloo)
    finally:
        import gc

        gc.collect()
        process_group.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"policy_s": policy_s, "aux_s": aux_s, "aux_cpu_s": aux_cpu_s, "divergence": divergence})
    )


def measure_wrapping(wrapping: str, hidden: list, phases: int) -> dict:
    import torch.multiprocessing as mp

    from fleetrl.net import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        wait_for_quiet(0.5, 5)
        with ForeignLoad() as load:
            mp.spawn(rank_main, args=(2, free_port(), wrapping, hidden, phases, out_dir), nprocs=2)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]
    assert all(not r["divergence"] for r in ranks), ranks
    # a phase ends when its slowest rank does
    aux = [max(values) for values in zip(*(r["aux_s"] for r in ranks))]
    policy = [max(values) for values in zip(*(r["policy_s"] for r in ranks))]
    cpu = [sum(values) for values in zip(*(r["aux_cpu_s"] for r in ranks))]  # both ranks' CPU time
    return {
        "wrapping": wrapping,
        "hidden": hidden,
        "aux_s": aux,
        "policy_s": policy,
        "aux_cpu_s": cpu,
        "foreign_cores": load.cores,
    }


# ---------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--target", type=float, default=475)
    parser.add_argument("--phases", type=int, default=4, help="timed auxiliary phases per run (B)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per wrapping and network (B)")
    parser.add_argument("--hidden", default="64,256", help="hidden widths for (B), two layers each")
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--skip-b", action="store_true")
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results_dir = RESULTS
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = results_dir / f"ppg_vs_ppo-{stamp}"
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "args": vars(args)}
    lines = []

    if not args.skip_a:
        runs = []
        for seed in range(1, args.seeds + 1):
            for algo in ("ppo", "ppg"):
                log(f"(A) {algo} seed {seed}")
                runs.append(train_once(algo, seed, args.target, workdir))
                log(f"    {runs[-1]['steps_to_target']} steps to {args.target:g}, {runs[-1]['train_s']:.1f} s")
        out["sample_efficiency"] = runs
        lines += [
            f"(A) env steps until the last-100-episode mean return reaches {args.target:g} "
            "(budget 200k; '—' = not reached)",
            "",
            "| algorithm | "
            + " | ".join(f"seed {s}" for s in range(1, args.seeds + 1))
            + " | median | steps to 195 (median) | training s (median) |",
            "|---|" + "---|" * (args.seeds + 3),
        ]
        for algo in ("ppo", "ppg"):
            mine = [r for r in runs if r["algo"] == algo]
            reached = [r["steps_to_target"] for r in mine]
            cells = [f"{v:,}" if v else "—" for v in reached]
            finite = sorted(v if v else float("inf") for v in reached)
            median = statistics.median(finite)
            to195 = statistics.median([r["steps_to_195"] or float("inf") for r in mine])
            lines.append(
                f"| {algo.upper()} | "
                + " | ".join(cells)
                + f" | {'—' if median == float('inf') else f'{median:,.0f}'} | {to195:,.0f} | "
                f"{statistics.median(r['train_s'] for r in mine):.1f} |"
            )
        lines.append("")

    if not args.skip_b:
        widths = [int(w) for w in args.hidden.split(",")]
        measured = []
        for width in widths:
            for repeat in range(args.repeats):
                for wrapping in ("per_phase", "find_unused"):
                    log(f"(B) {wrapping}, hidden {width}x2, run {repeat + 1}")
                    measured.append(measure_wrapping(wrapping, [width, width], args.phases))
        out["aux_cost"] = measured
        lines += [
            "(B) 2 DDP ranks, Gloo, 1 thread each, per PPG phase: wall seconds (median and fastest over "
            "runs × phases), and CPU seconds of both ranks together for the iteration that ends in "
            "the auxiliary phase (median)",
            "",
            "| network | wrapping | aux phase wall s, median | aux phase wall s, fastest | "
            "aux iteration CPU s, median | policy phase wall s, median |",
            "|---|---|---|---|---|---|",
        ]
        for width in widths:
            stats = {}
            for wrapping in ("per_phase", "find_unused"):
                mine = [m for m in measured if m["hidden"] == [width, width] and m["wrapping"] == wrapping]
                aux = [v for m in mine for v in m["aux_s"]]
                stats[wrapping] = (
                    statistics.median(aux),
                    min(aux),
                    statistics.median(v for m in mine for v in m["aux_cpu_s"]),
                    statistics.median(v for m in mine for v in m["policy_s"]),
                )
            for wrapping, label in (
                ("per_phase", "one DDP per phase (fleetrl)"),
                ("find_unused", "one DDP, find_unused_parameters=True"),
            ):
                cells = " | ".join(f"{v:.3f}" for v in stats[wrapping])
                lines.append(f"| MLP {width}×{width} | {label} | {cells} |")
            ratios = [a / b for a, b in zip(stats["find_unused"], stats["per_phase"])]
            lines.append(
                f"| MLP {width}×{width} | ratio find_unused / per-phase | "
                + " | ".join(f"{r:.2f}" for r in ratios)
                + " |"
            )
        lines.append("")

    path = results_dir / f"ppg_vs_ppo-{stamp}.json"
    path.write_text(json.dumps(out, indent=2))
    print("\n".join(lines))
    log(f"raw results: {path}")


if __name__ == "__main__":
    main()

"""Env/rollout pipelining: `rollout.pipeline_stage_num: 2` against 1 on a disaggregated placement
(a simulated 2-node Ray cluster: actor and rollout on node 0, the env worker on node 1), with an
env whose every step costs ~5 ms (fleetrl.envs.slow:SlowCartPole, a sleep: wall time, no CPU;
SyncVectorEnv steps the sub-envs one after another, so a stage of n envs costs n × 5 ms) and a
policy whose inference is also costly (a [4096, 4096] MLP, ~34 M parameters, on the rollout
worker's 1 torch thread).

The measure is the collect phase: `time_collect_s` per env step (metrics.jsonl), median over the
iterations after --warmup. Weight sync is limited to the first iteration
(runner.weight_sync_interval=1000; the 134 MB state dict would otherwise be loaded inside every
collect phase) and the update is one gradient step per iteration (it is not measured, only waited
for). Beside the runs, the two costs pipelining can overlap are measured in this process: the
policy's `act` on a stage's batch (1 thread), and a stage's env step.

    .venv/bin/python benchmarks/scaling/pipelining.py [--reps 2] [--iterations 5] [--warmup 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
NUM_ENVS, NUM_STEPS, STEP_TIME_S = 8, 16, 0.005


def common(hidden: int) -> list[str]:
    return [
        "env.id=fleetrl.envs.slow:SlowCartPole",
        f"env.kwargs={{step_time_s: {STEP_TIME_S}}}",
        f"env.num_envs={NUM_ENVS}",
        f"algorithm.num_steps={NUM_STEPS}",
        f"algorithm.minibatch_size={NUM_ENVS * NUM_STEPS}",
        "algorithm.update_epochs=1",
        f"model.hidden_sizes=[{hidden},{hidden}]",
        "runner.weight_sync_interval=1000",
        "runner.param_check_interval=0",
        "runner.checkpoint_interval=100000",
        "runner.log_interval=1000",
        "runner.target_return=null",
        "cluster.backend=ray",
        "cluster.simulate_nodes=2",
        "cluster.num_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 1}",
    ]


VARIANTS = {"1 stage (no pipelining)": ["rollout.pipeline_stage_num=1"], "2 stages": ["rollout.pipeline_stage_num=2"]}


def component_costs(hidden: int, repeats: int = 15) -> dict:
    """Median seconds of the policy's act on 8 and 4 observations (1 thread), and of one
    SyncVectorEnv step of 8 and 4 SlowCartPoles."""
    import gymnasium as gym
    import numpy as np
    import torch

    from fleetrl.config.model_sections import MlpModelConfig
    from fleetrl.envs.slow import SlowCartPole
    from fleetrl.models.policy import Policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = {}
        probe = gym.make("CartPole-v1")
        policy = Policy.from_config(
            MlpModelConfig(hidden_sizes=[hidden, hidden]), probe.observation_space, probe.action_space
        ).requires_grad_(False)
        probe.close()
        for batch in (NUM_ENVS, NUM_ENVS // 2):
            obs = torch.randn(batch, 4)
            for _ in range(3):
                policy.act(obs)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                policy.act(obs)
                times.append(time.perf_counter() - t0)
            costs[f"infer_{batch}"] = statistics.median(times)
            envs = gym.vector.SyncVectorEnv(
                [lambda: SlowCartPole(STEP_TIME_S) for _ in range(batch)],
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            )
            envs.reset(seed=0)
            times = []
            for _ in range(repeats):
                actions = np.zeros(batch, dtype=np.int64)
                t0 = time.perf_counter()
                envs.step(actions)
                times.append(time.perf_counter() - t0)
            envs.close()
            costs[f"env_{batch}"] = statistics.median(times)
        return costs
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--hidden",
        type=int,
        default=4096,
        help="width of the policy's two hidden layers: sets the inference cost against "
        "the env's (pipelining gains most where the two are equal)",
    )
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("pipelining")
    steps = args.iterations * NUM_ENVS * NUM_STEPS
    shared = common(args.hidden)
    overrides = {name: [*shared, f"runner.total_env_steps={steps}", *extra] for name, extra in VARIANTS.items()}
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    costs = [component_costs(args.hidden)]
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for rep in range(args.reps):
        names = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
        for name, rs in kit.run_interleaved(
            CONFIG, {n: overrides[n] for n in names}, 1, out / f"rep{rep}", args.warmup, timeout=900
        ).items():
            runs[name].extend(rs)
        costs.append(component_costs(args.hidden))
    kit.write_json(
        out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "costs": costs, "runs": runs}
    )

    samples = NUM_ENVS * NUM_STEPS
    ok = {name: [r for r in rs if r["code"] == 0] for name, rs in runs.items()}
    per_step = {name: [r["steady"]["collect_s"] / samples for r in rs] for name, rs in ok.items()}
    one, two = (kit.median(per_step[name]) for name in VARIANTS)
    cost = {key: kit.median(c[key] for c in costs) for key in costs[0]}
    e8, e4, i8, i4 = (
        cost[f"env_{NUM_ENVS}"],
        cost[f"env_{NUM_ENVS // 2}"],
        cost[f"infer_{NUM_ENVS}"],
        cost[f"infer_{NUM_ENVS // 2}"],
    )
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/pipelining.py --reps {args.reps} --iterations {args.iterations} "
        f"--warmup {args.warmup} --hidden {args.hidden}`; each run `fleetrl train {CONFIG} {' '.join(shared)} "
        f"runner.total_env_steps={steps} runner.tensorboard=false rollout.pipeline_stage_num=<1|2> "
        f"--skip-doctor`; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    print(
        "| variant | runs ok | collect ms per env step, median (range) | collect s/iter | collect ms per vector "
        "step (all stages) | collect speed-up | start-up s | other load, cores | torch threads |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in ok.items():
        values = [v * 1e3 for v in per_step[name]]
        print(
            f"| {name} | {len(rs)}/{len(runs[name])} | {kit.median(values):.2f} ({kit.spread(values)}) | "
            f"{kit.median(r['steady']['collect_s'] for r in rs):.3f} | "
            f"{kit.median(values) * NUM_ENVS:.1f} | {one / kit.median(per_step[name]):.2f}× | "
            f"{kit.median(r['summary']['startup_s'] for r in rs):.1f} | "
            f"{kit.median(r['foreign_cores'] for r in rs):.2f} | {threads[name]} |"
        )
    print()
    print(f"Component costs (this process, 1 torch thread, median of {len(costs)} measurements):\n")
    print("| what | ms |")
    print("|---|---|")
    print(f"| env step, {NUM_ENVS} envs (1 stage) | {e8 * 1e3:.1f} |")
    print(f"| env step, {NUM_ENVS // 2} envs (1 of 2 stages) | {e4 * 1e3:.1f} |")
    print(f"| policy act, batch {NUM_ENVS} | {i8 * 1e3:.1f} |")
    print(f"| policy act, batch {NUM_ENVS // 2} | {i4 * 1e3:.1f} |")
    unpiped, piped = e8 + i8, max(2 * e4, 2 * i4)
    print(
        f"\nBound without hops: 1 stage ≈ env({NUM_ENVS}) + act({NUM_ENVS}) = {unpiped * 1e3:.1f} ms per vector "
        f"step; 2 stages ≥ max(2 × env({NUM_ENVS // 2}), 2 × act({NUM_ENVS // 2})) = {piped * 1e3:.1f} ms → at most "
        f"{unpiped / piped:.2f}×. Measured: {one * NUM_ENVS * 1e3:.1f} vs {two * NUM_ENVS * 1e3:.1f} ms → "
        f"{one / two:.2f}×."
    )


if __name__ == "__main__":
    main()

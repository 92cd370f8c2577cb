"""Do parallel simulators scale? Env steps per second of a CPU-bound simulator
(`fleetrl/BurnCPU-v0`: CartPole plus `--step-cpu-ms` of computing per env step) inline against 2 env
workers on 2 simulated nodes (`cluster.simulate_nodes: 2`, one env rank per node, the actor and
rollout on node 0, `rollout.pipeline_stage_num: 2`), and the seed report's layout on plain CartPole
(`configs/ppo_cartpole_2nodes.yaml`) against the same job inline, each distributed variant through
the default exchange (the compiled graph) and `cluster.exchange: direct`; variants rotating order
each repetition, ratios of medians. `--isolated` runs the distributed variants on isolated
simulated nodes (`cluster.simulate_isolation: namespaces`: their own network namespaces joined
over a bridge, needs root), where the exchange crosses a network between the nodes.

Both burn variants step the same 16 envs: inline, one process steps all of them one after another;
on Ray each env worker steps 8, in two pipeline stages of 4. The update is kept small (1 epoch) so
that the figure is about collecting. Throughput is env steps / training seconds after --warmup
iterations (`kit.steady`); "collect" is env steps / collect seconds alone.

    .venv/bin/python benchmarks/scaling/parallel_sim.py [--reps 3] [--step-cpu-ms 1.0] [--burn-steps 40960] [--cartpole-steps 40960]
        [--skip-burn | --skip-seed] [--isolated]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

BURN_CONFIG = "configs/ppo_cartpole.yaml"
SEED_CONFIG = "configs/ppo_cartpole_2nodes.yaml"
BURN_JOB = ["env.id=fleetrl/BurnCPU-v0", "env.num_envs=16", "algorithm.num_steps=32", "algorithm.update_epochs=1"]
DIRECT = "cluster.exchange=direct"  # the variants beside the default (auto: the compiled graph)
# The seed layout's job with everything in one process (one actor rank: inline has no DDP).
SEED_INLINE = [
    "cluster.backend=inline",
    "cluster.num_nodes=1",
    "cluster.simulate_nodes=0",
    "cluster.devices_per_node=1",
]
SEED_INLINE += ["cluster.component_placement={actor: 0, rollout: 0, env: 0}", "rollout.pipeline_stage_num=1"]


ISOLATED = "cluster.simulate_isolation=namespaces"


def burn_variants(step_cpu_ms: float, steps: int, nodes: list[str]) -> dict[str, list[str]]:
    job = [*kit.FIXED_WORK, *BURN_JOB, f"env.kwargs={{step_cpu_ms: {step_cpu_ms}}}", f"runner.total_env_steps={steps}"]
    return {
        "burn, inline": [*job, "cluster.backend=inline"],
        "burn, 2 env workers on 2 nodes": [*job, *kit.TWO_ENV_NODES, *nodes],
        "burn, 2 env workers on 2 nodes, direct": [*job, *kit.TWO_ENV_NODES, *nodes, DIRECT],
    }


def seed_variants(steps: int, nodes: list[str]) -> dict[str, list[str]]:
    job = [*kit.FIXED_WORK, f"runner.total_env_steps={steps}"]
    return {
        "CartPole, inline": [*job, *SEED_INLINE],
        "CartPole, seed layout (2 nodes)": [*job, *nodes],
        "CartPole, seed layout (2 nodes), direct": [*job, *nodes, DIRECT],
    }


def ratio_line(runs: dict[str, list[dict]], fast: str, base: str, target: float) -> str:
    ok = {name: [r for r in runs[name] if r["code"] == 0] for name in (fast, base)}
    if not ok[fast] or not ok[base]:
        return f"| {fast} / {base} | – | – | – | target ≥ {target}: no result |"
    overall = kit.median(r["steady"]["steps_per_s"] for r in ok[fast]) / kit.median(
        r["steady"]["steps_per_s"] for r in ok[base]
    )
    collect = kit.median(kit.collect_rate(r) for r in ok[fast]) / kit.median(kit.collect_rate(r) for r in ok[base])
    pairs = [
        a["steady"]["steps_per_s"] / b["steady"]["steps_per_s"]
        for a, b in zip(runs[fast], runs[base])
        if a["code"] == 0 and b["code"] == 0
    ]
    verdict = "met" if overall >= target else "not met"
    return (
        f"| {fast} / {base} | {overall:.2f} | {collect:.2f} | {', '.join(f'{p:.2f}' for p in pairs)} | "
        f"target ≥ {target}: {verdict} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--step-cpu-ms", type=float, default=1.0)
    parser.add_argument("--burn-steps", type=int, default=40960)
    parser.add_argument("--cartpole-steps", type=int, default=40960)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip-seed", action="store_true", help="only the burn variants")
    parser.add_argument("--skip-burn", action="store_true", help="only the seed layout's variants")
    parser.add_argument("--isolated", action="store_true", help="the nodes in namespaces of their own (root)")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("parallel_sim")
    nodes = [ISOLATED] if args.isolated else []
    burn = {} if args.skip_burn else burn_variants(args.step_cpu_ms, args.burn_steps, nodes)
    seed = {} if args.skip_seed else seed_variants(args.cartpole_steps, nodes)
    threads = {name: kit.placement_threads(BURN_CONFIG, o) for name, o in burn.items()}
    threads.update({name: kit.placement_threads(SEED_CONFIG, o) for name, o in seed.items()})
    runs = kit.run_interleaved(BURN_CONFIG, burn, args.reps, out, args.warmup) if burn else {}
    if seed:
        runs.update(kit.run_interleaved(SEED_CONFIG, seed, args.reps, out, args.warmup))
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "runs": runs})

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/parallel_sim.py --reps {args.reps} --step-cpu-ms {args.step_cpu_ms} "
        f"--burn-steps {args.burn_steps} --cartpole-steps {args.cartpole_steps} --warmup {args.warmup}"
        f"{' --skip-seed' if args.skip_seed else ''}{' --skip-burn' if args.skip_burn else ''}"
        f"{' --isolated' if args.isolated else ''}`; burn runs `fleetrl train {BURN_CONFIG} {' '.join(kit.FIXED_WORK)} "
        f"{' '.join(BURN_JOB)} env.kwargs={{step_cpu_ms: {args.step_cpu_ms}}} <variant> --skip-doctor`, "
        f"CartPole runs `fleetrl train {SEED_CONFIG} <inline overrides | none>`; raw: "
        f"`{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    collect = {"collect env steps/s": lambda rs: f"{kit.median(kit.collect_rate(r) for r in rs):.0f}"}
    if burn:
        print(kit.throughput_table({k: runs[k] for k in burn}, threads, "burn, inline", collect))
        print()
    if seed:
        print(kit.throughput_table({k: runs[k] for k in seed}, threads, "CartPole, inline", collect))
    print()
    print("| ratio | env steps/s (ratio of medians) | collect only | per repetition | |")
    print("|---|---|---|---|---|")
    for fast in ("burn, 2 env workers on 2 nodes", "burn, 2 env workers on 2 nodes, direct") if burn else ():
        print(ratio_line(runs, fast, "burn, inline", 1.6))
    if seed:
        for fast in ("CartPole, seed layout (2 nodes)", "CartPole, seed layout (2 nodes), direct"):
            print(ratio_line(runs, fast, "CartPole, inline", 0.5))


if __name__ == "__main__":
    main()

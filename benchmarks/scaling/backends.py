"""What the execution backend costs: the same PPO CartPole job (configs/ppo_cartpole.yaml, a fixed
env-step budget, target_return off so every run does the same work) on

  inline              everything in the controller's process;
  Ray collocated      1 node, actor 0 / rollout 0 / env 0, each a Ray actor (3 processes);
  Ray disaggregated   a simulated 2-node cluster (2 raylets on this machine), env on node 1;
  Ray fused           1 node, the three components of the rank in one Ray actor
                      (cluster.fuse_collocated: one call per iteration).

Throughput (env steps / training seconds after --warmup iterations), ratios to inline, per-phase
medians per iteration, and start-up seconds (process start → first iteration, summary.json).
Variants rotate order each repetition.

    .venv/bin/python benchmarks/scaling/backends.py [--reps 3] [--steps 30000] [--warmup 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
VARIANTS = {
    "inline": ["cluster.backend=inline"],
    "Ray collocated": [
        "cluster.backend=ray",
        "cluster.num_nodes=1",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
    ],
    "Ray disaggregated (env on node 1)": [
        "cluster.backend=ray",
        "cluster.simulate_nodes=2",
        "cluster.num_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 1}",
    ],
    "Ray fused": [
        "cluster.backend=ray",
        "cluster.num_nodes=1",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
        "cluster.fuse_collocated=true",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("backend_overheads")
    overrides = {
        name: [*kit.FIXED_WORK, f"runner.total_env_steps={args.steps}", *extra] for name, extra in VARIANTS.items()
    }
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    runs = kit.run_interleaved(CONFIG, overrides, args.reps, out, args.warmup)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "runs": runs})

    steps_per_iter = 8 * 32
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/backends.py --reps {args.reps} --steps {args.steps} "
        f"--warmup {args.warmup}`; each run `fleetrl train {CONFIG} {' '.join(kit.FIXED_WORK)} "
        f"runner.total_env_steps={args.steps} runner.tensorboard=false <variant> --skip-doctor`; raw: "
        f"`{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    per_step = {
        "collect ms per vector step (act + step, 8 envs)": lambda rs: "{:.2f}".format(
            kit.median(r["steady"]["collect_s"] for r in rs) / 32 * 1e3
        )
    }
    print(kit.throughput_table(runs, threads, "inline", per_step))
    print(
        f"\n(one iteration = {steps_per_iter} env steps: 32 steps × 8 envs; each of the 32 steps is one "
        f"`rollout.act` and one `env.step` call)"
    )


if __name__ == "__main__":
    main()

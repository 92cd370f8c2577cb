"""The seed report's layout on the robot task: env workers rendering camera images on a simulated
node of their own, the rollout and the actor on the other, pipelined — env steps/s against the
same job inline, as a ratio of one run (issue 24, must-have 5).

The job is `configs/ppo_manipulation.yaml` (panda-gym's arm, 64×64 TinyRenderer images, the small
transformer policy), or with `--suite metaworld` `configs/ppo_metaworld.yaml` on 64×64 `corner`
images (`env.kwargs.observation=pixels`: MuJoCo through EGL, `fleetrl.envs.mujoco_camera`), with
evaluation off and a fixed number of iterations. Two variants, rotating order each repetition
(`kit.run_interleaved`), ratios of medians:

- inline: one process steps the 8 envs, infers and trains, one after another;
- render node: `cluster.simulate_nodes: 2` — node 1 holds `--env-workers` env workers (the
  simulators and their rendering), node 0 the rollout worker and the actor;
  `rollout.pipeline_stage_num: 2`, so while one half of each env worker's envs renders, the
  rollout infers the other half's actions. The exchange is `cluster.exchange: auto` (the direct
  channels across nodes).

Throughput is env steps / training seconds after --warmup iterations (`kit.steady`);
"collect" is env steps / collect seconds alone.

    .venv/bin/python benchmarks/robot/render_node.py [--suite panda|metaworld] [--reps 2] [--iterations 5] [--warmup 1] [--env-workers 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

SUITES = {  # the config and what makes it a camera job
    "panda": ("configs/ppo_manipulation.yaml", []),
    "metaworld": (
        "configs/ppo_metaworld.yaml",
        ["env.kwargs.observation=pixels", "env.kwargs.image_size=64", "algorithm.minibatch_size=128"],
    ),
}
ENVS, STEPS = 8, 32  # as measured on 2026-11-28 (the config then had 8 sync envs): 256 env steps an iteration
COMMON = [
    *kit.FIXED_WORK,
    "runner.eval_interval=0",
    f"env.num_envs={ENVS}",
    "env.vectorization=sync",  # inline renders its envs one after another, as the results were measured
    f"algorithm.num_steps={STEPS}",
]
INLINE = ["cluster.backend=inline", "rollout.pipeline_stage_num=1"]


def render_node(env_workers: int) -> list[str]:
    """Env workers on node 1 (slots `env_workers`…2·env_workers−1), rollout and actor on node 0."""
    slots = env_workers
    env = f"{slots}" if env_workers == 1 else f"{slots}-{2 * slots - 1}"
    return [
        "cluster.backend=ray",
        "cluster.num_nodes=2",
        "cluster.simulate_nodes=2",
        f"cluster.devices_per_node={slots}",
        f"cluster.component_placement={{actor: 0, rollout: 0, env: {env}}}",
        "rollout.pipeline_stage_num=2",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5, help="training iterations per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--env-workers", type=int, default=2, choices=(1, 2))
    parser.add_argument("--suite", choices=sorted(SUITES), default="panda")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("render_node" if args.suite == "panda" else f"render_node_{args.suite}")
    config, camera = SUITES[args.suite]
    job = [*COMMON, *camera, f"runner.total_env_steps={args.iterations * ENVS * STEPS}"]
    variants = {
        "inline": [*job, *INLINE],
        f"render node ({args.env_workers} env workers on node 1), pipelined": [*job, *render_node(args.env_workers)],
    }
    threads = {name: kit.placement_threads(config, overrides) for name, overrides in variants.items()}
    runs = kit.run_interleaved(config, variants, args.reps, out, args.warmup, timeout=1800)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "runs": runs})

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/robot/render_node.py --suite {args.suite} --reps {args.reps} "
        f"--iterations {args.iterations} --warmup {args.warmup} --env-workers {args.env_workers}`; each run is "
        f"`fleetrl train {config} "
        f"{' '.join(job)} <variant> --skip-doctor`; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    collect = {"collect env steps/s": lambda rs: f"{kit.median(kit.collect_rate(r) for r in rs):.1f}"}
    print(kit.throughput_table(runs, threads, "inline", collect))
    fast, base = list(variants)[1], "inline"
    ok = {name: [r for r in runs[name] if r["code"] == 0] for name in variants}
    if ok[fast] and ok[base]:
        overall = kit.median(r["steady"]["steps_per_s"] for r in ok[fast]) / kit.median(
            r["steady"]["steps_per_s"] for r in ok[base]
        )
        collect_ratio = kit.median(kit.collect_rate(r) for r in ok[fast]) / kit.median(
            kit.collect_rate(r) for r in ok[base]
        )
        print(
            f"\nrender node / inline: env steps/s {overall:.2f}×, collect only {collect_ratio:.2f}× (ratios of medians)"
        )


if __name__ == "__main__":
    main()

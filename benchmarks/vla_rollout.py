"""Rollout throughput of a Hugging Face VLA: the tiny PaliGemma that `fleetrl init-model` writes,
trained from configs/ppo_minigrid_vla.yaml (LoRA, 8 MiniGrid envs, 32 steps an iteration),

  inline                everything in the controller's process (the rollout acts with the
                        actor's own policy: no weight sync);
  Ray, 2 nodes          a simulated 2-node cluster: the env worker on node 1, the rollout and
                        the actor on node 0 (every env⇄rollout exchange crosses nodes; the
                        rollout gets the LoRA adapters by `runner.weight_sync: trainable`).

Per run, after --warmup iterations: rollout actions/s (actions the rollout produced per second
of the collect phase: its batched inference, the env steps and the exchanges between them) and
env steps/s (whole iterations: collect, weight sync and the update), with Ray's ratio to inline
for both, from the same invocation; the variants alternate each repetition.

    .venv/bin/python benchmarks/vla_rollout.py [--reps 2] [--iterations 6] [--warmup 2] [--chunk 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _runkit as kit  # noqa: E402

CONFIG = "configs/ppo_minigrid_vla.yaml"
STEPS_PER_ITERATION = 8 * 32  # the config's env.num_envs × algorithm.num_steps
VARIANTS = {
    "inline": ["cluster.backend=inline"],
    "Ray, env on node 1": [
        "cluster.backend=ray",
        "cluster.simulate_nodes=2",
        "cluster.num_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 1}",
    ],
}


def actions_per_s(runs: list[dict]) -> float:
    """Actions per collect-second, median over the runs (each run's median iteration)."""
    return kit.median(r["steady"]["steps_per_iter"] / r["steady"]["collect_s"] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=1, help="model.action_chunk: actions per inference")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("vla_rollout")
    from fleetrl.models.hf.init_model import init_model

    folder = init_model("paligemma", "tiny", out / "paligemma-tiny")
    common = [
        *kit.FIXED_WORK,
        f"model.path={folder}",
        f"model.action_chunk={args.chunk}",
        f"runner.total_env_steps={args.iterations * STEPS_PER_ITERATION}",
    ]
    overrides = {name: [*common, *extra] for name, extra in VARIANTS.items()}
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    runs = kit.run_interleaved(CONFIG, overrides, args.reps, out, args.warmup)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "runs": runs})

    ok = {name: [r for r in rs if r["code"] == 0] for name, rs in runs.items()}
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/vla_rollout.py --reps {args.reps} --iterations {args.iterations} "
        f"--warmup {args.warmup} --chunk {args.chunk}`; each run `fleetrl train {CONFIG} "
        f"{' '.join(common).replace(str(folder), '<tiny PaliGemma>')} runner.tensorboard=false <variant> "
        f"--skip-doctor`; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    extra = {"rollout actions/s (collect)": lambda rs: f"{actions_per_s(rs):.0f}"}
    print(kit.throughput_table(runs, threads, "inline", extra))
    if all(ok.values()):
        ray, inline = (ok[name] for name in ("Ray, env on node 1", "inline"))
        steps = kit.median(r["steady"]["steps_per_s"] for r in ray) / kit.median(
            r["steady"]["steps_per_s"] for r in inline
        )
        print(
            f"\nRay (env on node 1) / inline: rollout actions/s **{actions_per_s(ray) / actions_per_s(inline):.2f}×**, "
            f"env steps/s {steps:.2f}×"
        )


if __name__ == "__main__":
    main()

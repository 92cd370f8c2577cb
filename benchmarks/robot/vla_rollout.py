"""Rollout throughput of a Hugging Face VLA: the tiny PaliGemma that `fleetrl init-model` writes,
trained from configs/ppo_minigrid_vla.yaml (LoRA, 8 MiniGrid envs, 32 steps an iteration),

  inline                everything in the controller's process (the rollout acts with the
                        actor's own policy: no weight sync);
  Ray, 2 nodes          a simulated 2-node cluster: the env worker on node 1, the rollout and
                        the actor on node 0 (every env⇄rollout exchange crosses nodes; the
                        rollout gets the LoRA adapters by `runner.weight_sync: trainable`).

On a GPU (`--device cuda`, the device machine), the two variants are the actor and rollout on the
GPU acting in float32 against bfloat16 autocast (`rollout.dtype`) and the whole model loaded in
bfloat16 (`model.dtype`: the actor's weights and update too), all inline, with `--size` the
family's real size (a 3 B PaliGemma: `--size 3b --num-steps 8 --minibatch 16 --micro-batch 4`; the actor's update
accumulates micro-batches with gradient checkpointing).

Per run, after --warmup iterations: rollout actions/s (actions the rollout produced per second
of the collect phase: its batched inference, the env steps and the exchanges between them) and
env steps/s (whole iterations: collect, weight sync and the update), with Ray's ratio to inline
for both, from the same invocation; the variants alternate each repetition.

    .venv/bin/python benchmarks/robot/vla_rollout.py [--reps 2] [--iterations 6] [--warmup 2] [--chunk 1]
    python3 benchmarks/robot/vla_rollout.py --device cuda [--family paligemma] [--size 3b] [--num-steps 8] [--minibatch 16] [--micro-batch 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_minigrid_vla.yaml"
NUM_ENVS = 8  # the config's env.num_envs
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
ON_GPU = ["cluster.backend=inline", "actor.device=cuda", "rollout.device=cuda"]
GPU_VARIANTS = {
    "cuda, float32 acting": [*ON_GPU, "rollout.dtype=float32"],
    "cuda, bfloat16 acting": [*ON_GPU, "rollout.dtype=bfloat16"],
    # the whole model loaded in bfloat16 (`model.dtype`): the actor's weights, its update and its memory too
    "cuda, bfloat16 model": [*ON_GPU, "model.dtype=bfloat16"],
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
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: float32 against bfloat16 acting and a bfloat16 model",
    )
    parser.add_argument("--family", choices=["paligemma", "smolvlm"], default="paligemma")
    parser.add_argument("--size", default="tiny", help="init-model's size: tiny, or the family's real one (3b, 2b)")
    parser.add_argument("--minibatch", type=int, default=None, help="algorithm.minibatch_size (null: the config's)")
    parser.add_argument("--micro-batch", type=int, default=None, help="actor.micro_batch_size, with checkpointing")
    parser.add_argument("--num-steps", type=int, default=32, help="algorithm.num_steps: steps per env an iteration")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("vla_rollout")
    from fleetrl.models.hf.init_model import init_model

    kit.log(f"writing a random {args.family} of size {args.size}")
    folder = init_model(args.family, args.size, out / f"{args.family}-{args.size}")
    common = [
        *kit.FIXED_WORK,
        f"model.path={folder}",
        f"model.action_chunk={args.chunk}",
        f"algorithm.num_steps={args.num_steps}",
        f"runner.total_env_steps={args.iterations * NUM_ENVS * args.num_steps}",
    ]
    if args.minibatch:
        common.append(f"algorithm.minibatch_size={args.minibatch}")
    if args.micro_batch:
        common += [f"actor.micro_batch_size={args.micro_batch}", "actor.gradient_checkpointing=true"]
    variants = GPU_VARIANTS if args.device == "cuda" else VARIANTS
    baseline = next(iter(variants))
    overrides = {name: [*common, *extra] for name, extra in variants.items()}
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    runs = kit.run_interleaved(CONFIG, overrides, args.reps, out, args.warmup)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "threads": threads, "runs": runs})

    ok = {name: [r for r in rs if r["code"] == 0] for name, rs in runs.items()}
    print(f"Machine: {kit.machine_line(info)}\n")
    invocation = " ".join(sys.argv[1:])
    print(
        f"Command: `python benchmarks/robot/vla_rollout.py {invocation}`; each run `fleetrl train {CONFIG} "
        f"{' '.join(common).replace(str(folder), f'<{args.size} {args.family}>')} runner.tensorboard=false "
        f"<variant> --skip-doctor`; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    extra = {"rollout actions/s (collect)": lambda rs: f"{actions_per_s(rs):.0f}"}
    print(kit.throughput_table(runs, threads, baseline, extra))
    base = ok[baseline]
    for other_name in (name for name in variants if name != baseline and ok[name] and base):
        other_runs = ok[other_name]
        steps = kit.median(r["steady"]["steps_per_s"] for r in other_runs) / kit.median(
            r["steady"]["steps_per_s"] for r in base
        )
        print(
            f"\n{other_name} / {baseline}: rollout actions/s "
            f"**{actions_per_s(other_runs) / actions_per_s(base):.2f}×**, env steps/s {steps:.2f}×"
        )


if __name__ == "__main__":
    main()

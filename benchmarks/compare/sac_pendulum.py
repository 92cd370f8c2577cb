"""SAC on Pendulum-v1: fleetrl vs Stable-Baselines3, same hyperparameters, several seeds.

One invocation runs, one job at a time (the reference machine has 2 cores), per seed:
  - fleetrl, configs/sac_pendulum.yaml (float32 throughout);
  - fleetrl, the same config with algorithm.matmul_dtype=bfloat16 (the hidden-to-hidden layers'
    matmuls in bfloat16, everything else float32) — unless --no-bf16;
  - SB3 SAC with RL-Zoo's Pendulum-v1 settings (benchmarks/compare/jobs/sb3_sac.py), which are the
    config's: 256x256 ReLU MLPs, Adam lr 1e-3, batch 256, one gradient step per env step,
    tau 0.005, gamma 0.99, auto entropy from 1.0 to -dim(A), 100 random warm-up steps, 1 env.
The order of the jobs rotates from seed to seed, so slow phases of the machine hit all of them.

Every job stops as soon as the mean return of its last 100 training episodes reaches --target
(-200), or at --max-steps. Measured: env steps and wall seconds from the start of training to
that moment (start-up apart), and each job's total CPU seconds; the CPU used by *other*
processes while a job ran is recorded too (the machine is shared). fleetrl collects 8 env steps
per iteration (then 8 gradient steps) and checks the target once per iteration, so its step
count is a multiple of 8 (up to 7 steps past the crossing); SB3 checks every step.

Both libraries get the same torch thread count (--threads, default 1: fleetrl's default; SB3's
own default is one per core, which on a busy 2-core machine is several times slower).

    .venv/bin/python benchmarks/compare/sac_pendulum.py [--seeds 3]

Needs `bash benchmarks/setup_venvs.sh sb3` first. Per-seed JSON and logs go to
benchmarks/results/sac_pendulum_vs-<time>/, the combined JSON beside it; the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import ROOT, cell, fmt, log, med, ratio  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIG = ROOT / "configs" / "sac_pendulum.yaml"
VARIANTS = {"fleetrl": [], "fleetrl_bf16": ["algorithm.matmul_dtype=bfloat16"]}
NAMES = {"fleetrl": "fleetrl (float32)", "fleetrl_bf16": "fleetrl (bf16 matmuls)", "sb3": "SB3"}


def measured(load: kit.ForeignLoad) -> dict:
    """Wall seconds, CPU seconds of the (waited-for) child job, and the cores others used."""
    return {"job_wall_s": load.wall_s, "job_cpu_s": load.children_cpu_s, "foreign_cores": load.cores}


def run_fleetrl(args, variant: str, seed: int, workdir: Path) -> dict:
    overrides = [*VARIANTS[variant], f"runner.seed={seed}", f"runner.total_env_steps={args.max_steps}"]
    overrides += [f"runner.torch_threads={args.threads}", "runner.tensorboard=false", "--skip-doctor"]
    with kit.ForeignLoad() as load:
        job = kit.train_to_target(CONFIG, overrides, workdir / variant, f"s{seed}", args.target, args.job_timeout)
    records = job.pop("records", [])
    result = {"library": variant, "seed": seed, **job, **measured(load), "torch_threads": args.threads}
    if "error" not in job:
        result["grad_steps"] = sum(r.get("grad_steps") or 0 for r in records)
        result["update_s"] = sum(r["time_update_s"] for r in records)
        result["collect_s"] = sum(r["time_collect_s"] for r in records)
        result["update_ms_per_grad_step"] = 1e3 * result["update_s"] / max(1, result["grad_steps"])
    return result


def run_sb3(args, seed: int, workdir: Path) -> dict:
    job_args = ["--seed", str(seed), "--target", str(args.target), "--total-timesteps", str(args.max_steps)]
    job_args += ["--threads", str(args.threads)]
    with kit.ForeignLoad() as load:
        job = kit.library_job(
            "sb3", HERE / "jobs" / "sb3_sac.py", job_args, workdir / "sb3", f"s{seed}", args.job_timeout
        )
    return {**job, "seed": seed, **measured(load)}


# ---------------------------------------------------------------------------------- table


def value(job: dict, key: str):
    if job.get("error"):
        return None
    return job.get(key) if job.get("target_reached") else math.inf


def table(jobs: dict[str, list[dict]], target: float) -> list[str]:
    lines = [
        f"| library | reached {target:g} | env steps to {target:g} | train wall s to {target:g} | "
        "start-up s | job CPU s | wall ms per env step | other load (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    medians = {}
    for lib, runs in jobs.items():
        steps = [value(j, "steps_to_target") for j in runs]
        secs = [value(j, "train_s_to_target") for j in runs]
        cpu = [j.get("job_cpu_s") for j in runs]
        per_step = [
            1e3 * j["train_s_to_target"] / j["steps_to_target"]
            if j.get("target_reached") and j.get("train_s_to_target")
            else None
            for j in runs
        ]
        medians[lib] = {"steps": med(steps), "secs": med(secs), "cpu": med(cpu)}
        lines.append(
            f"| {NAMES[lib]} | {sum(1 for j in runs if j.get('target_reached'))}/{len(runs)} | "
            f"{cell(steps, thousands=True)} | {cell(secs)} | {cell([j.get('startup_s') for j in runs], 2)} | "
            f"{cell(cpu)} | {cell(per_step, 2)} | {cell([j.get('foreign_cores') for j in runs], 2)} |"
        )
    for lib in jobs:
        if lib != "sb3" and "sb3" in medians:
            f, s = medians[lib], medians["sb3"]
            lines.append(
                f"| **{NAMES[lib]} / SB3** (medians) | | {ratio(f['steps'], s['steps'])} | "
                f"{ratio(f['secs'], s['secs'])} | | {ratio(f['cpu'], s['cpu'])} | | |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=-200.0)
    parser.add_argument("--max-steps", type=int, default=60_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 fleetrl variant")
    parser.add_argument("--quiet-threshold", type=float, default=0.5, help="other load (cores) to wait out")
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for a quiet machine per job")
    parser.add_argument("--job-timeout", type=float, default=3600.0)
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RESULTS_DIR",
        help="a results/sac_pendulum_vs-<stamp> folder: keep its finished jobs, run the rest",
    )
    args = parser.parse_args()
    if not kit.venv_python("sb3").exists():
        sys.exit("no SB3 venv: run `bash benchmarks/setup_venvs.sh sb3` first")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = args.resume or kit.RESULTS / f"sac_pendulum_vs-{stamp}"
    workdir.mkdir(parents=True, exist_ok=args.resume is not None)
    libs = [v for v in VARIANTS if not (args.no_bf16 and v == "fleetrl_bf16")] + ["sb3"]
    jobs: dict[str, list[dict]] = {lib: [] for lib in libs}
    for seed in range(1, args.seeds + 1):
        order = libs[seed - 1 :] + libs[: seed - 1]  # rotate
        for lib in order:
            done = workdir / f"{lib}-s{seed}.json"
            if done.exists():
                jobs[lib].append(json.loads(done.read_text()))
                log(f"seed {seed}: {lib} kept from {done}")
                continue
            waited = kit.wait_for_quiet(args.quiet_threshold, args.max_wait)
            log(f"seed {seed}: {lib} (waited {waited['waited_s']:.0f} s for a quiet machine: {waited['quiet']})")
            job = run_sb3(args, seed, workdir) if lib == "sb3" else run_fleetrl(args, lib, seed, workdir)
            job["waited_for_quiet"] = waited
            jobs[lib].append(job)
            (workdir / f"{lib}-s{seed}.json").write_text(json.dumps(job, indent=2, default=str))
            log(
                f"  steps {job.get('steps_to_target')}, train s {fmt(job.get('train_s_to_target'))}, "
                f"job CPU s {fmt(job.get('job_cpu_s'))}, other load {fmt(job.get('foreign_cores'), 2)} cores"
            )
    lines = [
        f"### SAC on Pendulum-v1, {args.seeds} seeds, last-100-episode mean return ≥ {args.target:g}",
        "",
        *table(jobs, args.target),
        "",
    ]
    result = {
        "benchmark": "sac_pendulum_vs",
        "date": stamp,
        "args": vars(args),
        "versions": kit.library_versions(("sb3",)),
        "machine": kit.machine(),
        "config": CONFIG.read_text(),
        "jobs": jobs,
        "table": lines,
    }
    (kit.RESULTS / f"sac_pendulum_vs-{stamp}.json").write_text(json.dumps(result, indent=2, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Asynchronous against synchronous training (`runner.asynchronous`), side by side in one run: env
steps per second and wall time to a target, the same config and seeds, on five jobs, each with the
bound that overlapping puts on the gain — (collect + update) / max(collect, update), from the
synchronous run's own times — and the bound the machine's cores put on it.

Jobs (all on Ray: inline, one thread, overlaps nothing):
  cartpole   configs/ppo_cartpole.yaml, one env, rollout and actor worker
  burn       the 1 ms CPU-bound simulator (fleetrl/BurnCPU-v0), 2 env workers on 2 simulated nodes
  robot      the render-bound robot task (configs/ppo_manipulation.yaml), its env workers on a
             simulated node of their own, from an SFT start (--sft-run) for the learning part
  vla        the tiny PaliGemma VLA with LoRA (configs/ppo_minigrid_vla.yaml; made here by
             `fleetrl init-model` unless --vla-model names one), rollout and actor apart
  update     CartPole with a wider policy and more epochs: an update at least as long as a collection

Two measurements:
- throughput: per job, --reps repetitions of each mode for --iterations iterations (the order
  rotating: kit.run_interleaved), env steps/s after --warmup iterations (kit.steady). The sync
  runs' median collect and update seconds give the overlap bound; the CPU the sync run's own
  processes kept busy after the warm-up (kit.tree_cpu: every process of its tree, sampled as the
  iterations are logged) gives the bound the cores put on it: the same CPU work on all of the
  machine's cores at best, cores / those busy (what the other processes on the machine use
  meanwhile is reported beside it). The goal: async ≥ 90 % of the overlap bound on robot, vla
  and update.
- learning (--learning): per job and seed (--seeds), each mode to the job's target — a last-100
  mean return (cartpole, burn, update) or its step budget (robot and vla: the success rate or
  return of the last --final-iterations iterations) — env steps and training seconds to the
  target, and the final figure, with every run's metrics.jsonl kept. Learning runs are long (the
  robot's: ~45 min each on a quiet 2-core host), so they split: --skip-throughput runs only them,
  --seeds picks the seeds of this part, and --merge prints one table from the parts' results.json
  (recomputing each final figure from its records). --keep DIR copies what a result is made of —
  each learning run's metrics.jsonl, summary.json and config, and results.json pointing at them —
  to a folder that is committed (benchmarks/results/ is not).

    .venv/bin/python benchmarks/scaling/async_vs_sync.py [--jobs cartpole burn robot vla update]
        [--reps 2] [--iterations 12] [--warmup 3] [--learning] [--seeds 1 2 3] [--sft-run RUN] [--vla-model DIR]
        [--async-overrides KEY=VALUE ...] [--skip-throughput] [--keep DIR]
    .venv/bin/python benchmarks/scaling/async_vs_sync.py --merge RESULTS.json [RESULTS.json ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

MODES = ("sync", "async")
RAY = ["cluster.backend=ray"]
RENDER_NODE = [  # benchmarks/robot/render_node.py's layout: 2 env workers on node 1
    "cluster.backend=ray",
    "cluster.num_nodes=2",
    "cluster.simulate_nodes=2",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, rollout: 0, env: 2-3}",
    "rollout.pipeline_stage_num=2",
    "env.vectorization=sync",
]
VLA_MODEL = "paligemma-tiny"


@dataclass(frozen=True)
class Job:
    config: str
    overrides: list[str]
    batch: int  # env steps an iteration
    target_return: float | None = None  # learning: to this last-100 mean return
    learning_steps: int = 0  # learning: the step budget (with a target: the most it may take)
    success: bool = False  # learning: the final figure is the success rate (else the mean return)
    learning_overrides: list[str] = field(default_factory=list)


JOBS = {
    "cartpole": Job("configs/ppo_cartpole.yaml", RAY, 8 * 32, target_return=475, learning_steps=400_000),
    "burn": Job(
        "configs/ppo_cartpole.yaml",
        ["env.id=fleetrl/BurnCPU-v0", "env.kwargs={step_cpu_ms: 1.0}", "env.num_envs=16", *kit.TWO_ENV_NODES],
        16 * 32,
        target_return=475,
        learning_steps=400_000,
    ),
    "robot": Job(
        "configs/ppo_manipulation.yaml",
        [*RENDER_NODE, "runner.eval_interval=0"],
        16 * 32,
        learning_steps=81_920,
        success=True,
    ),
    "vla": Job("configs/ppo_minigrid_vla.yaml", RAY, 8 * 32, learning_steps=20_480),
    "update": Job(
        "configs/ppo_cartpole.yaml",
        [*RAY, "model.hidden_sizes=[256,256]", "algorithm.update_epochs=20"],
        8 * 32,
        target_return=475,
        learning_steps=400_000,
    ),
}


def mode_overrides(mode: str, args) -> list[str]:
    """What a mode adds to a job's overrides: async mode, with --async-overrides (e.g.
    `algorithm.off_policy_correction=none`: PPO's ratio to the acting policy, no proximal pass)."""
    return ["runner.asynchronous=true", *args.async_overrides] if mode == "async" else []


def job_overrides(name: str, args) -> list[str]:
    """The job's overrides, with what this run of the benchmark points it at (its model, its
    exchange)."""
    job = JOBS[name]
    extra = [f"cluster.exchange={args.exchange}"]
    if name == "vla":
        extra.append(f"model.path={args.vla_model}")
    return [*job.overrides, *extra]


# ------------------------------------------------------------------------------------ throughput


def throughput(name: str, args, out: Path) -> dict:
    job, overrides = JOBS[name], job_overrides(name, args)
    fixed = [*kit.FIXED_WORK, f"runner.total_env_steps={args.iterations * job.batch}", "runner.seed=1"]
    variants = {mode: [*overrides, *fixed, *mode_overrides(mode, args)] for mode in MODES}
    runs = kit.run_interleaved(
        job.config, variants, args.reps, out / name, args.warmup, timeout=args.timeout, steady_cores=True
    )
    return {"runs": runs, "threads": kit.placement_threads(job.config, variants["async"])}


def throughput_row(name: str, result: dict, args) -> dict:
    """The job's figures: medians over repetitions; None where a mode failed."""
    ok = {mode: [r for r in result["runs"][mode] if r["code"] == 0] for mode in MODES}
    if not ok["sync"] or not ok["async"]:
        return {"job": name, "error": "a mode failed: see results.json"}
    speed = {mode: kit.median(r["steady"]["steps_per_s"] for r in ok[mode]) for mode in MODES}
    collect = kit.median(r["steady"]["collect_s"] for r in ok["sync"])
    update = kit.median(r["steady"]["update_s"] for r in ok["sync"])
    overlap = (collect + update) / max(collect, update)
    row = {
        "job": name,
        "sync_steps_per_s": speed["sync"],
        "async_steps_per_s": speed["async"],
        "speedup": speed["async"] / speed["sync"],
        "sync_collect_s": collect,
        "sync_update_s": update,
        "overlap_bound": overlap,
        "of_bound": speed["async"] / speed["sync"] / overlap,
        "foreign_cores": kit.median(r["foreign_cores"] for rs in ok.values() for r in rs),
    }
    busy = kit.med([r.get("steady_cores") for r in ok["sync"]])  # the run's own processes, after the warm-up
    if busy:  # the same CPU work on the machine's cores: at best all of them busy
        row["sync_cores_busy"] = busy
        row["async_cores_busy"] = kit.med([r.get("steady_cores") for r in ok["async"]])
        row["cpu_bound"] = os.cpu_count() / busy
        row["bound"] = min(overlap, row["cpu_bound"])
        row["bound_by"] = "cores" if row["cpu_bound"] < overlap else "overlap"
    return row


def throughput_table(rows: list[dict]) -> str:
    lines = [
        "| job | sync env steps/s | async env steps/s | async / sync | sync collect s | sync update s "
        "| overlap bound | of it | cores busy sync / async | core bound | foreign cores |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['job']} | {r['error']} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['job']} | {r['sync_steps_per_s']:.0f} | {r['async_steps_per_s']:.0f} | {r['speedup']:.2f}× "
            f"| {r['sync_collect_s']:.3f} | {r['sync_update_s']:.3f} | {r['overlap_bound']:.2f}× "
            f"| {r['of_bound']:.0%} | {kit.fmt(r.get('sync_cores_busy'), 2)} / {kit.fmt(r.get('async_cores_busy'), 2)} "
            f"| {kit.fmt(r.get('cpu_bound'), 2)}× | {r['foreign_cores']:.2f} |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- learning


def learning(name: str, args, out: Path) -> dict:
    """Each mode on each seed, to the target or the step budget (kit.train_to_target)."""
    job = JOBS[name]
    overrides = [*job_overrides(name, args), *job.learning_overrides, f"runner.total_env_steps={job.learning_steps}"]
    if name == "robot":
        overrides.append(f"runner.init_from={args.sft_run}")
    runs = {mode: [] for mode in MODES}
    for seed in args.seeds:
        for mode in MODES if seed % 2 else reversed(MODES):
            kit.log(f"learning {name} seed {seed}: {mode}")
            run = kit.train_to_target(
                kit.ROOT / job.config,
                [
                    *overrides,
                    *mode_overrides(mode, args),
                    f"runner.seed={seed}",
                    "runner.tensorboard=false",
                    "--skip-doctor",
                ],
                out / name / "learning",
                f"{mode}-seed{seed}",
                job.target_return,
                timeout=args.learning_timeout,
            )
            run["final"] = final_figure(run.get("records") or [], job, args.final_iterations)
            runs[mode].append(run)
    return runs


def final_figure(metrics: list[dict], job: Job, last: int) -> float | None:
    """The success rate (robot) or the last-100 mean return at the run's end."""
    if not metrics:
        return None
    if job.success:
        rates = [m["success_rate"] for m in metrics[-last:] if m.get("success_rate") is not None]
        return sum(rates) / len(rates) if rates else None
    return metrics[-1].get("episode_return_last100")


def run_records(run: dict, results: Path) -> list[dict]:
    """A learning run's metrics records: in results.json, or (a kept one) in the metrics.jsonl
    its `records_file` names, beside that results.json."""
    if "records" in run:
        return run["records"] or []
    if run.get("records_file"):  # the kept run's folder, read as any run directory
        return kit.read_run((results.parent / run["records_file"]).parent)[0]
    return []


def merged_learning(paths: list[Path], final_iterations: int) -> dict[str, dict]:
    """The learning runs of several results.json (parts of one comparison, e.g. a seed each),
    by job and mode, each final figure recomputed from the run's records."""
    merged: dict[str, dict] = {}
    for path in paths:
        for name, runs in json.loads(path.read_text()).get("learning", {}).items():
            for mode, done in runs.items():
                for run in done:
                    run["final"] = final_figure(run_records(run, path), JOBS[name], final_iterations)
                merged.setdefault(name, {m: [] for m in MODES})[mode].extend(done)
    return merged


def keep(results: Path, into: Path) -> None:
    """Copy each learning run's metrics.jsonl, summary.json and config into
    `into`/<job>/<mode>-seed<S>/, and results.json with each such run's records replaced by the
    path of its metrics.jsonl there (what a committed result is made of, each record once)."""
    data = json.loads(results.read_text())
    for name, runs in data.get("learning", {}).items():
        for mode, done in runs.items():
            for run in done:
                if not run.get("run_dir"):
                    continue
                seed = next(arg.split("=", 1)[1] for arg in run["command"] if arg.startswith("runner.seed="))
                folder = Path(name) / f"{mode}-seed{seed}"
                (into / folder).mkdir(parents=True, exist_ok=True)
                for file in ("metrics.jsonl", "summary.json", "config.yaml"):
                    if (Path(run["run_dir"]) / file).exists():
                        shutil.copy2(Path(run["run_dir"]) / file, into / folder / file)
                run.pop("records", None)
                run["records_file"] = str(folder / "metrics.jsonl")
    kit.write_json(into / "results.json", data)
    kit.log(f"kept in {into}")


def learning_table(results: dict[str, dict]) -> str:
    lines = [
        "| job | mode | seeds | env steps to target | train s to target | final (median, range) | samples dropped |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        for mode in MODES:
            done = runs[mode]
            steps = [r.get("steps_to_target") for r in done]
            seconds = [r.get("train_s_to_target") for r in done]
            final = [r.get("final") for r in done]
            dropped = [(r.get("summary") or {}).get("samples_dropped") for r in done]
            lines.append(
                f"| {name} | {mode} | {len(done)} | {kit.cell(steps, thousands=True)} | {kit.cell(seconds)} "
                f"| {kit.cell(final, 3)} | {kit.cell(dropped, 0)} |"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12, help="iterations per throughput run, warm-up included")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a throughput run may take")
    parser.add_argument("--learning", action="store_true", help="also train each mode per seed to the target")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--learning-timeout", type=float, default=4 * 3600)
    parser.add_argument("--final-iterations", type=int, default=10, help="robot: success over the last iterations")
    parser.add_argument("--sft-run", help="robot, learning: the SFT run the RL stage starts from")
    parser.add_argument("--vla-model", help="vla: a model folder (default: a tiny PaliGemma made here)")
    parser.add_argument(
        "--async-overrides", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides of the async runs only"
    )
    parser.add_argument(
        "--exchange", default="auto", choices=("auto", "compiled", "direct", "classic"), help="cluster.exchange"
    )
    parser.add_argument("--skip-throughput", action="store_true", help="the learning runs only (with --learning)")
    parser.add_argument("--keep", type=Path, help="copy results.json and the learning runs' files here")
    parser.add_argument(
        "--merge", type=Path, nargs="+", metavar="RESULTS", help="print one learning table from these results.json"
    )
    args = parser.parse_args()
    if args.merge:
        print(learning_table(merged_learning(args.merge, args.final_iterations)))
        return
    if args.skip_throughput and not args.learning:
        parser.error("--skip-throughput runs the learning runs only: it needs --learning")
    if args.learning and "robot" in args.jobs and not args.sft_run:
        parser.error(
            "--learning with the robot job needs --sft-run (fleetrl record, then fleetrl sft: the robot guide)"
        )
    out = kit.results_dir("async_vs_sync")
    if "vla" in args.jobs and not args.vla_model:
        args.vla_model = str(kit.tiny_vla(out / VLA_MODEL))
    info = kit.machine()
    jobs = [] if args.skip_throughput else args.jobs
    results = {name: throughput(name, args, out) for name in jobs}
    rows = [throughput_row(name, results[name], args) for name in jobs]
    learned = {name: learning(name, args, out) for name in args.jobs} if args.learning else {}
    kit.write_json(
        out / "results.json",
        {"machine": info, "args": vars(args), "throughput": results, "rows": rows, "learning": learned},
    )

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/async_vs_sync.py {' '.join(sys.argv[1:])}`; each run is "
        f"`fleetrl train <job's config> <job's overrides> [runner.asynchronous=true <--async-overrides>] --skip-doctor` (the jobs: "
        f"this script's JOBS); raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    if rows:
        print(throughput_table(rows))
        print()
    if learned:
        print(learning_table(learned))
    if args.keep:
        keep(out / "results.json", args.keep)


if __name__ == "__main__":
    main()

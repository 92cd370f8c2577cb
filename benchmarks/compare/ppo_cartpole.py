"""PPO on CartPole-v1: fleetrl vs Stable-Baselines3 vs CleanRL, plus fleetrl vs a bare PyTorch loop.

One invocation runs, one job at a time (the reference machine has 2 cores):

  (a) identical hyperparameters for all three: RL-Zoo's tuned CartPole-v1 PPO set
      (benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml for fleetrl; the same values for SB3 and
      CleanRL's ppo.py flags), 1e5-step schedules;
  (b) each library's own recommended CartPole config: fleetrl's shipped configs/ppo_cartpole.yaml,
      SB3 = RL-Zoo's set (identical to (a), so (a)'s SB3 runs are reused, not re-run), CleanRL =
      its ppo.py defaults (500k-step schedule);
  plus the collect / update throughput of fleetrl (from its (a) runs' metrics.jsonl) against
  benchmarks/compare/bare_loop.py.

Every training job stops as soon as the mean return of its last 100 training episodes reaches
--target (475), or at the end of its own schedule's step budget (recorded as "not reached").
Start-up, training (to the target) and the deterministic --eval-episodes evaluation are timed
apart. Each library keeps its default torch thread count; the count is recorded.

    .venv/bin/python benchmarks/compare/ppo_cartpole.py [--seeds 5]

Needs `bash benchmarks/setup_venvs.sh` first. Raw per-seed results go to
benchmarks/results/ppo_cartpole_vs-<time>.json (with every run directory / log beside it), the
markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import fmt, log  # noqa: E402
from ppo_cartpole_jobs import (  # noqa: E402 - the modules beside this script
    CLEANRL_RLZOO_ARGS,
    RLZOO_CONFIG,
    SHIPPED_CONFIG,
    fleetrl_bin,
    fleetrl_throughput,
    run_bare,
    run_cleanrl,
    run_fleetrl,
    run_sb3,
    source_digest,
)
from ppo_cartpole_report import eval_mean, foreign, is_clean, render_markdown  # noqa: E402

LIBS = ("fleetrl", "sb3", "cleanrl")


def parse_seeds(text: str) -> list[int]:
    if "," in text or "-" in text.strip("-"):
        seeds: list[int] = []
        for part in text.split(","):
            if "-" in part:
                low, high = part.split("-")
                seeds.extend(range(int(low), int(high) + 1))
            elif part:
                seeds.append(int(part))
        return seeds
    return list(range(1, int(text) + 1))


def job_key(job: dict) -> tuple[str, str, int]:
    return job["comparison"], job["library"], job["seed"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="5", help="N (seeds 1..N) or a list: 1,2,7 or 1-5 (default 5)")
    parser.add_argument("--libs", default=",".join(LIBS), help="subset of fleetrl,sb3,cleanrl")
    parser.add_argument("--comparisons", default="a,b", help="a (identical hyperparameters), b (own configs)")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds per training job")
    parser.add_argument("--skip-bare", action="store_true", help="skip the bare-loop throughput")
    parser.add_argument("--bare-repeats", type=int, default=3)
    parser.add_argument("--fleetrl", default=None, help="the fleetrl executable (default: beside python)")
    parser.add_argument("--results-dir", default=str(kit.RESULTS))
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=0.15,
        help="re-run a job when other processes used more than this many cores on average while it ran (default 0.15)",
    )
    parser.add_argument("--retries", type=int, default=2, help="re-runs per contaminated job")
    parser.add_argument(
        "--quiet-wait", type=float, default=120.0, help="max seconds to wait for a quiet machine before each job"
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="RESULTS.json",
        help="start from that run's results: re-run only missing, failed or "
        "contaminated jobs (keeping whichever attempt had the least other load); "
        "writes a new results file",
    )
    parser.add_argument(
        "--deadline-min",
        type=float,
        default=None,
        help="start no new job after this many minutes (what is missing stays missing)",
    )
    parser.add_argument(
        "--bare-only",
        action="store_true",
        help="with --resume: run no training job, only the missing / contaminated bare-loop measurements",
    )
    parser.add_argument(
        "--report-only",
        default=None,
        metavar="RESULTS.json",
        help="print the markdown table of an existing results file and exit",
    )
    args = parser.parse_args()

    if args.report_only:
        path = Path(args.report_only)
        report = json.loads(path.read_text())
        print(render_markdown(report, args.max_foreign, path))
        return

    seeds = parse_seeds(args.seeds)
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    comparisons = [c.strip() for c in args.comparisons.split(",") if c.strip()]
    for lib in libs:
        if lib not in LIBS:
            parser.error(f"unknown library {lib!r}")
        if lib in ("sb3", "cleanrl") and not kit.venv_python(lib).exists():
            parser.error(f"{kit.VENVS / lib} missing: run bash benchmarks/setup_venvs.sh first")
    if "fleetrl" in libs and not Path(fleetrl_bin(args)).exists():
        parser.error(f"fleetrl executable not found: {fleetrl_bin(args)}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results_dir = Path(args.results_dir)
    workdir = results_dir / f"ppo_cartpole_vs-{stamp}"
    workdir.mkdir(parents=True, exist_ok=True)
    out_path = results_dir / f"ppo_cartpole_vs-{stamp}.json"
    report = {
        "benchmark": "ppo_cartpole_vs",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": [Path(sys.executable).name, *sys.argv],
        "seeds": seeds,
        "libs": libs,
        "comparisons": comparisons,
        "target_return": args.target,
        "eval_episodes": args.eval_episodes,
        "machine": kit.machine(),
        "versions": kit.library_versions(("sb3", "cleanrl")),
        "source": source_digest(),
        "workdir": str(workdir),
        "jobs": [],
        "bare": {},
        "fleetrl_throughput": None,
    }

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=1, default=str))

    plan: list[tuple[str, str, int]] = []
    for comparison in comparisons:
        for lib in libs:
            if comparison == "b" and lib == "sb3" and "a" in comparisons:
                continue  # SB3's own recommended config *is* (a)'s RL-Zoo set: reuse those runs
            plan.extend((comparison, lib, seed) for seed in seeds)
    bare_plan = [] if args.skip_bare else [1, 0]  # threads: 1, torch default
    if args.resume:
        old = json.loads(Path(args.resume).read_text())
        report["resumed_from"] = [str(args.resume), *old.get("resumed_from", [])]
        report["jobs"] = [j for j in old["jobs"] if job_key(j) in plan]
        report["bare"] = dict(old.get("bare", {}))
        clean_keys = {job_key(j) for j in report["jobs"] if is_clean(j, args.max_foreign)}
        plan = [item for item in plan if item not in clean_keys]
        for bare in report["bare"].values():
            if is_clean(bare, args.max_foreign):
                requested = 1 if bare.get("requested_threads") == 1 else 0
                bare_plan = [t for t in bare_plan if t != requested]
        if args.bare_only:
            plan = []
        log(
            f"resuming {args.resume}: {len(clean_keys)} clean job(s) kept; {len(plan)} job(s) and "
            f"{len(bare_plan)} bare run(s) to (re-)run"
        )
    save()
    started = time.time()

    def out_of_time() -> bool:
        return args.deadline_min is not None and time.time() - started > args.deadline_min * 60

    def guarded(label: str, work, previous: dict | None) -> dict:
        """Run `work()` on a quiet machine; re-run it while other load contaminated it. Returns the
        attempt (or `previous`, an earlier run's result) with the least other load."""
        attempts = [previous] if previous is not None and "error" not in previous else []
        for attempt in range(args.retries + 1):
            quiet = kit.wait_for_quiet(args.max_foreign, args.quiet_wait)
            if not quiet["quiet"]:
                log(
                    f"  machine not quiet after {quiet['waited_s']:.0f} s "
                    f"(other load up to {quiet['busiest_cores']:.2f} cores); running anyway"
                )
            with kit.ForeignLoad() as load:
                result = work()
            result["load"] = {**load.record(), "pre_wait": quiet, "attempt": attempt + 1}
            attempts.append(result)
            if load.cores <= args.max_foreign and "error" not in result:
                break
            log(
                f"  {label}: other processes used {load.cores:.2f} cores meanwhile"
                + (
                    "; re-running"
                    if attempt < args.retries and not out_of_time()
                    else "; keeping the least loaded attempt"
                )
            )
            if out_of_time():
                break
        ok = [a for a in attempts if "error" not in a] or attempts
        best = min(ok, key=foreign)
        best["load"]["attempts"] = best["load"].get("attempts", 0) + len(attempts) - (previous is not None)
        return best

    for number, (comparison, lib, seed) in enumerate(plan, 1):
        if out_of_time():
            log(f"deadline reached: {len(plan) - number + 1} job(s) not (re-)run")
            break
        log(f"job {number}/{len(plan)}: ({comparison}) {lib} seed {seed}")
        if lib == "fleetrl":
            config = RLZOO_CONFIG if comparison == "a" else SHIPPED_CONFIG
            work = partial(run_fleetrl, args, comparison, config, seed, workdir)
        elif lib == "sb3":
            work = partial(run_sb3, args, comparison, seed, workdir)
        else:
            ppo_args = CLEANRL_RLZOO_ARGS if comparison == "a" else []
            work = partial(run_cleanrl, args, comparison, seed, ppo_args, workdir)
        previous = next((j for j in report["jobs"] if job_key(j) == (comparison, lib, seed)), None)
        job = guarded(f"({comparison}) {lib} seed {seed}", work, previous)
        report["jobs"] = [j for j in report["jobs"] if job_key(j) != (comparison, lib, seed)] + [job]
        save()
        log(
            f"  -> reached={job.get('target_reached')} steps={job.get('steps_to_target')} "
            f"train_s={fmt(job.get('train_s_to_target'), 2)} startup_s={fmt(job.get('startup_s'), 2)} "
            f"eval={fmt(eval_mean(job), 1)} total_wall={job.get('total_wall_s', 0):.1f}s "
            f"other load={foreign(job):.2f} cores"
            + (" (kept from the earlier run)" if job is previous else "")
            + (f" ERROR {job['error']}" if "error" in job else "")
        )

    for threads in bare_plan:
        if out_of_time():
            log("deadline reached: bare loop not (re-)run")
            break
        log(f"bare loop, threads={threads or 'torch default'}")
        key = next((k for k, v in report["bare"].items() if (v.get("requested_threads") == 1) == (threads == 1)), None)
        bare = guarded(
            f"bare loop {threads}", partial(run_bare, args, threads), report["bare"].get(key) if key else None
        )
        if key:
            report["bare"].pop(key)
        report["bare"][f"{bare['torch_threads']}t"] = bare
        save()

    fleet_a = [j for j in report["jobs"] if j["library"] == "fleetrl" and j["comparison"] == "a" and "error" not in j]
    fleet_clean = [j for j in fleet_a if is_clean(j, args.max_foreign)]
    report["fleetrl_throughput"] = fleetrl_throughput(fleet_clean or fleet_a)
    if report["fleetrl_throughput"]:
        report["fleetrl_throughput"]["torch_threads"] = "/".join(
            sorted({str(j.get("torch_threads")) for j in (fleet_clean or fleet_a)})
        )
        report["fleetrl_throughput"]["includes_contaminated_runs"] = not fleet_clean
    report["elapsed_s"] = time.time() - started
    report["markdown"] = render_markdown(report, args.max_foreign, out_path)
    save()
    print(report["markdown"])
    print(f"(this invocation: {report['elapsed_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()

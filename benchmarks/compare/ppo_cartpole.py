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
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from functools import partial
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import ROOT, cell, fmt, log, med, ratio  # noqa: E402

HERE = Path(__file__).resolve().parent
RLZOO_CONFIG = HERE / "configs" / "ppo_cartpole_rlzoo.yaml"
SHIPPED_CONFIG = ROOT / "configs" / "ppo_cartpole.yaml"
# What a result keeps of each fleetrl iteration (the collect / update throughput is summed from them).
ITERATION_KEYS = (
    "iteration",
    "global_step",
    "episodes",
    "wall_s",
    "episode_return_last100",
    "time_collect_s",
    "time_update_s",
    "grad_steps",
)

# CleanRL ppo.py (cleanrl 1.2.0) flags for RL-Zoo's CartPole-v1 set. Not expressible in its flags:
# clip_range annealing (lin_0.2: clip stays 0.2) and bootstrapping at time-limit truncation.
CLEANRL_RLZOO_ARGS = [
    "--total-timesteps",
    "100000",
    "--learning-rate",
    "0.001",
    "--num-envs",
    "8",
    "--num-steps",
    "32",
    "--anneal-lr",
    "True",
    "--gamma",
    "0.98",
    "--gae-lambda",
    "0.8",
    "--num-minibatches",
    "1",
    "--update-epochs",
    "20",
    "--norm-adv",
    "True",
    "--clip-coef",
    "0.2",
    "--clip-vloss",
    "False",
    "--ent-coef",
    "0.0",
    "--vf-coef",
    "0.5",
    "--max-grad-norm",
    "0.5",
]
CLEANRL_COMMON_ARGS = ["--env-id", "CartPole-v1", "--cuda", "False", "--track", "False", "--capture-video", "False"]
CLEANRL_LINE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-+0-9.eE]+)")

LIBS = ("fleetrl", "sb3", "cleanrl")
LIB_NAMES = {"fleetrl": "fleetrl", "sb3": "SB3", "cleanrl": "CleanRL"}


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


# --------------------------------------------------------------------------------------- fleetrl


def fleetrl_bin(args) -> str:
    return kit.fleetrl_executable(args.fleetrl)


def run_fleetrl(args, comparison: str, config: Path, seed: int, workdir: Path) -> dict:
    """One fleetrl job to the target (`kit.train_to_target`), then `fleetrl eval` of the
    checkpoint it wrote at the stop."""
    source = source_digest()  # the fleetrl sources this job runs (they change while developed)
    job = kit.train_to_target(
        config,
        [f"runner.seed={seed}"],
        workdir / "fleetrl",
        f"{comparison}-s{seed}",
        args.target,
        args.job_timeout,
        executable=args.fleetrl,
    )
    result = {"library": "fleetrl", "comparison": comparison, "seed": seed, "config": str(config), "source": source}
    records = job.pop("records", [])
    result |= job
    if "error" in job:
        return result
    run_dir = Path(job["run_dir"])
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    threads = (resolved.get("runner") or {}).get("torch_threads")
    summary = job["summary"]
    result.update(
        torch_threads=threads if threads else "torch default",
        fleetrl_reported_startup_s=summary["startup_s"],
        fleetrl_reported_target_s=summary.get("target_reached_s"),
        total_env_steps=(resolved.get("runner") or {}).get("total_env_steps"),
        iterations=[{key: record.get(key) for key in ITERATION_KEYS} for record in records],
    )
    if job["target_reached"] and summary.get("target_reached_step") != job["steps_to_target"]:
        result["note"] = (
            f"summary target_reached_step {summary.get('target_reached_step')} != first metrics line "
            f"at/over target {job['steps_to_target']}"
        )
    # deterministic evaluation of the checkpoint written at stop
    eval_cmd = [fleetrl_bin(args), "eval", str(run_dir), "--episodes", str(args.eval_episodes), "--json"]
    started = time.time()
    done = subprocess.run(eval_cmd, capture_output=True, text=True, cwd=workdir)
    result["eval_process_wall_s"] = time.time() - started  # incl. interpreter start + imports
    result["eval_command"] = eval_cmd
    if done.returncode != 0:
        result["eval"] = None
        result["eval_error"] = f"fleetrl eval exited {done.returncode}: {done.stderr[-2000:]}"
    else:
        result["eval"] = json.loads(done.stdout)  # --json: the JSON alone on stdout
        result["eval_wall_s"] = result["eval"].get("eval_s")
    return result


# ------------------------------------------------------------------------------------------ SB3


def run_sb3(args, comparison: str, seed: int, workdir: Path) -> dict:
    job_args = ["--seed", str(seed), "--total-timesteps", "100000", "--target", str(args.target)]
    job_args += ["--eval-episodes", str(args.eval_episodes)]
    name = f"{comparison}-s{seed}"
    result = kit.library_job("sb3", HERE / "jobs" / "sb3_ppo.py", job_args, workdir / "sb3", name, args.job_timeout)
    result |= {"comparison": comparison, "seed": seed}
    if "error" not in result:
        result["eval_wall_s"] = result["eval"]["eval_s"] if result.get("eval") else None
    return result


# -------------------------------------------------------------------------------------- CleanRL


def run_cleanrl(args, comparison: str, seed: int, ppo_args: list[str], workdir: Path) -> dict:
    python = kit.venv_python("cleanrl")
    cwd = workdir / "cleanrl" / f"{comparison}-s{seed}"  # its runs/ (tensorboard) folder goes here
    cwd.mkdir(parents=True, exist_ok=True)
    eval_out = cwd / "eval.json"
    eval_out.unlink(missing_ok=True)  # from an earlier attempt
    script_args = [*CLEANRL_COMMON_ARGS, "--seed", str(seed), *ppo_args]
    cmd = [
        str(python),
        "-u",
        str(HERE / "jobs" / "cleanrl_ppo.py"),
        "--out",
        str(eval_out),
        "--eval-episodes",
        str(args.eval_episodes),
        "--",
        *script_args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    returns: deque[float] = deque(maxlen=100)
    episodes, last_step = 0, 0
    t_ready, threads, cross = None, None, None
    timed_out = False
    with open(cwd / "stdout.log", "w") as tee, open(cwd / "stderr.log", "w") as errf:
        spawn = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, bufsize=1, cwd=cwd, env=env)
        deadline = spawn + args.job_timeout
        for line in proc.stdout:
            now = time.time()
            tee.write(line)
            if cross is None:
                match = CLEANRL_LINE.match(line)
                if match:
                    last_step = int(match.group(1))
                    returns.append(float(match.group(2)))
                    episodes += 1
                    if len(returns) == 100 and sum(returns) / 100 >= args.target:
                        cross = (last_step, now, sum(returns) / 100)
                        proc.send_signal(signal.SIGUSR1)  # -> evaluate the live agent, exit
                elif line.startswith("@@READY"):
                    _, stamp, nthreads = line.split()
                    t_ready, threads = float(stamp), int(nthreads)
            if now > deadline and proc.poll() is None:
                timed_out = True
                proc.kill()
        proc.wait()
        exit_time = time.time()
    result = {
        "library": "cleanrl",
        "comparison": comparison,
        "seed": seed,
        "command": cmd,
        "ppo_args": script_args,
        "returncode": proc.returncode,
        "workdir": str(cwd),
        "total_wall_s": exit_time - spawn,
        "torch_threads": threads,
        "target_return": args.target,
        "logged_episodes": episodes,
    }
    if t_ready is None or proc.returncode != 0 or timed_out:
        result["error"] = (
            f"cleanrl job exited {proc.returncode}{' (timed out)' if timed_out else ''}; see {cwd}/stderr.log"
        )
        log(result["error"])
    result["startup_s"] = (t_ready - spawn) if t_ready else None
    if cross is not None:
        step, seen, mean = cross
        result.update(
            target_reached=True, steps_to_target=step, train_s_to_target=seen - t_ready, last100_at_target=mean
        )
    else:
        result.update(
            target_reached=False,
            steps_to_target=None,
            train_s_to_target=None,
            train_s_total=(exit_time - t_ready) if t_ready else None,
        )
    result["last100_final"] = (sum(returns) / len(returns)) if returns else None
    result["global_step"] = last_step
    if eval_out.exists():
        job = json.loads(eval_out.read_text())
        result["eval"] = job.get("eval")
        result["eval_wall_s"] = job["eval"]["eval_s"] if job.get("eval") else None
        result["stopped_by"] = job.get("stopped_by")
        result["global_step_at_stop"] = job.get("global_step")
        result["ppo_path"] = job.get("ppo_path")
        if job.get("eval_error"):
            result["eval_error"] = job["eval_error"]
    else:
        result["eval"] = None
        result["eval_error"] = "no eval.json written"
    return result


# ------------------------------------------------------------------------------------ bare loop


def run_bare(args, threads: int) -> dict:
    cmd = [
        sys.executable,
        str(HERE / "bare_loop.py"),
        "--threads",
        str(threads),
        "--json",
        "--repeats",
        str(args.bare_repeats),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["requested_threads"] = threads or "torch default"
    return result


def fleetrl_throughput(jobs: list[dict], first_steps: int = 20_000) -> dict | None:
    """Aggregate collect / update throughput over the iterations of the given fleetrl runs."""
    totals = {"all": [0, 0.0, 0, 0.0], "early": [0, 0.0]}
    for job in jobs:
        previous = 0
        for record in job.get("iterations", []):
            steps = record["global_step"] - previous
            previous = record["global_step"]
            if record.get("time_collect_s") is None or record.get("time_update_s") is None:
                continue
            totals["all"][0] += steps
            totals["all"][1] += record["time_collect_s"]
            totals["all"][2] += record.get("grad_steps") or 0
            totals["all"][3] += record["time_update_s"]
            if record["global_step"] <= first_steps:
                totals["early"][0] += steps
                totals["early"][1] += record["time_collect_s"]
    steps, collect_s, grads, update_s = totals["all"]
    if not steps or not collect_s or not update_s:
        return None
    return {
        "runs": len(jobs),
        "env_steps": steps,
        "collect_s": collect_s,
        "grad_steps": grads,
        "update_s": update_s,
        "collect_steps_per_s": steps / collect_s,
        "collect_steps_per_s_first_20k": (totals["early"][0] / totals["early"][1] if totals["early"][1] else None),
        "update_grad_steps_per_s": grads / update_s,
        "update_samples_per_s": grads * 256 / update_s,
    }


# ----------------------------------------------------------------------------------------- table


def steps_or_inf(job: dict, key: str) -> float | None:
    if "error" in job and job.get(key) is None:
        return None
    return job[key] if job.get("target_reached") and job.get(key) is not None else math.inf


def eval_mean(job: dict):
    return job["eval"]["mean"] if job.get("eval") else None


def comparison_table(title: str, rows: list[tuple[str, str, list[dict]]]) -> list[str]:
    lines = [
        f"#### {title}",
        "",
        "| library | config | torch threads | reached 475 | env steps to 475 | train s to 475 | "
        "start-up s | eval return (100 ep, deterministic) | eval s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    medians = {}
    for lib, config, jobs in rows:
        steps = [steps_or_inf(j, "steps_to_target") for j in jobs]
        secs = [steps_or_inf(j, "train_s_to_target") for j in jobs]
        startup = [j.get("startup_s") for j in jobs]
        evals = [eval_mean(j) for j in jobs]
        # each library's own timing of the evaluation (fleetrl: `fleetrl eval`'s eval_s, which
        # excludes that process's interpreter start; SB3 / CleanRL: timed in-process)
        eval_s = [(j.get("eval") or {}).get("eval_s") for j in jobs]
        threads = sorted({str(j.get("torch_threads")) for j in jobs})
        reached = sum(1 for j in jobs if j.get("target_reached"))
        medians[lib] = {
            "steps": med(steps),
            "secs": med(secs),
            "startup": med(startup),
            "eval": med(evals),
            "eval_s": med(eval_s),
        }
        dagger = "†" if any((j.get("load") or {}).get("contaminated") for j in jobs) else ""
        lines.append(
            f"| {LIB_NAMES[lib]} | {config} | {'/'.join(threads)} | {reached}/{len(jobs)} | "
            f"{cell(steps, thousands=True)} | {cell(secs, 2)}{dagger} | {cell(startup, 2)}{dagger} | "
            f"{cell(evals, 1)} | {cell(eval_s, 2)}{dagger} |"
        )
    if "fleetrl" in medians:
        for lib in medians:
            if lib == "fleetrl":
                continue
            f, o = medians["fleetrl"], medians[lib]
            lines.append(
                f"| **fleetrl / {LIB_NAMES[lib]}** (medians) | | | | "
                f"{ratio(f['steps'], o['steps'])} | {ratio(f['secs'], o['secs'])} | "
                f"{ratio(f['startup'], o['startup'])} | {ratio(f['eval'], o['eval'])} | "
                f"{ratio(f['eval_s'], o['eval_s'])} |"
            )
    lines.append("")
    return lines


def bare_loop_table(fleet: dict | None, bare: dict[str, dict]) -> list[str]:
    lines = [
        "#### Throughput: fleetrl vs a bare PyTorch loop (RL-Zoo config, 8 envs × 32 steps, minibatch 256 × 20 epochs)",
        "",
    ]
    if not bare:
        return lines + ["(bare loop skipped)", ""]
    keys = list(bare)
    header = (
        "| | "
        + (f"fleetrl ({fleet['runs']} runs, {fleet.get('torch_threads', '?')} thread(s)) | " if fleet else "")
        + " | ".join(f"bare loop, {bare[k]['torch_threads']} thread(s)" for k in keys)
    )
    if fleet:
        header += " | " + " | ".join(f"fleetrl / bare {bare[k]['torch_threads']}t" for k in keys)
    lines += [header + " |", "|" + "---|" * (1 + (1 if fleet else 0) + len(keys) * (2 if fleet else 1))]
    metrics = [
        ("collect, env steps/s (first 20k steps)", "collect_steps_per_s_first_20k", "collect_steps_per_s"),
        ("collect, env steps/s (whole runs)", "collect_steps_per_s", "collect_steps_per_s"),
        ("update, gradient steps/s", "update_grad_steps_per_s", "update_grad_steps_per_s"),
        ("update, samples/s", "update_samples_per_s", "update_samples_per_s"),
    ]
    for label, fkey, bkey in metrics:
        row = f"| {label} | "
        if fleet:
            row += f"{fmt(fleet.get(fkey), thousands=True)}{'†' if fleet.get('includes_contaminated_runs') else ''} | "
        row += " | ".join(
            fmt(bare[k][bkey], thousands=True) + ("†" if (bare[k].get("load") or {}).get("contaminated") else "")
            for k in keys
        )
        if fleet:
            row += " | " + " | ".join(ratio(fleet.get(fkey), bare[k][bkey]) for k in keys)
        lines.append(row + " |")
    lines.append("")
    return lines


# ------------------------------------------------------------------------------------------ main


def source_digest() -> dict:
    """fleetrl is not pinned by a commit while it is developed: fingerprint what was benchmarked."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted((ROOT / "fleetrl").rglob("*.py")) + [SHIPPED_CONFIG, RLZOO_CONFIG]
    for path in files:
        if path.exists():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {"fleetrl_sources_sha256": digest.hexdigest()[:16], "git_head": head or None}


def job_key(job: dict) -> tuple[str, str, int]:
    return job["comparison"], job["library"], job["seed"]


def foreign(job: dict) -> float:
    return (job.get("load") or {}).get("foreign_cores", math.inf)


def is_clean(job: dict, max_foreign: float) -> bool:
    return "error" not in job and foreign(job) <= max_foreign


def render_markdown(report: dict, max_foreign: float, out_path: Path) -> str:
    seeds, libs, comparisons = report["seeds"], report["libs"], report["comparisons"]
    target = report["target_return"]
    for job in report["jobs"] + list(report["bare"].values()):
        if job.get("load"):
            job["load"]["contaminated"] = foreign(job) > max_foreign

    def jobs_of(lib: str, comparison: str) -> list[dict]:
        if comparison == "b" and lib == "sb3" and "a" in comparisons:
            comparison = "a"
        return sorted(
            (j for j in report["jobs"] if j["library"] == lib and j["comparison"] == comparison),
            key=lambda j: j["seed"],
        )

    lines = [
        f"Seeds {', '.join(map(str, seeds))} ({len(seeds)} per library); target: mean return of the "
        f"last 100 training episodes ≥ {target:g}. Cells: median (min–max) over seeds; a seed that "
        "never reaches the target counts as +∞ in the median. Ratios: fleetrl median / other "
        "median (< 1: fleetrl needs fewer steps / less time). † = the cell includes at least one "
        f"run during which other processes on the machine used > {max_foreign:g} cores on average "
        "(its times are inflated; steps and returns are not affected).",
        "",
    ]
    cfg_a = {
        "fleetrl": "benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml",
        "sb3": "RL-Zoo CartPole-v1",
        "cleanrl": "ppo.py + RL-Zoo flags",
    }
    cfg_b = {
        "fleetrl": "configs/ppo_cartpole.yaml",
        "sb3": "RL-Zoo CartPole-v1 (= the (a) runs)",
        "cleanrl": "ppo.py defaults (500k steps)",
    }
    if "a" in comparisons:
        lines += comparison_table(
            "(a) Identical hyperparameters: RL-Zoo's tuned CartPole-v1 PPO set, 1e5-step schedule",
            [(lib, cfg_a[lib], jobs_of(lib, "a")) for lib in libs],
        )
    if "b" in comparisons:
        lines += comparison_table(
            "(b) Each library's own recommended CartPole-v1 config",
            [(lib, cfg_b[lib], jobs_of(lib, "b")) for lib in libs],
        )
    if report["bare"] or report.get("fleetrl_throughput"):
        lines += bare_loop_table(report.get("fleetrl_throughput"), report["bare"])
    everything = report["jobs"] + list(report["bare"].values())
    loads = [foreign(j) for j in everything if j.get("load")]
    dirty = [j for j in everything if j.get("load", {}).get("contaminated")]
    reruns = sum(j["load"].get("attempts", 1) - 1 for j in everything if j.get("load"))
    if loads:
        lines.append(
            f"Other processes' CPU load while the kept runs ran: median {statistics.median(loads):.2f}, "
            f"max {max(loads):.2f} cores (threshold {max_foreign:g}); {reruns} re-run(s) for "
            f"load; {len(dirty)} kept run(s) above the threshold."
        )
        lines.append("")
    shown = out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path
    lines.append(f"Raw per-seed results: {shown}")
    return "\n".join(lines)


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

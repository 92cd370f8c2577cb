"""Atari PPO throughput: fleetrl's configs/ppo_atari.yaml against CleanRL's ppo_atari.py, one run.

Both train Breakout (BreakoutNoFrameskip-v4, the same ale-py 0.12 emulator) with CleanRL's
hyperparameters (8 envs × 128 steps, 4 epochs × 4 minibatches, the Nature-CNN agent), which are
ppo_atari.py's defaults and the config's values; each for `--iterations` PPO iterations of 1024
env steps, with the learning rate annealed over that many. The jobs alternate (fleetrl, CleanRL,
then CleanRL, fleetrl, ...) so that drifts in the machine's other load fall on both alike.

Measured: env steps per second of training after the first iteration (start-up and the first
iteration, where torch warms up, left out), the same way for both — fleetrl from its
metrics.jsonl (`wall_s` at the end of each iteration), CleanRL from the moment each of its
per-iteration "SPS:" lines is printed. Each side gets `--threads` torch threads (fleetrl:
runner.torch_threads; CleanRL: OMP_NUM_THREADS, which torch's default follows). On a shared,
loaded machine a job's wall-clock rate is mostly its share of the cores, so each job's CPU cost
is recorded too: env steps per CPU-second of its whole process tree, start-up included.

    .venv/bin/python benchmarks/compare/atari_throughput.py [--iterations 6] [--reps 2] [--threads 1]

Needs `bash benchmarks/setup_venvs.sh atari` first (CleanRL runs through benchmarks/compare/jobs/cleanrl_atari.py).
Raw results go to benchmarks/results/atari_vs_cleanrl-<time>/results.json, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import ROOT, log  # noqa: E402

JOBS = Path(__file__).resolve().parent / "jobs"  # what runs in the comparison libraries' venvs

CONFIG = "configs/ppo_atari.yaml"
STEPS_PER_ITERATION = 8 * 128
SPS_LINE = re.compile(r"^SPS: \d+$")
FIND_PPO_ATARI = (
    "import importlib.util, os; spec = importlib.util.find_spec('cleanrl'); "
    "print(os.path.join(list(spec.submodule_search_locations)[0], 'ppo_atari.py'))"
)


def cleanrl_iterations(python: Path, script: str, iterations: int, threads: int, cwd: Path, timeout: float) -> dict:
    """ppo_atari.py with its default hyperparameters for `iterations` iterations; the time at
    which each iteration's "SPS:" line arrived."""
    cwd.mkdir(parents=True, exist_ok=True)
    steps = iterations * STEPS_PER_ITERATION
    command = [str(python), str(JOBS / "cleanrl_atari.py"), script, "--total-timesteps", str(steps)]
    command += ["--seed", "1", "--cuda", "False"]
    env = {**kit.subprocess_env(), "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    started, ends = time.monotonic(), []
    with kit.ForeignLoad() as load:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = []
        for line in process.stdout:  # ends when the process closes its stdout (exits)
            output.append(line)
            if SPS_LINE.match(line.strip()):
                ends.append(time.monotonic() - started)
            if time.monotonic() - started > timeout:
                process.kill()
                break
        process.wait()
    (cwd / "output.txt").write_text("".join(output))
    run = {"command": command, "code": process.returncode, "iteration_end_s": ends, "foreign_cores": load.cores}
    run["steps_per_cpu_s"] = steps / load.children_cpu_s
    if process.returncode == 0 and len(ends) == iterations:
        run["steps_per_s"] = (iterations - 1) * STEPS_PER_ITERATION / (ends[-1] - ends[0])
    else:
        log(f"  CleanRL FAILED (exit {process.returncode}, {len(ends)} iterations): {''.join(output)[-800:]}")
    return run


def fleetrl_iterations(iterations: int, threads: int, parent: Path, timeout: float) -> dict:
    overrides = [f"runner.total_env_steps={iterations * STEPS_PER_ITERATION}", f"runner.torch_threads={threads}"]
    run = kit.run_fleetrl(CONFIG, overrides, parent, timeout=timeout)
    if run["code"] == 0:
        run["steps_per_s"] = kit.steady(run["metrics"], warmup=1)["steps_per_s"]
        run["steps_per_cpu_s"] = iterations * STEPS_PER_ITERATION / (run["own_cores"] * run["wall_s"])
    else:
        log(f"  fleetrl FAILED (exit {run['code']}): {run['stderr_tail'][-800:]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=6, help="PPO iterations of 1024 env steps per job")
    parser.add_argument("--reps", type=int, default=2, help="jobs per side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    args = parser.parse_args()
    python = kit.venv_python("cleanrl")
    if not python.exists():
        sys.exit(f"no CleanRL venv at {python}: run `bash benchmarks/setup_venvs.sh atari` first")
    script = subprocess.run([str(python), "-c", FIND_PPO_ATARI], capture_output=True, text=True, check=True)
    script = script.stdout.strip()
    out = kit.results_dir("atari_vs_cleanrl")
    machine = kit.machine()
    runs: dict[str, list[dict]] = {"fleetrl": [], "cleanrl": []}
    for rep in range(args.reps):
        for side in ("fleetrl", "cleanrl") if rep % 2 == 0 else ("cleanrl", "fleetrl"):
            log(f"rep {rep + 1}/{args.reps}: {side}")
            if side == "fleetrl":
                run = fleetrl_iterations(args.iterations, args.threads, out / f"fleetrl-{rep}", args.timeout)
            else:
                run = cleanrl_iterations(
                    python, script, args.iterations, args.threads, out / f"cleanrl-{rep}", args.timeout
                )
            if "steps_per_s" in run:
                log(
                    f"  {run['steps_per_s']:.1f} env steps/s, {run['steps_per_cpu_s']:.1f} per CPU-second; "
                    f"other load {run['foreign_cores']:.2f} cores"
                )
            runs[side].append(run)
    sps = {side: [r["steps_per_s"] for r in rs if "steps_per_s" in r] for side, rs in runs.items()}
    per_cpu = {side: [r["steps_per_cpu_s"] for r in rs if "steps_per_s" in r] for side, rs in runs.items()}
    load = {side: [r["foreign_cores"] for r in rs] for side, rs in runs.items()}
    versions = kit.venv_versions({"fleetrl": (sys.executable, "fleetrl"), "cleanrl": (python, "cleanrl")})
    kit.write_json(out / "results.json", {"args": vars(args), "machine": machine, "versions": versions, "runs": runs})
    print(f"Machine: {kit.machine_line(machine)}; torch threads per side: {args.threads}\n")
    print(
        "| | env steps/s (median, range) | fleetrl / CleanRL | env steps per CPU-s | fleetrl / CleanRL | other load, cores |"
    )
    print("|---|---|---|---|---|---|")
    rate = kit.ratio(kit.med(sps["fleetrl"]), kit.med(sps["cleanrl"]))
    cost = kit.ratio(kit.med(per_cpu["fleetrl"]), kit.med(per_cpu["cleanrl"]))
    rows = {"fleetrl": (f"fleetrl {CONFIG}", rate, cost), "cleanrl": ("CleanRL ppo_atari.py (cleanrl 1.2.0)", "", "")}
    for side, (name, rate, cost) in rows.items():
        print(
            f"| {name} | {kit.cell(sps[side])} | {rate} | {kit.cell(per_cpu[side])} | {cost} | {kit.cell(load[side], 2)} |"
        )
    print(f"\ncommand: {' '.join(sys.argv)}; results: {out.relative_to(ROOT)}/results.json")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

"""The two-stage robot pipeline end to end, with its numbers: record → sft → train (PPO from the
SFT weights) → `fleetrl eval` of both on held-out reset seeds → `fleetrl report` of the RL run;
success rate per task, wall times and the exact commands, into <out>/results-<rl run>.json.

    python benchmarks/robot/pipeline.py --demos 10 --eval-seed 51000 \
        --out benchmarks/results/manipulation

Seeds: demonstrations from reset seeds 0, 1, ... (--demos successful ones kept); SFT trains with
runner.seed 1 (training envs reset from seeds 1..4), RL with runner.seed 2 (seeds 2..9 and on);
both are evaluated with the deterministic policy on reset seeds --eval-seed.. (never seen in
training; evaluations during training use 10000..). Extra dotted overrides for a stage go after
--sft / --rl (e.g. --rl runner.total_env_steps=4096); --sft-run starts from an SFT run instead
of recording and training one (it is evaluated again: the same seeds give the same result).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLEETRL = [sys.executable, "-m", "fleetrl"]
EVAL_SEED = 50_000  # the earlier measurements' held-out seeds; the newest use --eval-seed 51000


def run(command: list[str], commands: list[str]) -> tuple[str, float]:
    line = shlex.join(["fleetrl", *command[len(FLEETRL) :]])
    print("$", line, flush=True)
    commands.append(line)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout, seconds


def run_dir_of(output: str) -> str:
    return next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("run directory: "))


def evaluate(run_dir: str, episodes: int, seed: int, commands: list[str]) -> tuple[dict, float]:
    output, seconds = run(
        [*FLEETRL, "eval", run_dir, "--episodes", str(episodes), "--seed", str(seed), "--json"], commands
    )
    return json.loads(output), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demos", type=int, default=10)
    parser.add_argument("--eval-episodes", type=int, default=1000)
    parser.add_argument("--eval-seed", type=int, default=EVAL_SEED, help="the first held-out reset seed")
    parser.add_argument("--out", default="benchmarks/results/manipulation")
    parser.add_argument("--sft-run", help="an SFT run directory to start from instead of recording and training one")
    parser.add_argument("--sft", nargs="*", default=[], help="overrides of configs/sft_manipulation.yaml")
    parser.add_argument("--rl", nargs="*", default=[], help="overrides of configs/ppo_manipulation.yaml")
    args = parser.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    runs = f"runner.run_dir={out / 'runs'}"
    commands: list[str] = []
    results: dict = {"eval_seed": args.eval_seed, "eval_episodes": args.eval_episodes, "commands": commands}
    sft_dir = args.sft_run
    if sft_dir is None:
        demos = out / f"demos-{args.demos}"
        results["demonstrations"] = args.demos
        if not (demos / "meta" / "info.json").is_file():
            output, results["record_s"] = run(
                [
                    *FLEETRL,
                    "record",
                    "configs/sft_manipulation.yaml",
                    "--episodes",
                    str(args.demos),
                    "--out",
                    str(demos),
                ],
                commands,
            )
            print(output.strip())
        sft_output, results["sft_s"] = run(
            [*FLEETRL, "sft", "configs/sft_manipulation.yaml", f"algorithm.demonstrations={demos}", runs, *args.sft],
            commands,
        )
        sft_dir = run_dir_of(sft_output)
    results["sft"], results["sft_eval_s"] = evaluate(sft_dir, args.eval_episodes, args.eval_seed, commands)
    print("after SFT:", json.dumps(results["sft"]), flush=True)
    rl_output, results["rl_s"] = run(
        [*FLEETRL, "train", "configs/ppo_manipulation.yaml", f"runner.init_from={sft_dir}", runs, *args.rl], commands
    )
    rl_dir = run_dir_of(rl_output)
    results["rl"], results["rl_eval_s"] = evaluate(rl_dir, args.eval_episodes, args.eval_seed, commands)
    print("after RL:", json.dumps(results["rl"]), flush=True)
    run([*FLEETRL, "report", rl_dir], commands)
    (out / f"results-{Path(rl_dir).name}.json").write_text(json.dumps(results, indent=1))
    for stage in ("sft", "rl"):
        rates = {k: round(v, 3) for k, v in results[stage].items() if k.startswith("success_rate")}
        print(stage, rates)


if __name__ == "__main__":
    main()

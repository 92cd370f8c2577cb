"""The two-stage robot pipeline end to end, with its numbers: record → sft → train (PPO from the
SFT weights) → `fleetrl eval` of both on held-out reset seeds; success rate per task, wall times.

    nice python benchmarks/manipulation_pipeline.py --demos 20 --out benchmarks/results/manipulation

Seeds: demonstrations from reset seeds 0, 1, ... (--demos successful ones kept); SFT trains with
runner.seed 1 (training envs 1..4), RL with runner.seed 2 (envs 2..9); both are evaluated on
reset seeds EVAL_SEED.. (never seen in training) with the deterministic policy. Extra dotted
overrides for the RL stage go after --rl (e.g. --rl runner.total_env_steps=4096).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLEETRL = [sys.executable, "-m", "fleetrl"]
EVAL_SEED = 50_000


def run(command: list[str]) -> tuple[str, float]:
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout, seconds


def run_dir_of(output: str) -> str:
    return next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("run directory: "))


def evaluate(run_dir: str, episodes: int) -> tuple[dict, float]:
    output, seconds = run([*FLEETRL, "eval", run_dir, "--episodes", str(episodes), "--seed", str(EVAL_SEED), "--json"])
    return json.loads(output.strip().splitlines()[-1]), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demos", type=int, default=20)
    parser.add_argument("--eval-episodes", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/results/manipulation")
    parser.add_argument("--sft", nargs="*", default=[], help="overrides of configs/sft_manipulation.yaml")
    parser.add_argument("--rl", nargs="*", default=[], help="overrides of configs/ppo_manipulation.yaml")
    args = parser.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    demos = out / f"demos-{args.demos}"
    runs = f"runner.run_dir={out / 'runs'}"
    results: dict = {"demonstrations": args.demos, "eval_seed": EVAL_SEED, "eval_episodes": args.eval_episodes}
    if not (demos / "index.json").is_file():
        output, results["record_s"] = run(
            [*FLEETRL, "record", "configs/sft_manipulation.yaml", "--episodes", str(args.demos), "--out", str(demos)]
        )
        print(output.strip())
    sft_output, results["sft_s"] = run(
        [*FLEETRL, "sft", "configs/sft_manipulation.yaml", f"algorithm.demonstrations={demos}", runs, *args.sft]
    )
    sft_dir = run_dir_of(sft_output)
    results["sft"], results["sft_eval_s"] = evaluate(sft_dir, args.eval_episodes)
    print("after SFT:", json.dumps(results["sft"]), flush=True)
    rl_output, results["rl_s"] = run(
        [*FLEETRL, "train", "configs/ppo_manipulation.yaml", f"runner.init_from={sft_dir}", runs, *args.rl]
    )
    rl_dir = run_dir_of(rl_output)
    results["rl"], results["rl_eval_s"] = evaluate(rl_dir, args.eval_episodes)
    print("after RL:", json.dumps(results["rl"]), flush=True)
    results["commands"] = {"sft_overrides": args.sft, "rl_overrides": args.rl, "sft_dir": sft_dir, "rl_dir": rl_dir}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    for stage in ("sft", "rl"):
        rates = {k: round(v, 3) for k, v in results[stage].items() if k.startswith("success_rate")}
        print(stage, rates)


if __name__ == "__main__":
    main()

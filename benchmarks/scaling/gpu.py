"""PPO with the actor (and rollout) on the GPU against the same job on the CPU, one run.

The job is `configs/ppo_atari.yaml` (Breakout, CleanRL's hyperparameters: 8 envs × 128 steps, the
Nature CNN) unless `--config` names another; each mode trains the same `--steps` env steps with the
learning rate annealed over them, inline (the default backend), the modes alternating when
`--reps` > 1. Measured per mode, after `--warmup` iterations: env steps per second of training,
the update's share of an iteration (`time_update_s` / the iteration), the collection's, and the
GPU's utilisation and memory while the job ran (nvidia-smi sampled every 100 ms; none in CPU mode
or without a GPU).

    python benchmarks/scaling/gpu.py [--steps 65536] [--modes cuda,cpu] [--reps 1] [--threads 8]

Needs a CUDA build of torch and a GPU for the cuda mode (the device machine: docs/benchmarks.md,
'Hardware and memory'). Raw results go to benchmarks/results/gpu_ppo-<time>/results.json, the table to stdout.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import log  # noqa: E402

SAMPLE_MS = 100


class GpuSampler:
    """nvidia-smi's utilisation and memory every SAMPLE_MS over a `with` block, each sample stamped
    with the host's wall clock on arrival (a reader thread); no samples where there is no nvidia-smi."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.samples: list[tuple[float, float, float]] = []  # (epoch s, utilisation %, memory MiB)

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            query = "--query-gpu=utilization.gpu,memory.used"
            command = ["nvidia-smi", query, "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self.read, daemon=True).start()
        return self

    def read(self) -> None:
        for line in self.process.stdout:
            util, memory = (float(v) for v in line.split(",")[:2])
            self.samples.append((time.time(), util, memory))

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)


def one_job(config: str, mode: str, steps: int, threads: int, extra: list[str], parent: Path, timeout: float) -> dict:
    overrides = [
        f"actor.device={mode}",
        f"rollout.device={mode}",
        f"runner.total_env_steps={steps}",
        f"runner.torch_threads={threads}",
        *kit.FIXED_WORK,
        *extra,
    ]
    with GpuSampler() as sampler:
        run = kit.run_fleetrl(config, overrides, parent, timeout=timeout)
    return run | {"gpu_samples": sampler.samples}


def summarise(run: dict, warmup: int) -> dict:
    if run["code"] != 0:
        raise RuntimeError(f"fleetrl exited {run['code']}: {run['stderr_tail']}")
    metrics = run["metrics"]
    rates = kit.steady(metrics, warmup)
    # the GPU samples of the measured iterations: metrics' wall_s counts from training's start,
    # which is the process's end less the last iteration's wall_s (summary and exit take ~0 s)
    start = run["ended"] - metrics[-1]["wall_s"] + metrics[warmup - 1]["wall_s"]
    rows = [s for s in run["gpu_samples"] if start <= s[0] <= run["ended"]]
    gpu = {}
    if rows:
        gpu = {
            "gpu_util_pct_mean": statistics.fmean(r[1] for r in rows),
            "gpu_util_pct_median": statistics.median(r[1] for r in rows),
            "gpu_memory_mib_max": max(r[2] for r in rows),
            "gpu_samples": len(rows),
        }
    return {
        **rates,
        "update_share": rates["update_s"] / rates["iter_s"],
        "collect_share": rates["collect_s"] / rates["iter_s"],
        **gpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", default="configs/ppo_atari.yaml")
    parser.add_argument("--steps", type=int, default=65536, help="env steps per job")
    parser.add_argument("--modes", default="cuda,cpu")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=8, help="runner.torch_threads in every mode")
    parser.add_argument("--warmup", type=int, default=3, help="iterations left out of the rates")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--commit", default="", help="the commit measured (recorded with the results)")
    parser.add_argument("overrides", nargs="*", help="more config overrides for every job")
    args = parser.parse_args()
    modes = args.modes.split(",")
    out = kit.results_dir("gpu_ppo")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for rep in range(args.reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            log(f"rep {rep + 1}/{args.reps}: {mode}")
            run = one_job(
                args.config, mode, args.steps, args.threads, args.overrides, out / f"{mode}-{rep}", args.timeout
            )
            results[mode].append({"summary": summarise(run, args.warmup), "wall_s": run["wall_s"]})
    info = {"machine": kit.machine(), "commit": args.commit, "command": sys.argv, "results": results}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        info["torch"] = torch.__version__
    except ImportError:
        pass
    kit.write_json(out / "results.json", info)
    print(f"\n{args.config}, {args.steps} env steps per job, torch {info.get('torch')}, GPU {info.get('gpu', 'none')}")
    print("| mode | env steps/s | update share | collect share | GPU util % (mean) | GPU memory MiB (max) |")
    print("|---|---|---|---|---|---|")
    for mode, runs in results.items():
        s = [r["summary"] for r in runs]

        def med(key: str, s=s) -> float:
            values = [x[key] for x in s if key in x]
            return statistics.median(values) if values else float("nan")

        print(
            f"| {mode} | {med('steps_per_s'):.0f} | {med('update_share'):.2f} | {med('collect_share'):.2f} "
            f"| {med('gpu_util_pct_mean'):.1f} | {med('gpu_memory_mib_max'):.0f} |"
        )
    if "cuda" in results and "cpu" in results:
        ratio = statistics.median(r["summary"]["steps_per_s"] for r in results["cuda"]) / statistics.median(
            r["summary"]["steps_per_s"] for r in results["cpu"]
        )
        print(f"cuda / cpu env steps per second: {ratio:.2f}")


if __name__ == "__main__":
    main()

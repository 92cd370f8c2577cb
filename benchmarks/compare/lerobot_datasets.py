"""fleetrl's LeRobot datasets against LeRobot's own code, both ways (issue 40, must-have 2):

1. `fleetrl record` writes a LeRobotDataset v3.0 (PandaTasks' expert); LeRobot 0.4.4's
   `LeRobotDataset` loads it, and every frame, action and task it returns equals what fleetrl's
   reader returns (and so what the simulator gave: tests/test_lerobot_datasets.py replays it);
2. LeRobot's own writers make datasets of those frames — 0.4.4 a v3.0, 0.3.3 a v2.1, the camera as
   an AV1 mp4 (LeRobot's default) and the features under LeRobot's usual names
   (`observation.images.front`, `observation.environment_state`) — and LeRobot reads them back;
   fleetrl's reader returns the same frames (the videos decoded to the same pixels), and
   `fleetrl sft` trains from each, its `algorithm.features` mapping LeRobot's names to the env's.

Run in fleetrl's venv, after `bash benchmarks/setup_venvs.sh lerobot`:

    python benchmarks/compare/lerobot_datasets.py --episodes 10
    python benchmarks/compare/lerobot_datasets.py --episodes 2 --image-size 32 --fixtures tests/data/lerobot

The first writes benchmarks/results/lerobot-datasets-<time>/results.json (its summary is
docs/benchmarks/lerobot-datasets.json); the second regenerates the tiny datasets the tests read,
each with `lerobot_frames.npz`: the frames LeRobot's own reader returned for it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

from fleetrl.lerobot.reader import read_frames  # noqa: E402

JOB = Path(__file__).resolve().parent / "jobs" / "lerobot_io.py"
LEROBOT_030 = kit.VENVS / "lerobot" / "lerobot-0.3.3"  # lerobot 0.3.3 (v2.1), first on PYTHONPATH
CONFIG = "configs/sft_manipulation.yaml"
# LeRobot's usual names for what fleetrl records as observation.images.image / observation.sim_state
RENAME = {
    "observation.images.image": "observation.images.front",
    "observation.sim_state": "observation.environment_state",
}
MAPPING = "algorithm.features={image: observation.images.front, sim_state: observation.environment_state}"


def env_override(image_size: int) -> str:
    return f"env.kwargs={{tasks: [reach, push], image_size: {image_size}, max_steps: {{reach: 15, push: 25}}, reward: dense, sim_state: true}}"


def lerobot(version: str, *args: str) -> dict:
    """LeRobot's job (jobs/lerobot_io.py) in its venv: 0.4.4 (v3.0) or 0.3.3 (v2.1); its JSON line."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if version == "v2.1":
        env["PYTHONPATH"] = str(LEROBOT_030)
    started = time.time()
    done = subprocess.run(
        ["nice", "-n", "10", str(kit.venv_python("lerobot")), str(JOB), *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"lerobot job {args[0]} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": round(time.time() - started, 1)}


def compare(folder: Path, lerobot_frames: Path, reference: dict | None = None) -> dict:
    """fleetrl's reader against LeRobot's reading of the same folder, feature by feature: equal
    (exactly), and for cameras the largest pixel difference; against `reference` (the lossless
    frames) the cameras' mean absolute difference (what the video codec lost)."""
    with np.load(lerobot_frames) as data:
        theirs = {key: data[key] for key in data.files if key != "meta"}
    ours = read_frames(folder, list(theirs), "check").values
    report = {}
    for key, expected in theirs.items():
        got = ours[key]
        if key == "task":
            report[key] = {"equal": list(got) == list(expected)}
            continue
        got = got.reshape(expected.shape)
        entry = {
            "equal": bool(np.array_equal(got, expected)),
            "shape": list(expected.shape),
            "dtype": str(expected.dtype),
        }
        if expected.dtype == np.uint8 and expected.ndim == 4:
            entry["max_pixel_difference"] = int(np.abs(got.astype(int) - expected.astype(int)).max())
            lossless = (
                None if reference is None else reference.get(next((k for k, v in RENAME.items() if v == key), key))
            )
            if lossless is not None:
                entry["mean_abs_difference_to_the_lossless_frames"] = round(
                    float(np.abs(got.astype(int) - lossless.astype(int)).mean()), 3
                )
        report[key] = entry
    return report


def sft(dataset: Path, parent: Path, image_size: int, iterations: int, mapped: bool) -> dict:
    """A short `fleetrl sft` from `dataset` (its features mapped when LeRobot named them)."""
    overrides = [
        env_override(image_size),
        "env.num_envs=2",
        "env.vectorization=sync",
        "algorithm.num_steps=8",
        f"algorithm.demonstrations={dataset}",
        f"runner.total_env_steps={2 * 8 * iterations}",
        f"runner.checkpoint_interval={iterations}",
        "runner.eval_interval=0",
        *([MAPPING] if mapped else []),
    ]
    parent.mkdir(parents=True, exist_ok=True)
    command = [
        "nice",
        "-n",
        "10",
        kit.fleetrl_executable(),
        "sft",
        CONFIG,
        f"runner.run_dir={parent}",
        "runner.tensorboard=false",
        *overrides,
        "--skip-doctor",
    ]
    started = time.time()
    done = subprocess.run(command, cwd=kit.ROOT, env=kit.subprocess_env(), capture_output=True, text=True)
    runs = sorted(p for p in parent.iterdir() if p.is_dir())
    metrics, _, _ = kit.read_run(runs[-1]) if runs else ([], None, None)
    return {
        "command": " ".join(command[3:]),
        "code": done.returncode,
        "wall_s": round(time.time() - started, 1),
        "bc_loss": [round(record["bc_loss"], 4) for record in metrics],
        "expert_action_prob": [round(record["expert_action_prob"], 4) for record in metrics],
        "demonstration_steps": metrics[-1]["demonstration_steps"] if metrics else None,
        "stderr_tail": done.stderr[-1500:] if done.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10, help="expert episodes to record")
    parser.add_argument("--image-size", type=int, default=64, help="the camera's side in pixels")
    parser.add_argument("--sft-iterations", type=int, default=4, help="iterations of each fleetrl sft run")
    parser.add_argument(
        "--fixtures", type=Path, help="also copy the LeRobot-written datasets here (tests/data/lerobot)"
    )
    args = parser.parse_args()
    if not kit.venv_python("lerobot").exists():
        sys.exit("LeRobot's venv is missing: bash benchmarks/setup_venvs.sh lerobot")
    out = kit.results_dir("lerobot-datasets")
    results: dict = {"machine": kit.machine(), "argv": sys.argv[1:], "steps": {}}
    steps = results["steps"]

    fleetrl_v30 = out / "fleetrl-v3.0"
    started = time.time()
    record = [
        kit.fleetrl_executable(),
        "record",
        CONFIG,
        env_override(args.image_size),
        "--episodes",
        str(args.episodes),
        "--out",
        str(fleetrl_v30),
    ]
    done = subprocess.run(
        ["nice", "-n", "10", *record], cwd=kit.ROOT, env=kit.subprocess_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"fleetrl record failed:\n{done.stderr[-3000:]}")
    steps["record"] = {
        "command": " ".join(record[1:]),
        "summary": done.stdout.strip().splitlines()[-1],  # PyBullet prints its options on stdout first
        "wall_s": round(time.time() - started, 1),
    }
    kit.log(steps["record"]["summary"])

    read_fleetrl = out / "lerobot-reads-fleetrl-v3.0.npz"
    steps["lerobot_0.4.4_loads_fleetrl_v3.0"] = {
        "lerobot": lerobot("v3.0", "read", str(fleetrl_v30), str(read_fleetrl), "pyav")
    }
    steps["lerobot_0.4.4_loads_fleetrl_v3.0"]["features"] = compare(fleetrl_v30, read_fleetrl)
    with np.load(read_fleetrl) as data:
        lossless = {key: data[key] for key in data.files if key != "meta"}

    spec = out / "spec.json"
    spec.write_text(json.dumps({"rename": RENAME, "camera": "video", "fps": 25}))
    written = {}
    for version in ("v3.0", "v2.1"):
        folder, frames = out / f"lerobot-{version}", out / f"lerobot-reads-lerobot-{version}.npz"
        step = {"write": lerobot(version, "write", str(read_fleetrl), str(folder), str(spec))}
        step["read"] = lerobot(version, "read", str(folder), str(frames), "pyav")
        step["features"] = compare(folder, frames, lossless)
        step["sft"] = sft(folder, out / f"sft-{version}", args.image_size, args.sft_iterations, mapped=True)
        kit.log(f"LeRobot {version}: sft exit {step['sft']['code']}, bc_loss {step['sft']['bc_loss']}")
        steps[f"lerobot_{step['write']['lerobot']}_writes_{version}"] = step
        written[version] = (folder, frames)
    steps["fleetrl_sft_from_fleetrl_v3.0"] = sft(
        fleetrl_v30, out / "sft-fleetrl", args.image_size, args.sft_iterations, mapped=False
    )

    results["all_equal"] = all(
        entry["equal"]
        for step in steps.values()
        if isinstance(step, dict) and "features" in step
        for entry in step["features"].values()
    )
    trained = [steps[key]["sft"] for key in steps if "_writes_" in key] + [steps["fleetrl_sft_from_fleetrl_v3.0"]]
    results["all_sft_ran"] = all(run["code"] == 0 for run in trained)
    if args.fixtures:
        for version, (folder, frames) in written.items():
            target = args.fixtures / version
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(folder, target / "dataset")
            shutil.copy(frames, target / "lerobot_frames.npz")
        (args.fixtures / "provenance.json").write_text(
            json.dumps(
                {
                    "command": "python benchmarks/compare/lerobot_datasets.py " + " ".join(sys.argv[1:]),
                    "commit": results["machine"]["commit"],
                    "lerobot": {
                        v: steps[k]["write"]["lerobot"] for v in written for k in steps if k.endswith(f"writes_{v}")
                    },
                },
                indent=1,
            )
            + "\n"
        )
    kit.write_json(out / "results.json", json.loads(json.dumps(results, default=str).replace(f"{kit.ROOT}/", "")))
    kit.log(
        f"all features equal: {results['all_equal']}; every sft ran: {results['all_sft_ran']}; {out / 'results.json'}"
    )
    return 0 if results["all_equal"] and results["all_sft_ran"] else 1


if __name__ == "__main__":
    sys.exit(main())

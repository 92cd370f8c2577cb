"""Start-up on Ray against inline: seconds from `fleetrl train` to its first env step, for

  inline                          everything in the controller's process;
  Ray, new instance               a Ray instance of the run's own (1 node: actor, rollout and env
                                  each a Ray actor), as fleetrl starts it (cluster/ray/local.py);
  Ray, joining a running one      the same workers in a Ray instance already running on this
                                  machine (`ray start --head --block`, started once by this script):
                                  `cluster.ray_address=127.0.0.1:<port>`;
  Ray fused, joining              one fused Ray actor for the three components, joining it too;

variants rotating order each repetition; "first env step" is the controller's "run directory"
line in train.log (training starts right after), measured from the moment the command started
(the supervisor's start-up included, for every variant alike). The preflight doctor is skipped
(`--skip-doctor`), as it is a separate check.

Beside it, in child processes alternating (`--init-reps`), what starting the instance itself costs:
`ray.init(address="local")` as fleetrl did before (it also starts Ray's API server and the
autoscaler's monitor, and waits for the API server) against `LocalRay` + `ray.init(address=...)`,
each up to its first actor answering a call.

With `--base REF` every variant also runs from REF's tree (`git archive`), in the same rotation:
before and after measured side by side in one run, under the same load.

    .venv/bin/python benchmarks/scaling/ray_startup.py [--reps 3] [--init-reps 3] [--base main]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
JOB = ["env.num_envs=8", "algorithm.num_steps=32", "runner.total_env_steps=512", "runner.target_return=null"]
ONE_NODE = [
    "cluster.backend=ray",
    "cluster.devices_per_node=1",
    "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
]
# Ray's token authentication stated, as a driver of a running instance that uses it must; 127.0.0.1
# kept as the instance's address (fleetrl/cluster/ray/cluster.py set_ray_loopback).
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

INIT_CHILD = """
import os, sys, time
started = time.time()
import ray
if sys.argv[1] == "ray.init(local)":
    ray.init(address="local", num_cpus=1, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
else:
    from fleetrl.cluster.ray.local import LocalRay
    local = LocalRay(1, 1, "127.0.0.1")
    ray.init(address=local.address, _node_ip_address="127.0.0.1", log_to_driver=False)
probe = ray.remote(num_cpus=0)(type("Probe", (), {"pid": lambda self: os.getpid()}))
ray.get(probe.remote().pid.remote())
print(time.time() - started)
ray.shutdown()
if sys.argv[1] != "ray.init(local)":
    local.shutdown()
"""


def variants(address: str) -> dict[str, list[str]]:
    joined = [*ONE_NODE, f"cluster.ray_address={address}"]
    return {
        "inline": [*JOB, "cluster.backend=inline"],
        "Ray, new instance": [*JOB, *ONE_NODE],
        "Ray, joining a running one": [*JOB, *joined],
        "Ray fused, joining a running one": [*JOB, *joined, "cluster.fuse_collocated=true"],
    }


def with_base(variants: dict[str, list[str]], base: str | None, tree: Path) -> tuple[dict, dict[str, Path]]:
    """`variants` and, with `base`, each again as '<name> @ <base>', run from `tree` (base's)."""
    if base is None:
        return variants, {}
    before = {f"{name} @ {base}": overrides for name, overrides in variants.items()}
    return {**before, **variants}, {name: tree for name in before}


def startup_s(run: dict) -> float | None:
    if run["code"] != 0 or run["run_dir"] is None:
        return None
    start, _ = kit.train_log_times(Path(run["run_dir"]) / "train.log")
    return None if start is None else start - run["started"]


class RunningRay:
    """`ray start --head --block` on 127.0.0.1 in a temp directory of its own; ended (its whole
    process tree) when the block leaves."""

    def __enter__(self) -> str:
        from fleetrl.net import free_port

        self.temp_dir = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # Ray's socket paths must stay short
        port = free_port("127.0.0.1")
        ray = str(Path(sys.executable).parent / "ray")
        self.head = subprocess.Popen(
            [ray, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
            + ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.temp_dir}"],
            env={**os.environ, **RAY_ENV},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(10)  # its GCS and raylet up before the first run joins (not part of any figure)
        return f"127.0.0.1:{port}"

    def __exit__(self, *exc_info) -> None:
        family = psutil.Process(self.head.pid).children(recursive=True)
        for process in [*family, psutil.Process(self.head.pid)]:
            try:
                process.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(family, timeout=10)
        self.head.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def init_costs(reps: int) -> dict[str, list[float]]:
    costs: dict[str, list[float]] = {"ray.init(local)": [], "LocalRay": []}
    env = {**kit.subprocess_env(), **RAY_ENV}
    for rep in range(reps):
        for name in list(costs)[rep % 2 :] + list(costs)[: rep % 2]:
            done = subprocess.run(
                [sys.executable, "-c", INIT_CHILD, name], cwd=kit.ROOT, env=env, capture_output=True, text=True
            )
            if done.returncode == 0:
                costs[name].append(float(done.stdout.strip().splitlines()[-1]))
            else:
                kit.log(f"{name} failed: {done.stderr[-800:]}")
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--init-reps", type=int, default=3)
    parser.add_argument("--base", help="a git ref whose tree also runs every variant (before/after)")
    args = parser.parse_args()
    os.environ.update(RAY_ENV)  # every run's environment (kit.subprocess_env copies this one's)
    info = kit.machine()
    out = kit.results_dir("ray_startup")
    with RunningRay() as address, tempfile.TemporaryDirectory() as base_dir:
        if args.base is not None:
            kit.base_tree(args.base, Path(base_dir), ("fleetrl", "configs"))
        chosen, roots = with_base(variants(address), args.base, Path(base_dir))
        runs = kit.run_interleaved(CONFIG, chosen, args.reps, out, warmup=0, roots=roots)
    costs = init_costs(args.init_reps)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "runs": runs, "init_s": costs})

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/ray_startup.py --reps {args.reps} --init-reps {args.init_reps}"
        f"{'' if args.base is None else f' --base {args.base}'}`; "
        f"each run `fleetrl train {CONFIG} {' '.join(JOB)} runner.tensorboard=false <variant> --skip-doctor` "
        f"with {' '.join(f'{k}={v}' for k, v in RAY_ENV.items())}; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    print("| variant | runs ok | start-up to the first env step, s: median (range) | vs inline (same tree) | target |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        seconds = [s for r in rs if (s := startup_s(r)) is not None]
        inline = "inline" + name.partition(" @ ")[1] + name.partition(" @ ")[2]
        ratio = kit.median(seconds) / kit.median(s for r in runs[inline] if (s := startup_s(r)) is not None)
        target = "" if name == inline else ("≤ 2×: met" if ratio <= 2 else "≤ 2×: not met")
        print(
            f"| {name} | {len(seconds)}/{len(rs)} | {kit.median(seconds):.1f} ({kit.spread(seconds)}) | {ratio:.2f}× | {target} |"
        )
    print("\n| starting a local Ray instance, to its first actor's answer | runs | s: median (range) |")
    print("|---|---|---|")
    for name, seconds in costs.items():
        print(f"| {name} | {len(seconds)} | {kit.median(seconds):.1f} ({kit.spread(seconds)}) |")


if __name__ == "__main__":
    main()

"""What the supervisor costs and what a restart costs (issue 10), measured side by side in one run.

1. Cost: the same inline PPO CartPole job run by `fleetrl train` (supervisor + controller child)
   and in-process, the way `fleetrl train` ran before the supervisor (`Trainer(resolve(config)).train()`
   in one process, which is still the library path), variants alternating. Throughput is env
   steps per training second (summary.json's `train_s`); start-up and teardown are the wall time
   of the whole command minus `train_s`.
2. Incident → training again, per fault class, inline and on Ray: each run injects one fault
   (`debug.fault`) with `runner.max_restarts=1`; the restarted controller records `restart_s`
   (from the incident's start to its first trained iteration) in metrics.jsonl. The fault fires
   again in the restarted controller (its call count starts over), so each run ends with exit 4
   after the one restart; only the restart is measured.

    .venv/bin/python benchmarks/costs/supervisor_restart.py [--reps 3] [--steps 30000] [--skip-cost] [--skip-restarts]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
COMMON = ["runner.checkpoint_interval=1", "runner.log_interval=1000", "runner.target_return=null"]
SMALL = ["env.num_envs=4", "algorithm.num_steps=16", "algorithm.minibatch_size=32", "algorithm.update_epochs=2"]
RAY = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0, rollout: 0}",
]
# fault class → debug.fault (inline: every component is the controller itself)
FAULTS = {
    "exception": "{kind: exception, component: env, call: 40}",
    "kill": "{kind: kill, component: env, call: 40}",
    "hang (phase_timeout)": "{kind: hang, component: env, call: 40}",
    "gil_hang (process_frozen)": "{kind: gil_hang, component: env, call: 40}",
}
IN_PROCESS = (
    "import sys\n"
    "from fleetrl.plan.load import load_config\n"
    "from fleetrl.controller.loop import Trainer\n"
    "from fleetrl.plan.resolve import resolve\n"
    "Trainer(resolve(load_config(sys.argv[1], sys.argv[2:])), live_progress=False).train()\n"
)


def run_in_process(overrides: list[str], parent: Path) -> dict:
    parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-c",
        IN_PROCESS,
        CONFIG,
        f"runner.run_dir={parent}",
        "runner.tensorboard=false",
        *overrides,
    ]
    started = time.time()
    done = subprocess.run(command, cwd=kit.ROOT, env=kit.subprocess_env(), capture_output=True, text=True, timeout=900)
    wall = time.time() - started
    run_dir = sorted(p for p in parent.iterdir() if p.is_dir())[-1]
    _, summary, _ = kit.read_run(run_dir)
    return {"code": done.returncode, "wall_s": wall, "summary": summary, "stderr_tail": done.stderr[-2000:]}


def cost(reps: int, steps: int, out: Path) -> dict:
    overrides = [*COMMON, "runner.checkpoint_interval=100000", f"runner.total_env_steps={steps}"]
    rows: dict[str, list[dict]] = {"supervised (fleetrl train)": [], "in-process (Trainer, main's path)": []}
    for rep in range(reps):
        order = list(rows) if rep % 2 == 0 else list(reversed(rows))
        for name in order:
            parent = out / f"cost-{rep}-{len(rows[name])}-{'sup' if name.startswith('sup') else 'inproc'}"
            if name.startswith("supervised"):
                result = kit.run_fleetrl(CONFIG, overrides, parent)
            else:
                result = run_in_process(overrides, parent)
            summary = result["summary"] or {}
            rows[name].append(
                {
                    "code": result["code"],
                    "steps_per_s": summary.get("global_step", 0) / summary["train_s"] if summary else None,
                    "outside_training_s": result["wall_s"] - summary["train_s"] if summary else None,
                    "wall_s": result["wall_s"],
                }
            )
            kit.log(f"{name} rep {rep}: {rows[name][-1]}")
    return rows


def restarts(out: Path) -> list[dict]:
    rows = []
    for backend, extra in (("inline", []), ("Ray 2 actor ranks", RAY)):
        for name, spec in FAULTS.items():
            overrides = [*COMMON, *SMALL, *extra, "runner.total_env_steps=100000", "runner.max_restarts=1"]
            overrides += ["watchdog.heartbeat_timeout_s=3", f"debug.fault={spec}"]
            result = kit.run_fleetrl(CONFIG, overrides, out / f"restart-{backend.split()[0]}-{name.split()[0]}")
            run_dir = Path(result["run_dir"])
            kept = run_dir / "hang_report-1.json"
            first = json.loads(kept.read_text()) if kept.is_file() else None
            restart_s = [r["restart_s"] for r in result["metrics"] if "restart_s" in r]
            rows.append(
                {
                    "backend": backend,
                    "fault": name,
                    "debug.fault": spec,
                    "cause": first["cause"] if first else None,
                    "restart_s": restart_s[0] if restart_s else None,
                    "code": result["code"],
                }
            )
            kit.log(f"{backend} {name}: {rows[-1]}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-restarts", action="store_true")
    args = parser.parse_args()
    out = kit.results_dir("supervisor_restart")
    info = kit.machine()
    print(kit.machine_line(info))
    results: dict = {"machine": info, "args": vars(args)}
    if not args.skip_cost:
        rows = results["cost"] = cost(args.reps, args.steps, out)
        print("\n| variant | runs ok | env steps/s median (range) | outside training s median (range) |")
        print("|---|---|---|---|")
        for name, runs in rows.items():
            ok = [r for r in runs if r["code"] == 0 and r["steps_per_s"]]
            print(
                f"| {name} | {len(ok)}/{len(runs)} | {kit.cell([r['steps_per_s'] for r in ok], 0)} "
                f"| {kit.cell([r['outside_training_s'] for r in ok], 1)} |"
            )
        supervised, in_process = (statistics.median(r["steps_per_s"] for r in runs) for runs in rows.values())
        print(f"\nthroughput supervised / in-process: {supervised / in_process:.3f}")
        extra = [statistics.median(r["outside_training_s"] for r in runs) for runs in rows.values()]
        print(f"start-up + teardown added by the supervisor (median): {extra[0] - extra[1]:+.1f} s")
    if not args.skip_restarts:
        rows = results["restarts"] = restarts(out)
        print("\n| backend | fault | debug.fault | first incident | incident → training again, s | exit |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print(
                f"| {row['backend']} | {row['fault']} | `{row['debug.fault']}` | {row['cause']} "
                f"| {kit.fmt(row['restart_s'], 1)} | {row['code']} |"
            )
    kit.write_json(out / "results.json", results)


if __name__ == "__main__":
    main()

"""Detection latency and teardown per fault class: isolated simulated nodes beside the shared-host
simulation, side by side in one run.

The same small Ray CartPole job on 2 simulated 1-slot nodes (actor 0-1 across the nodes, rollout
0, env 0-1: tests/isolation.py's placement), once with `cluster.simulate_nodes=2` alone (raylets
on this host) and once with `cluster.simulate_isolation=namespaces` (each node its own network,
PID, mount and UTS namespace), alternating, one fault injected per run on node 1's ranks with
`debug.fault=...`. From hang_report.json: `detected_after_s`, and the wall time from the report to
the `fleetrl` process's exit (teardown: every worker killed, Ray stopped, namespaces removed).
Also whether anything of an isolated run is left (namespaces, links, its /var/tmp folder).

    .venv/bin/python benchmarks/diagnosis/isolated_rehearsal.py [--reps 1]    (as root)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
import kit  # noqa: E402

from tests.isolation import TWO_ISOLATED_NODES  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
# tests/isolation.py's job without its isolation line (added per mode below), trained until the fault
JOB = [o for o in TWO_ISOLATED_NODES if "simulate_isolation" not in o] + [
    "runner.total_env_steps=1000000",
    "runner.target_return=null",
]
MODES = {"shared host": [], "isolated": ["cluster.simulate_isolation=namespaces"]}
# fault class → (kind, component, rank, call), the expected cause
FAULTS = {
    "kill (env 1)": (("kill", "env", 1, 3), "worker_died"),
    "exception (env 1)": (("exception", "env", 1, 3), "worker_exception"),
    "stop (SIGSTOP actor 1)": (("stop", "actor", 1, 2), "process_frozen"),
    "hang (env 1 step)": (("hang", "env", 1, 20), "phase_timeout"),
}


def isolation_leftovers() -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    found = [line.split()[0] for line in netns if line.startswith("fleetrl-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if line.split(":")[1].strip().startswith("frl")]
    return found + [str(p) for p in Path("/var/tmp").glob("fleetrl-iso-*")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("isolated_rehearsal")
    runs: dict = {(name, mode): [] for name in FAULTS for mode in MODES}
    for rep in range(args.reps):
        for name, ((kind, component, rank, call), _cause) in FAULTS.items():
            for mode, extra in MODES.items():
                kit.log(f"rep {rep + 1}/{args.reps}: {name}, {mode}")
                fault = f"debug.fault={{kind: {kind}, component: {component}, rank: {rank}, call: {call}}}"
                run = kit.run_fleetrl(CONFIG, [*JOB, *extra, fault], out / f"{kind}-{mode[:3]}-{rep}", timeout=400)
                report = run.pop("report") or {}
                run.pop("metrics", None)
                run["cause"], run["culprit"] = report.get("cause"), report.get("culprit")
                run["detected_after_s"] = report.get("detected_after_s")
                run["report_to_exit_s"] = run["ended"] - report["reported_at"] if report else None
                run["isolation_leftovers"] = isolation_leftovers()
                kit.log(
                    f"  exit {run['code']}, {run['cause']} {run['culprit']}, detected after "
                    f"{run['detected_after_s']}, report→exit {run['report_to_exit_s']}, left: {run['isolation_leftovers']}"
                )
                runs[(name, mode)].append(run)
    kit.write_json(
        out / "results.json",
        {"machine": info, "args": vars(args), "runs": {f"{k[0]} | {k[1]}": v for k, v in runs.items()}},
    )
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/diagnosis/isolated_rehearsal.py --reps {args.reps}`; each run `fleetrl train "
        f"{CONFIG} runner.run_dir=<dir> runner.tensorboard=false {' '.join(JOB)} [cluster.simulate_isolation="
        f"namespaces] 'debug.fault={{...}}' --skip-doctor`; raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    print(
        "| fault | cause (shared / isolated) | detected_after_s shared | isolated | ratio | "
        "report → exit s shared | isolated | ratio | left behind (isolated) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (_fault, cause) in FAULTS.items():
        shared, isolated = runs[(name, "shared host")], runs[(name, "isolated")]

        def median(rs: list, key: str) -> float | None:
            values = [r[key] for r in rs if r[key] is not None]
            return kit.median(values) if values else None

        cells = []
        for key in ("detected_after_s", "report_to_exit_s"):
            a, b = median(shared, key), median(isolated, key)
            ratio = f"{b / a:.2f}x" if a and b else "-"
            cells += [f"{a:.2f}" if a is not None else "-", f"{b:.2f}" if b is not None else "-", ratio]
        causes = " / ".join(",".join(sorted({str(r["cause"]) for r in rs})) for rs in (shared, isolated))
        left = sorted({item for r in isolated for item in r["isolation_leftovers"]})
        print(f"| {name} | {causes} (expected {cause}) | {' | '.join(cells)} | {left or 'nothing'} |")


if __name__ == "__main__":
    main()

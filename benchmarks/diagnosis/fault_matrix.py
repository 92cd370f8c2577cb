"""The fault matrix: every fault kind × where × when × backend (tests/fault_cells.py), each cell one
`fleetrl train` run with the fault, judged from its hang_report.json.

Per cell: the cause and the culprit reported, right or wrong against the cell's expectation (the
data of tests/fault_cells.csv; in asynchronous training's hang cells also the controller's wait);
`detected_after_s` against the cell's bound (its documented figure and the loaded host's margin);
the teardown: seconds from the detection (the report's `reported_at`, before the stacks are taken)
to the last process of the run ended, as this script saw them (the `fleetrl` process's descendants,
sampled while it ran: tests/support.py `Descendants`), against the promise of 10 s; and the
processes still running once the teardown's bound has passed — they are counted, then killed.
Infeasible cells are listed with why. Controller cells signal the controller process from here
(SIGKILL or SIGSTOP): at start-up once it has run 2 s, in steady state once 3 iterations are logged.

    .venv/bin/python benchmarks/diagnosis/fault_matrix.py [--backend ray] [--when first_call] [--where env]
        [--kind hang] [--timeout 240] [--set cluster.exchange=direct ...] [--model hf]

`--model hf` runs the Hugging Face VLA's cells instead (`hf_cells`: the actor and rollout cells,
and `hang_in_forward`) on configs/ppo_minigrid_vla.yaml, with a tiny PaliGemma that `fleetrl
init-model` writes into the results folder first.

`--set KEY=VALUE` adds an override to every cell's run (a setting the matrix should hold under,
such as another env⇄rollout exchange).

Writes benchmarks/results/fault_matrix-<time>/results.json and table.md (and prints the table).
`--report DIR...` runs nothing: it prints the table of every cell from the runs those results
folders hold (a later folder's run of a cell replaces an earlier one's).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
import kit  # noqa: E402

from tests.fault_cells import (  # noqa: E402
    BACKENDS,
    HF_KINDS,
    WHEN,
    WHERE,
    Cell,
    all_cells,
    controller_waits_right,
    hf_cells,
    select,
)
from tests.support import TEARDOWN_BOUND_S, Descendants, end, ray_processes_of  # noqa: E402


def controller_of(driver: subprocess.Popen) -> psutil.Process | None:
    try:
        children = psutil.Process(driver.pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            if "fleetrl.controller" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def iterations_logged(parent: Path) -> int:
    metrics = list(parent.glob("*/metrics.jsonl"))
    return len(metrics[0].read_text().splitlines()) if metrics else 0


def signal_when_due(cell: Cell, driver: subprocess.Popen, parent: Path, deadline: float) -> float | None:
    """Controller cells: send the signal when the cell's time comes; returns when it was sent."""
    while time.time() < deadline and driver.poll() is None:
        controller = controller_of(driver)
        due = controller is not None and (
            time.time() - controller.create_time() >= 2 if cell.when == "startup" else iterations_logged(parent) >= 3
        )
        if due:
            controller.send_signal(getattr(signal, cell.signal_controller))
            return time.time()
        time.sleep(0.1)
    return None


def run_cell(cell: Cell, parent: Path, timeout: float, extra: list[str]) -> dict:
    parent.mkdir(parents=True, exist_ok=True)
    command = [*kit.places.FLEETRL, "train", cell.config, f"runner.run_dir={parent}", *cell.overrides, *extra]
    started = time.time()
    with open(parent / "stderr.txt", "w") as stderr:
        driver = subprocess.Popen(
            command, cwd=kit.ROOT, env=kit.subprocess_env(), stdout=subprocess.DEVNULL, stderr=stderr
        )
        descendants = Descendants(driver.pid)
        signalled = signal_when_due(cell, driver, parent, started + timeout) if cell.signal_controller else None
        try:
            driver.wait(max(1.0, started + timeout - time.time()))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    family = []
    if timed_out:  # no incident in time: end the run ourselves (not counted as left by fleetrl)
        family = psutil.Process(driver.pid).children(recursive=True)
        driver.kill()
        driver.wait()
    ended = time.time()
    descendants.stop()
    descendants.add(ray_processes_of(driver.pid))
    gone_at = descendants.gone_at(TEARDOWN_BOUND_S)
    left = descendants.running()
    left_names = [f"{p.pid} {p.name()}" for p in left if p.is_running()]
    end(family + left + ray_processes_of(driver.pid))
    runs = sorted(p for p in parent.iterdir() if p.is_dir())
    report = kit.read_run(runs[-1])[2] if runs else None
    report = report or {}
    culprit = tuple(report["culprit"]) if report.get("culprit") else None
    return {
        "cell": cell.name,
        "code": driver.returncode,
        "timed_out": timed_out,
        "cause": report.get("cause"),
        "culprit": list(culprit) if culprit else None,
        "state": report.get("state"),
        "summary": report.get("summary"),
        "controller": next((w for w in report.get("workers", []) if w["component"] == "controller"), None),
        "cause_right": report.get("cause") == cell.cause,
        "culprit_right": culprit == cell.culprit,
        "detected_after_s": report.get("detected_after_s"),
        "within_bound": report.get("detected_after_s") is not None and report["detected_after_s"] <= cell.bound_s,
        "teardown_s": gone_at - report["reported_at"] if report.get("reported_at") and gone_at else None,
        "exit_s": ended - report["reported_at"] if report.get("reported_at") else None,
        "ended_after_s": report.get("ended_after_s"),
        "signalled_at": signalled,
        "processes_left": len(left_names) if not timed_out else None,
        "left": left_names,
        "wall_s": ended - started,
    }


def verdict(cell: Cell, run: dict | None) -> str:
    if run is None:
        return "not run"
    if run["timed_out"]:
        return "**no incident** (timed out)"
    # against the cell's expectation now (`--report` on runs made before it changed), not the run's
    named = (run["cause"], run["culprit"]) == (cell.cause, list(cell.culprit))
    within = run["detected_after_s"] is not None and run["detected_after_s"] <= cell.bound_s
    ended = run["teardown_s"] is not None and run["teardown_s"] <= TEARDOWN_BOUND_S
    waits = controller_waits_right({"workers": [run["controller"]] if run.get("controller") else []}, cell)
    return "right" if named and within and waits and ended and run["processes_left"] == 0 else "**wrong**"


def table(cells: list[Cell], runs: dict[str, dict], only_run: bool = False) -> str:
    """Every cell's row (`only_run`: the cells that ran, and the infeasible ones grouped by why)."""
    lines = [
        "| kind | where | when | backend | expected | reported | detected s (bound) | teardown s | left | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        head = f"| {cell.kind} | {cell.where} | {cell.when} | {cell.backend} "
        run = runs.get(cell.name)
        if only_run and (cell.infeasible or run is None):
            continue
        if cell.infeasible:
            lines.append(head + f"| infeasible: {cell.infeasible} | | | | | |")
            continue
        want = f"{cell.cause} {list(cell.culprit)}"
        if run is None:
            lines.append(head + f"| {want} | | | | | not run |")
            continue
        got = f"{run['cause']} {run['culprit']}" + (f" ({run['state']})" if run["state"] else "")
        detected = run["detected_after_s"]
        detected_text = f"{detected:.1f}" if detected is not None else "-"
        teardown = f"{run['teardown_s']:.1f}" if run["teardown_s"] is not None else "-"
        left = run["processes_left"] if run["processes_left"] is not None else "-"
        lines.append(
            head + f"| {want} | {got} | {detected_text} (≤ {cell.bound_s:g}) | {teardown} | {left} | "
            f"{verdict(cell, run)} |"
        )
    if only_run:
        reasons: dict[str, int] = {}
        for cell in cells:
            if cell.infeasible:
                reasons[cell.infeasible] = reasons.get(cell.infeasible, 0) + 1
        lines += ["", "Infeasible cells:", *(f"- {why}: {count} cells" for why, count in reasons.items())]
    return "\n".join(lines)


def print_report(cells: list[Cell], folders: list[Path]) -> None:
    runs: dict[str, dict] = {}
    for folder in folders:
        runs |= json.loads((folder / "results.json").read_text())["runs"]
    feasible = [cell for cell in cells if not cell.infeasible]
    counts = {v: sum(verdict(c, runs.get(c.name)) == v for c in feasible) for v in ("right", "not run")}
    print(
        f"{counts['right']} of {len(feasible) - counts['not run']} feasible cells run are right; "
        f"{counts['not run']} feasible cells not run; {len(cells) - len(feasible)} infeasible\n"
    )
    print(table(cells, runs, only_run=True))
    not_run = [c.name for c in feasible if c.name not in runs]
    if not_run:
        print(f"\nNot run ({len(not_run)}): " + ", ".join(not_run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS)
    parser.add_argument("--when", choices=WHEN)
    parser.add_argument("--where", choices=WHERE)
    parser.add_argument("--kind", choices=HF_KINDS)
    parser.add_argument("--timeout", type=float, default=240.0, help="per cell: no incident by then is a miss")
    parser.add_argument("--report", nargs="+", type=Path, help="results folders to tabulate, running nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every cell")
    parser.add_argument("--model", choices=("mlp", "hf"), default="mlp", help="hf: the Hugging Face VLA's cells")
    args = parser.parse_args()
    out = None if args.report else kit.results_dir("fault_matrix" + ("_hf" if args.model == "hf" else ""))
    if args.model == "hf":
        folder = "(not made: --report)" if out is None else str(kit.tiny_vla(out / "paligemma-tiny"))
        table_cells = hf_cells(folder)
    else:
        table_cells = all_cells()
    cells = select(table_cells, backend=args.backend, when=args.when, where=args.where, kind=args.kind)
    if args.report:
        print_report(cells, args.report)
        return
    info = kit.machine()
    runs: dict[str, dict] = {}
    feasible = [cell for cell in cells if not cell.infeasible]
    for number, cell in enumerate(feasible, 1):
        kit.log(f"{number}/{len(feasible)}: {cell.name}")
        run = run_cell(cell, out / cell.name.replace("/", "-"), args.timeout, args.set)
        runs[cell.name] = run
        kit.log(
            f"  {verdict(cell, run)}: {run['cause']} {run['culprit']} (expected {cell.cause} {list(cell.culprit)}), "
            f"detected {run['detected_after_s']}, teardown {run['teardown_s']}, left {run['left']}"
        )
        kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "runs": runs})
    text = table(cells, runs)
    right = sum(verdict(c, runs.get(c.name)) == "right" for c in feasible)
    header = (
        f"Machine: {kit.machine_line(info)}\n\nCommand: `.venv/bin/python benchmarks/diagnosis/fault_matrix.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v is not None and k not in ("timeout", "set"))
        + "".join(f" --set {override}" for override in args.set)
        + f"`; {right}/{len(feasible)} feasible cells right, {len(cells) - len(feasible)} infeasible\n\n"
    )
    (out / "table.md").write_text(header + text + "\n")
    (out / "cells.json").write_text(json.dumps([c.__dict__ for c in cells], indent=1, default=list))
    print(header + text)


if __name__ == "__main__":
    main()

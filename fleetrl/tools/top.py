"""`fleetrl top`: every worker of a running job, one row each, refreshed about once a second.

Everything comes from the run's heartbeat store (watch/attach.py) — what each worker says it is
doing (its GPU's utilisation and memory too, where it computes on one: probe/gpu.py), measured
ages on this side — plus, for workers on this machine, their CPU and memory from psutil. The
deadline is the watchdog's own (`Checks.deadline`, from the run's settings), so the table shows
a phase nearing its limit the way the watchdog will judge it. Not a terminal (a pipe,
a file, `--once`): one table in plain text.
"""

from __future__ import annotations

import time

import psutil
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleetrl import exit_codes
from fleetrl.probe.flight_recorder import machine_identity
from fleetrl.watch.attach import LiveRun, attach
from fleetrl.watch.judging.verdict import Checks

COLUMNS = (
    "component",
    "rank",
    "node",
    "pid",
    "phase",
    "in phase",
    "deadline",
    "collective",
    "beat age",
    "CPU %",
    "RSS",
    "GPU",
    "state",
)
REFRESH_S = 1.0


class Sampler:
    """CPU % and RSS of processes on this machine; CPU % over the time since the previous sample."""

    def __init__(self):
        self.machine = machine_identity()
        self.processes: dict[int, psutil.Process] = {}

    def sample(self, record: dict) -> tuple[str, str]:
        pid = record.get("pid")
        if record.get("machine") != self.machine or not pid:
            return "-", "-"  # another machine: nothing to measure from here
        try:
            process = self.processes.setdefault(pid, psutil.Process(pid))
            return f"{process.cpu_percent():.0f}", f"{process.memory_info().rss / 2**20:.0f} MiB"
        except psutil.Error:
            return "gone", "-"


def gpu(record: dict) -> str:
    """'<utilisation> % <memory> MiB' of the GPU the worker computes on (probe/gpu.py), '-'
    where it uses none."""
    if "gpu_memory_mib" not in record:
        return "-"
    util = record.get("gpu_util_pct")
    return (f"{util:.0f} % " if util is not None else "") + f"{record['gpu_memory_mib']:.0f} MiB"


def collective(record: dict) -> str:
    current, last = record.get("collective"), record.get("last_collective")
    if current:
        return f"in {current['op']} #{current['seq']}"
    return f"{last['op']} #{last['seq']}" if last else "-"


def rows(run: LiveRun, sampler: Sampler, judge: Checks) -> list[tuple[str, ...]]:
    records = judge.observe(run.records())  # ages on this clock, never a worker's (watch/judging/judgement.py)
    found = []
    for worker in run.workers:
        record = records.get((worker["component"], worker["rank"]))
        identity = (worker["component"], str(worker["rank"]), str(worker["node"]))
        if record is None:
            found.append((*identity, "-", "(no heartbeat yet)", *["-"] * (len(COLUMNS) - 5)))
            continue
        phase = record.get("phase")
        age = record.get("phase_age_s")  # None: a record without the phase's elapsed time (an older writer's)
        in_phase = f"{age:.1f} s" if phase and age is not None else "-"
        deadline = f"{judge.deadline(record, phase):.0f} s" if phase else "-"
        cpu, rss = sampler.sample(record)
        beat_age = f"{record['heartbeat_age_s']:.1f} s"
        state = str(record.get("state") or "-")
        found.append(
            (
                *identity,
                str(record["pid"]),
                phase or "idle",
                in_phase,
                deadline,
                collective(record),
                beat_age,
                cpu,
                rss,
                gpu(record),
                state,
            )
        )
    return found


def table(run: LiveRun, sampler: Sampler, judge: Checks) -> Table:
    view = Table(title=f"fleetrl top — {run.run_dir}", box=box.SIMPLE_HEAD, title_justify="left")
    for column in COLUMNS:
        view.add_column(column, no_wrap=True)
    for row in rows(run, sampler, judge):
        view.add_row(*row)
    return view


def top(run_dir: str | None, once: bool) -> int:
    run = attach(run_dir)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # plain text, one row a worker however wide
    sampler, judge = Sampler(), Checks(run.watchdog, [])
    if once or not console.is_terminal:
        rows(run, sampler, judge)  # a first sample, so that CPU % covers an interval
        time.sleep(REFRESH_S / 2)
        console.print(table(run, sampler, judge))
        return exit_codes.OK
    try:
        with Live(table(run, sampler, judge), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(REFRESH_S)
                live.update(table(run, sampler, judge), refresh=True)
    except KeyboardInterrupt:
        return exit_codes.OK
    except RuntimeError:  # the store went away with the run
        console.print(f"{run.run_dir}: the run has ended")
        return exit_codes.OK
